"""Leader election on a ``coordination.k8s.io`` Lease, with the semantics of client-go's
``leaderelection``, so that of several replicas exactly one does the work that must be done once.

Why these rules: a replica must never trust another machine's clock, so a lease is judged expired
from this process's own monotonic clock, ``lease_duration`` after the moment it last *observed* the
lease record change; a holder that is alive changes the record (its renewTime) every
``retry_period``. Writes carry the resourceVersion last read, so of two replicas racing for an
expired lease the API server lets one win (the other gets 409 Conflict and reads again). A leader
that cannot renew within ``renew_deadline`` (shorter than ``lease_duration``, so it stops before any
standby may take over) stops leading and says why; a leader asked to stop releases the lease
(holderIdentity cleared, as client-go's ReleaseOnCancel) so a standby takes over at once rather
than after the lease runs out.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import CONNECT_TIMEOUT, raw_json

log = logging.getLogger(__name__)

LEASE_DURATION = 15.0
"""Seconds a standby waits, after it last saw the lease record change, before taking it over."""

RENEW_DEADLINE = 10.0
"""Seconds a leader may go without renewing before it stops leading."""

RETRY_PERIOD = 2.0
"""Seconds between attempts to acquire, and between renewals."""


def identity() -> str:
    """This replica's name on the lease: the pod's name (HOSTNAME) and a random suffix, so a pod
    restarted under the same name is not taken for its own predecessor."""
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _micro_time() -> str:
    """Now as a Kubernetes MicroTime (informational only: no replica reads another's clock)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for the Lease ``namespace/name`` in a thread of its own until stopped.

    ``on_started`` runs (in the elector's thread) once this replica holds the lease, before
    :attr:`leading` turns true; ``on_lost`` runs with a sentence when a leader could not keep it.
    Neither runs when :meth:`stop` ends the campaign."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        holder: str,
        on_started: Callable[[], None],
        on_lost: Callable[[str], None],
        *,
        lease_duration: float = LEASE_DURATION,
        renew_deadline: float = RENEW_DEADLINE,
        retry_period: float = RETRY_PERIOD,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs retry period < renew deadline < lease duration")
        self._leases = client.CoordinationV1Api(api)
        self.namespace, self.name, self.holder = namespace, name, holder
        self._on_started, self._on_lost = on_started, on_lost
        self.lease_duration, self.renew_deadline, self.retry_period = (
            lease_duration,
            renew_deadline,
            retry_period,
        )
        self._stop = threading.Event()
        self._leading = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        # The lease as last read or written: its spec, resourceVersion, and when (monotonic) the
        # spec was last seen to change.
        self._observed: dict[str, Any] | None = None
        self._version = ""
        self._observed_at = 0.0

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """End the campaign; a leader releases the lease when ``release`` (pass False while work
        done as leader may still be in flight: a standby must not start beside it)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=self.renew_deadline + CONNECT_TIMEOUT)
        if self._leading.is_set() and release:
            self._release()
        self._leading.clear()

    # -- the campaign ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._try_acquire_or_renew(self._call_timeout(self.renew_deadline)):
                break
            self._stop.wait(self.retry_period * (1 + 0.2 * random.random()))
        else:
            return
        log.info(
            "became the leader of lease %s/%s as %s (transitions: %s)",
            self.namespace,
            self.name,
            self.holder,
            (self._observed or {}).get("leaseTransitions", 0),
        )
        self._on_started()
        self._leading.set()
        renewed = time.monotonic()
        while not self._stop.wait(self.retry_period):
            while not self._stop.is_set():
                left = renewed + self.renew_deadline - time.monotonic()
                if left <= 0:
                    self._lose(f"it could not renew the lease within {self.renew_deadline:g} s")
                    return
                sent = time.monotonic()
                if self._try_acquire_or_renew(self._call_timeout(left)):
                    renewed = sent  # the standbys saw the change after we sent it
                    break
                holder = (self._observed or {}).get("holderIdentity")
                if holder and holder != self.holder:
                    self._lose(f"{holder} holds the lease now")
                    return
                self._stop.wait(min(self.retry_period, max(0.0, left - (time.monotonic() - sent))))

    def _lose(self, why: str) -> None:
        self._leading.clear()
        log.error("lost the leadership of lease %s/%s: %s", self.namespace, self.name, why)
        self._on_lost(why)

    def _call_timeout(self, left: float) -> tuple[float, float]:
        """(connect, read) seconds for one call: never past what is left of the renew deadline, and
        at most half of the deadline, so one hung call leaves time for another try."""
        bound = max(0.1, min(left, self.renew_deadline / 2))
        return (min(CONNECT_TIMEOUT, bound), bound)

    def _observe(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        if spec != self._observed:
            self._observed, self._observed_at = spec, time.monotonic()
        self._version = lease["metadata"]["resourceVersion"]

    def _try_acquire_or_renew(self, timeout: tuple[float, float]) -> bool:
        """One attempt: create the lease if absent, else take or renew it if it is ours, free, or
        expired by our clock. False when another holds it or the attempt failed."""
        now = time.monotonic()
        try:
            lease = raw_json(
                self._leases.read_namespaced_lease(
                    self.name, self.namespace, _preload_content=False, _request_timeout=timeout
                )
            )
        except ApiException as error:
            if error.status != 404:
                log.warning(
                    "reading lease %s/%s failed: %s %s", self.namespace, self.name, error.status, error.reason
                )
                return False
            self._version = ""
            return self._write(self._record({}, created=True), timeout)
        except Exception as error:  # the API server unreachable or too slow: try again
            log.warning("reading lease %s/%s failed: %s", self.namespace, self.name, error)
            return False
        self._observe(lease)
        current = self._observed or {}
        holder = current.get("holderIdentity")
        if holder and holder != self.holder and now < self._observed_at + self.lease_duration:
            return False
        return self._write(self._record(current), timeout)

    def _record(self, current: dict[str, Any], created: bool = False) -> dict[str, Any]:
        """The lease spec that names this replica: the acquire time and the transition count are kept
        while it stays the holder; every change of holder (a released lease included) counts one."""
        now = _micro_time()
        ours = current.get("holderIdentity") == self.holder
        transitions = int(current.get("leaseTransitions") or 0)
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": current.get("acquireTime") if ours else now,
            "renewTime": now,
            "leaseTransitions": transitions if ours or created else transitions + 1,
        }

    def _write(self, spec: dict[str, Any], timeout: tuple[float, float]) -> bool:
        """Create the lease (none read yet) or update it at the resourceVersion we read: a 409 means
        another replica wrote first, and we read again on the next attempt."""
        metadata = {"name": self.name, "namespace": self.namespace}
        try:
            if not self._version:
                body = client.V1Lease.model_validate({"metadata": metadata, "spec": spec})
                response = self._leases.create_namespaced_lease(
                    self.namespace, body, _preload_content=False, _request_timeout=timeout
                )
            else:
                metadata["resourceVersion"] = self._version
                body = client.V1Lease.model_validate({"metadata": metadata, "spec": spec})
                response = self._leases.replace_namespaced_lease(
                    self.name, self.namespace, body, _preload_content=False, _request_timeout=timeout
                )
        except ApiException as error:
            if error.status != 409:
                log.warning(
                    "writing lease %s/%s failed: %s %s", self.namespace, self.name, error.status, error.reason
                )
            return False
        except Exception as error:  # the API server unreachable or too slow
            log.warning("writing lease %s/%s failed: %s", self.namespace, self.name, error)
            return False
        self._observe(raw_json(response))
        return True

    def _release(self) -> None:
        """Clear holderIdentity, so a standby need not wait for the lease to run out (if this fails,
        it runs out instead)."""
        spec = dict(self._observed or {})
        if spec.get("holderIdentity") != self.holder:
            return
        now = _micro_time()
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=now, acquireTime=now)
        if self._write(spec, self._call_timeout(self.renew_deadline)):
            log.info("released lease %s/%s", self.namespace, self.name)
