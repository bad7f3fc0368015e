"""The Lease elector against the real API server: of two electors on one Lease exactly one leads; a
leader cut off from the server (a black hole) stops leading and says it could not renew, before the
standby takes over, and the standby takes over only once the lease has run out after the last
renewal the server holds; a leader that stops releases the lease, and the standby takes over at once.

Durations are shrunk (lease 4 s, renew deadline 2.5 s, retry 0.5 s) to keep the tests short; the
elector's rules do not depend on the values. The tests assert the order of events and lower bounds
that follow from the rules (no standby before the lease has run out), never an upper bound on how
soon something happened: on a loaded machine a thread wakes late, and that is not a fault.
"""

from __future__ import annotations

import datetime
import threading
import time
from dataclasses import dataclass

import pytest
from kubernetes import client

from tessera.kube import api_client, raw_json
from tessera.leader_election import LeaderElector
from testbed.cluster import LocalCluster
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.tcp_relay import TcpRelay

pytestmark = pytest.mark.integration

NAMESPACE = "default"
LEASE, RENEW, RETRY = 4.0, 2.5, 0.5


@dataclass
class Candidate:
    """An elector and what it was told, with the times it happened (wall clock, comparable with the
    renewTime the electors write into the lease)."""

    elector: LeaderElector
    started: list[float]
    lost: list[tuple[float, str]]


def candidate(api: client.ApiClient, lease: str, holder: str, lease_duration: float = LEASE) -> Candidate:
    started: list[float] = []
    lost: list[tuple[float, str]] = []
    elector = LeaderElector(
        api,
        NAMESPACE,
        lease,
        holder,
        on_started=lambda: started.append(time.time()),
        on_lost=lambda why: lost.append((time.time(), why)),
        lease_duration=lease_duration,
        renew_deadline=RENEW,
        retry_period=RETRY,
    )
    return Candidate(elector, started, lost)


def lease_spec(api: client.ApiClient, name: str) -> dict[str, object]:
    lease = raw_json(
        client.CoordinationV1Api(api).read_namespaced_lease(name, NAMESPACE, _preload_content=False)
    )
    spec: dict[str, object] = lease["spec"]
    return spec


class Watcher:
    """Samples which candidates lead every 20 ms, to show that two never lead at once."""

    def __init__(self, *candidates: Candidate) -> None:
        self._candidates = candidates
        self._stop = threading.Event()
        self.both: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            if sum(c.elector.leading for c in self._candidates) > 1:
                self.both.append(time.time())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _wall_time(micro_time: str) -> float:
    """A lease's MicroTime (RFC 3339, microseconds, UTC) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(micro_time).timestamp()


def test_of_two_electors_exactly_one_leads(kube: client.ApiClient) -> None:
    lease = unique_name("lease")
    a, b = candidate(kube, lease, "a"), candidate(kube, lease, "b")
    watcher = Watcher(a, b)
    a.elector.start()
    b.elector.start()
    try:
        poll_until(lambda: a.elector.leading or b.elector.leading, 10, "a leader")
        time.sleep(LEASE * 1.5)  # well past a lease: the leader renews, the standby keeps waiting
        leader, standby = (a, b) if a.elector.leading else (b, a)
        assert leader.elector.leading and not standby.elector.leading
        assert len(leader.started) == 1 and not standby.started and not leader.lost
        spec = lease_spec(kube, lease)
        assert spec["holderIdentity"] == leader.elector.holder and spec["leaseTransitions"] == 0
    finally:
        watcher.stop()
        a.elector.stop()
        b.elector.stop()
    assert not watcher.both


def test_a_cut_off_leader_stops_and_the_standby_waits_for_the_lease_to_run_out(
    cluster: LocalCluster, kube: client.ApiClient
) -> None:
    lease = unique_name("lease")
    relay = TcpRelay(cluster.api_port)
    relayed = api_client(cluster.admin_kubeconfig)
    relayed.configuration.host = f"https://127.0.0.1:{relay.port}"  # same address: the certificate holds
    a, b = candidate(relayed, lease, "a"), candidate(kube, lease, "b")
    watcher = Watcher(a, b)
    try:
        a.elector.start()
        poll_until(lambda: a.elector.leading, 10, "a leading")
        b.elector.start()
        time.sleep(2 * RETRY)  # b has read the lease held by a
        relay.black_hole()
        # a's last renewal that reached the server: a writes no more, and b has not taken over yet.
        last_renewal = _wall_time(str(lease_spec(kube, lease)["renewTime"]))
        assert lease_spec(kube, lease)["holderIdentity"] == "a"
        poll_until(lambda: b.elector.leading, 4 * LEASE, "b leading")
        took_over = b.started[0]
        assert a.lost and not a.elector.leading, "the cut-off leader never said it stopped"
        lost_at, why = a.lost[0]
        assert f"could not renew the lease within {RENEW:g} s" in why
        assert lost_at < took_over, "the cut-off leader still led when the standby took over"
        # b saw that renewal after a wrote it, and waits a whole lease from when it saw it.
        assert took_over - last_renewal >= LEASE, "the standby took over before the lease ran out"
        spec = lease_spec(kube, lease)
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    finally:
        watcher.stop()
        b.elector.stop()
        relay.close()
        a.elector.stop()
        relayed.close()  # type: ignore[no-untyped-call]
    assert not watcher.both


def test_a_leader_that_stops_releases_the_lease_and_the_standby_takes_over_at_once(
    kube: client.ApiClient,
) -> None:
    lease = unique_name("lease")
    long = 30.0  # a standby waiting for this to run out would fail the poll below
    a, b = candidate(kube, lease, "a", long), candidate(kube, lease, "b", long)
    try:
        a.elector.start()
        poll_until(lambda: a.elector.leading, 10, "a leading")
        b.elector.start()
        time.sleep(2 * RETRY)
        a.elector.stop()
        released = time.time()
        assert not a.elector.leading and not a.lost  # stopping is not losing
        # Long before the lease could have run out: b saw it released, it did not wait it out.
        poll_until(lambda: b.elector.leading, long / 2, "b leading soon after the release")
        assert b.started[0] - released < long / 2
        spec = lease_spec(kube, lease)
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    finally:
        a.elector.stop()
        b.elector.stop()
