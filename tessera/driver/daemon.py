"""The node daemon's life: start every part in order, serve, and shut down in reverse.

Start: discover GPUs, decide how containers reach the driver, load (or rebuild) the prepared state
(a rebuild the API server cannot answer yet is retried in the background while the daemon serves),
serve the DRA socket, then register with the kubelet — so the kubelet never reaches a socket that
cannot answer — then publish the slice and watch GPU health and the Node's cordon annotation
(tessera/driver/cordon.py), both of which taint GPUs in the slice. The metrics exporter is not here: it
is its own process (``tessera-exporter``, tessera/exporter/cli.py) so that nothing a scrape meets
can stop a prepare, and this one reads no other process.
Stop (SIGTERM): deregister first (the registration socket goes, so the kubelet stops calling), let
calls in flight finish, remove the DRA socket, stop the background loops. A background loop that
dies unexpectedly stops the daemon, so it is restarted rather than left half-working.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from kubernetes import client

from tessera.command import Stoppable
from tessera.driver import cleanup, device_health, devices, health, plugin, registration
from tessera.driver.checkpoint import read_boot_id
from tessera.driver.claim_status import ClaimStatusWriter
from tessera.driver.claims import ClaimCache
from tessera.driver.config import DriverConfig
from tessera.driver.container_driver import resolve
from tessera.driver.cordon import NodeCordon
from tessera.driver.discovery import Nvml
from tessera.driver.health import dra_socket_answers
from tessera.driver.slices import SlicePublisher
from tessera.driver.state import DeviceState
from tessera.driver.state_lock import StateLock
from tessera.kube import BoundedApiClient, api_client
from tessera.serving import HttpServer
from tessera.watching import Reachability

log = logging.getLogger(__name__)

_STANDARD_CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))

_STOP_CHECK = 0.05
"""Seconds between looks at a stop request while start() waits for something else."""


class Daemon(Stoppable):
    def __init__(self, config: DriverConfig, kube: BoundedApiClient | None = None) -> None:
        config.validate()
        self.config = config
        self._kube = kube or api_client()
        super().__init__()
        self.fatal: str | None = None
        self._threads: list[threading.Thread] = []
        self._servers: list[tuple[grpc.Server, Path]] = []
        self._health_http: HttpServer | None = None
        self._nvml: Nvml | None = None
        self._service: plugin.DraService | None = None
        self._status_writer: ClaimStatusWriter | None = None
        self._state_lock = StateLock(config.state_dir)
        self.api = Reachability()
        """Whether the daemon's watches reach the API server: readiness says so while they cannot."""
        self._rebuilt = threading.Event()
        """Set once the prepared state is known good: loaded, or rebuilt from the API and the host."""
        self._phase = "standby"
        """"standby" while another daemon holds the state directory, "starting" once this one does,
        "serving" once every socket and loop is up."""

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        config = self.config
        if config.health_port:  # first, so a daemon waiting for the state directory answers probes
            self._health_http = HttpServer(
                "health",
                config.health_address,
                config.health_port,
                health.endpoints(self.alive, self.not_ready),
            )
            self._health_http.start()
        # Before the checkpoint is read: one daemon per node. Stopped meanwhile (a standby replaced
        # before its turn, or a stop during the probes' start): nothing else is started.
        if not self._state_lock.acquire(self._stop) or self._stop.is_set():
            return
        self._phase = "starting"
        self._nvml = Nvml()
        gpus = self._nvml.gpus()
        shared = [f"{g.index}:{g.uuid}" for g in gpus if not g.mig_enabled]
        mig = [f"{g.index}:{g.uuid} ({len(g.mig_devices)} instances)" for g in gpus if g.mig_enabled]
        log.info(
            "found %d GPUs to share (%s) and %d in MIG mode (%s)",
            len(shared),
            ", ".join(shared) or "none",
            len(mig),
            ", ".join(mig) or "none",
        )
        container_driver = resolve(config.source, [config.cdi_dir, *_STANDARD_CDI_DIRS])
        self.state = DeviceState(config, gpus, container_driver, read_boot_id(config.boot_id_file))
        resource = client.ResourceV1Api(self._kube)
        self.claims = ClaimCache(resource, config.driver_name, config.pool_name, self.api)
        if self.state.rebuild_reason:
            log.warning("rebuilding prepared claims from the API and the host: %s", self.state.rebuild_reason)
            if not self._rebuild_once():  # the API server is away (a whole cluster restarting, say)
                self._background("rebuild", self._rebuild_until_done)
        else:
            self._rebuilt.set()
        if config.watch_claims:
            self._background("claim-watch", self.claims.run, self._stop)

        self._status_writer = ClaimStatusWriter(resource, config.driver_name, config.node_name)
        self._service = plugin.DraService(self.state, self.claims, self._status_writer)
        self.tracker = device_health.HealthTracker(
            gpus, config.pool_name, check_timeout=max(30.0, 5 * config.health_interval)
        )
        dra = self._serve(config.dra_socket)
        plugin.add_to_server(dra, self._service)
        device_health.add_to_server(dra, self.tracker, self._stop)
        dra.start()

        self.registration = registration.RegistrationService(
            config.driver_name,
            config.dra_socket,
            [*plugin.SUPPORTED_VERSIONS, *device_health.SUPPORTED_VERSIONS],
        )
        reg = self._serve(config.registration_socket)
        registration.add_to_server(reg, self.registration)
        reg.start()
        log.info("serving %s; registration socket %s", config.dra_socket, config.registration_socket)

        self.publisher = SlicePublisher(
            resource, client.CoreV1Api(self._kube), config.node_name, config.driver_name, self.api
        )

        self.cordon = NodeCordon(
            client.CoreV1Api(self._kube), config.node_name, lambda: [g.uuid for g in self.tracker.gpus()]
        )
        publishing = threading.Lock()

        def publish() -> None:
            # Health, MIG-layout and cordon changes arrive on two threads: one at a time, so the
            # last slice written is built from the latest of all. Prepare learns of new MIG
            # instances before the scheduler can allocate them.
            with publishing:
                now = self.tracker.gpus()
                self.state.set_gpus(now)
                taints = {uuid: list(found) for uuid, found in self.tracker.taints().items()}
                for uuid, cordon_taints in self.cordon.taints().items():
                    taints.setdefault(uuid, []).extend(cordon_taints)
                self.publisher.set_devices(devices.node_devices(now, taints))

        self.tracker.on_change = publish
        self.cordon.on_change = publish
        self._background(
            "gpu-health",
            device_health.poll_forever,
            self.tracker,
            self._nvml.problem,
            config.health_interval,
            config.nvml_timeout,
            self._stop,
            self._nvml.mig_layout,
        )
        self._background("node-cordon", self.cordon.run, self._stop)
        # The first slice says what the first poll found (a lost GPU is never published untainted),
        # or, if NVML did not answer, that no GPU's health is known; and the cordon the Node's
        # annotation asks for, if the Node can be read within one API call's bound. A stop asked
        # for meanwhile (a rollout replacing a daemon still starting) ends the wait: the poll may
        # never run then.
        if not _first_of(self.tracker.assessed, self._stop, config.nvml_timeout + 1.0):
            return
        if not _first_of(self.cordon.synced, self._stop, sum(self._kube.timeout)):
            return
        publish()
        self._background("slice-publisher", self.publisher.run, self._stop, config.resync_interval)
        self._background(
            "cleanup",
            cleanup.sweep_forever,
            config,
            self.state,
            self.claims,
            config.cleanup_interval,
            self._stop,
        )
        self._phase = "serving"

    def _rebuild_once(self) -> bool:
        """One attempt to rebuild the prepared state (every claim folder and CDI spec checked against
        the API, claims still allocated here prepared again); False when the API could not answer."""
        try:
            cleanup.sweep(self.config, self.state, self.claims, reprepare=True)
        except Exception as error:
            log.warning("cannot rebuild the prepared claims yet (%s); serving meanwhile, retrying", error)
            return False
        self.state.save()
        self._rebuilt.set()
        log.info("rebuilt the prepared claims")
        return True

    def _rebuild_until_done(self) -> None:
        """Retry the rebuild with back-off until it succeeds. Meanwhile the daemon serves: a claim the
        kubelet asks for is prepared as soon as it can be read, and readiness says what is missing."""
        backoff = 1.0
        while not self._stop.wait(backoff):
            if self._rebuild_once():
                return
            backoff = min(backoff * 2, 30.0)

    def _serve(self, socket: Path) -> grpc.Server:
        socket.parent.mkdir(parents=True, exist_ok=True)
        if socket.exists() or socket.is_symlink():
            log.info("removing stale socket %s", socket)
            socket.unlink()
        server = grpc.server(ThreadPoolExecutor(max_workers=32, thread_name_prefix=socket.name))
        server.add_insecure_port(f"unix://{socket}")
        self._servers.append((server, socket))
        return server

    def _background(self, name: str, target: Callable[..., None], *args: object) -> None:
        def guarded() -> None:
            try:
                target(*args)
            except Exception as error:
                log.exception("background loop %s failed; stopping the daemon", name)
                self.fatal = f"{name}: {error}"
                self._stop.set()

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # ------------------------------------------------------------------ probes

    def alive(self) -> bool:
        if self._phase != "serving":
            return self.fatal is None
        return self.fatal is None and dra_socket_answers(self.config.dra_socket)

    def not_ready(self) -> str | None:
        """Every reason the daemon is not ready, most fundamental first, or None when it is.

        A standby (another daemon holds the state directory) is ready: it is the new pod of a
        surge rollout, which removes the old pod only once the new one is ready; the old one's
        exit then hands it the directory. Not counting it ready would stall that rollout for good."""
        if self._phase == "standby":
            return None
        if self._phase == "starting":
            return "starting"
        reasons = []
        if (unmonitored := self.tracker.unmonitored()) is not None:
            reasons.append(unmonitored)
        if (unreachable := self.api.problem()) is not None:
            reasons.append(unreachable)
        if not self._rebuilt.is_set():
            reasons.append("rebuilding the prepared claims from the API and the host")
        if not self.registration.registered.is_set():
            reasons.append(
                "not registered with the kubelet yet"
                + (f" ({self.registration.last_error})" if self.registration.last_error else "")
            )
        if not self.publisher.published.is_set():
            reasons.append("ResourceSlice not published yet")
        return "; ".join(reasons) or None

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Deregister, drain, remove our sockets, stop the loops. Safe to call twice."""
        self._stop.set()
        for server, socket in reversed(self._servers):  # registration first
            socket.unlink(missing_ok=True)
            server.stop(grace=5).wait()
        self._servers.clear()
        if self._health_http is not None:
            self._health_http.stop()
            self._health_http = None
        # Loops see the stop at once, except a watch blocked on the server (at most its timeout):
        # daemon threads, which end with the process, so shutdown does not wait for them.
        deadline = time.monotonic() + 2.0
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads.clear()
        if self._service is not None:
            self._service.close()
            self._service = None
        if self._status_writer is not None:
            self._status_writer.close()
            self._status_writer = None
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
        self._state_lock.release()
        log.info("stopped")


def _first_of(awaited: threading.Event, stop: threading.Event, timeout: float) -> bool:
    """Wait until ``awaited`` is set (True), ``stop`` is (False), or ``timeout`` passes (True: go on
    without it)."""
    deadline = time.monotonic() + timeout
    while not awaited.wait(min(_STOP_CHECK, max(0.0, deadline - time.monotonic()))):
        if stop.is_set():
            return False
        if time.monotonic() >= deadline:
            break
    return True
