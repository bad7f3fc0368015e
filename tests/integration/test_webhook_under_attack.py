"""Issue 37's bar, from where an attacker stands: two ``tessera-webhook`` replicas behind a balancer,
called by the real API server, while a tenant (testbed/connection_hog.py, a process of its own,
connecting from loopback addresses of its own as pods would from theirs) holds 2 000 TLS connections
without a certificate to the admission ports and 200 slow-header connections to the plain ports,
and the API server creates GPU pods about 50 a second: no pod is refused, both replicas stay Ready,
and every probe is answered, on the probe ports and on the metrics ports alike.

File descriptors: the attacker raises its own soft limit to the hard one (2 000 connections pass
the usual 1 024); the replicas hold at most 1 024 unverified connections each, plus their own.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from testbed.cluster import LocalCluster
from testbed.dra_objects import shareable_gpu_slice
from testbed.names import unique_name
from testbed.pod_stream import PodStream
from testbed.polling import poll_until
from tests.integration.test_webhook_replicas import Replicas

# Measured under load or in shares of time: no other test may share the CPUs (tests/conftest.py).
pytestmark = [pytest.mark.integration, pytest.mark.alone]

ATTACK_SECONDS = 60.0
STREAM_SECONDS = 30.0
STREAMS = 13
"""Pod streams at once, each creating a dry-run GPU pod every ``STREAM_EVERY`` seconds (paced by due
times, so an answer slower than that delays only its own stream's next create): 54 creates a second
offered together, so that the bar's 50 are made although some answers take longer than 240 ms
(52.5/s measured on the 2-core machine, the test alone; the test prints the rate it got)."""
STREAM_EVERY = 0.24
PROBE_TIMEOUT = 1.0
"""The kubelet's default probe timeout."""


def probe(port: int, path: str) -> str | None:
    """None when ``path`` answers 200 within the probe timeout, else what happened."""
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
        connection.request("GET", path)
        status = connection.getresponse().status
        return None if status == 200 else f"{port}{path}: {status}"
    except OSError as error:
        return f"{port}{path}: {error!r}"


class Prober:
    """Probes every plain port's /healthz and /readyz every 0.2 s from a thread, keeping failures."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.failures: list[str] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for port in self.ports:
                for path in ("/healthz", "/readyz"):
                    failure = probe(port, path)
                    if failure is not None:
                        self.failures.append(failure)
            self.rounds += 1


@pytest.fixture
def replicas(cluster: LocalCluster, kube: client.ApiClient, tmp_path: Path) -> Iterator[Replicas]:
    name = unique_name("attack-gpu")
    resource = client.ResourceV1Api(kube)
    resource.create_resource_slice(shareable_gpu_slice(name, name))
    made = Replicas(cluster, kube, tmp_path, lifetime=86400.0)
    try:
        ports = made.probe_ports
        poll_until(lambda: all(probe(port, "/readyz") is None for port in ports), 60, "both replicas ready")
        yield made
    finally:
        made.stop()
        resource.delete_resource_slice(name)
    for log in made.logs:
        assert "Traceback" not in log.read_text(), log.read_text()


def attacker(replicas: Replicas) -> subprocess.Popen[str]:
    """2 000 TLS connections without a certificate (1 000 per replica, 250 from each of four
    addresses) and 200 slow-header connections (50 on each replica's metrics and probe port, 10
    from each of five addresses)."""
    jobs = []
    for index, port in enumerate(replicas.ports):
        jobs += [f"tls-idle:{port}:250:127.0.0.{10 + 4 * index + n}" for n in range(4)]
    for index, port in enumerate(replicas.metrics_ports + replicas.probe_ports):
        jobs += [f"slow-head:{port}:10:127.0.0.{30 + 5 * index + n}" for n in range(5)]
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.connection_hog", str(ATTACK_SECONDS), *jobs],
        stdout=subprocess.PIPE,
        text=True,
    )


def connections_accepted(replicas: Replicas) -> float:
    total = 0.0
    for port in replicas.metrics_ports:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/metrics")
        for line in connection.getresponse().read().decode().splitlines():
            if line.startswith("tessera_webhook_connections_total "):
                total += float(line.split()[1])
    return total


def test_idle_and_slow_connections_by_the_thousand_refuse_no_gpu_pod_and_fail_no_probe(
    replicas: Replicas, kube: client.ApiClient, namespace: str
) -> None:
    before = connections_accepted(replicas)
    hog = attacker(replicas)
    try:
        poll_until(
            lambda: connections_accepted(replicas) - before >= 2000, 60, "the attacker's connections accepted"
        )
        plain_ports = replicas.metrics_ports + replicas.probe_ports
        streams = [PodStream(kube, namespace, every=STREAM_EVERY, dry_run=True) for _ in range(STREAMS)]
        with Prober(plain_ports) as prober:
            started = time.monotonic()
            with contextlib.ExitStack() as running:
                for stream in streams:
                    running.enter_context(stream)
                time.sleep(STREAM_SECONDS)
            elapsed = time.monotonic() - started
        attacked = connections_accepted(replicas) - before
        assert hog.poll() is None, "the attacker ran until the pods were all created"
    finally:
        out, _ = hog.communicate(timeout=ATTACK_SECONDS + 60)
    summary = json.loads(out)
    calls = sum(stream.calls for stream in streams)
    print(f"{calls} GPU pods in {elapsed:.1f} s ({calls / elapsed:.1f}/s); {attacked:.0f} connections")
    print(f"{prober.rounds} probe rounds; attacker: {summary}")
    assert [refusal for stream in streams for refusal in stream.refused] == []
    assert [name for stream in streams for name in stream.unconverted] == []
    assert prober.failures == []
    assert prober.rounds > 0 and calls > 0
    assert attacked >= 2000  # the replicas' own count of the connections they accepted meanwhile
    assert all(process.poll() is None for process in replicas.processes)
