"""What the webhook benchmarks share: a ``tessera-webhook`` process started as in production (its
own process, a self-made CA written into a registered configuration, client-certificate auth
against the local control plane's API-server client CA) over a node daemon with simulated GPUs,
the reviews and pods they post, a kept-alive HTTPS sender, and the open-loop load whose latencies
run from each request's due time. One harness, so the admission and hostile-input figures measure
the same server started the same way.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tessera.kube import api_client, raw_json
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.fake_nodes import create_ready_node
from testbed.polling import poll_until
from testbed.process import free_port
from testbed.webhook_command import loopback_webhook_command

CONFIGURATION = Path(__file__).resolve().parents[2] / "charts/tessera/files/webhook-configuration.yaml"
NAMESPACE = "bench"
GPU_LIMITS = {"nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "30"}
THREADS_PER_PROCESS = 8


UNSCHEDULED = "tessera-bench-none"
"""The pods' scheduler, which does not exist: pods created for real stay Pending and untouched, so a
burst measures admission, not the scheduler."""


def pod(limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "bench-", "namespace": NAMESPACE},
        "spec": {
            "schedulerName": UNSCHEDULED,
            "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}],
        },
    }


GPU_POD = json.dumps(pod(GPU_LIMITS)).encode()
PLAIN_POD = json.dumps(pod({"cpu": "100m"})).encode()


def review_body(i: int, limits: dict[str, str] | None = None) -> bytes:
    """Review number ``i`` of a pod with ``limits`` (a GPU pod's by default), as the API server posts it."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"00000000-0000-0000-0000-{i:012d}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": NAMESPACE,
            "object": pod(GPU_LIMITS if limits is None else limits),
            "dryRun": False,
        },
    }
    return json.dumps(review).encode()


@dataclass(frozen=True)
class Target:
    """Where load goes, in plain values a worker process can rebuild a TLS client from."""

    host: str
    port: int
    path: str
    cadata: str = ""
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    expect_converted: bool = True

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.cadata or None, cafile=self.ca_file or None)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


class Sender:
    """One kept-alive HTTPS connection per thread, as the apiserver keeps its connections."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.context = target.context()
        self.local = threading.local()

    def __call__(self, body: bytes) -> None:
        connection = getattr(self.local, "connection", None)
        if connection is None:
            connection = http.client.HTTPSConnection(
                self.target.host, self.target.port, context=self.context, timeout=120
            )
            self.local.connection = connection
        connection.request("POST", self.target.path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        if response.status not in (200, 201):
            raise RuntimeError(f"{response.status}: {data[:300]!r}")
        (converted if self.target.expect_converted else untouched)(data)


def _open_loop_share(
    target: Target, body_kind: str, rate: float | None, count: int, start_at: float, share: int, shares: int
) -> tuple[list[float], list[str], float]:
    """One worker process's part of the open loop: requests share, share + shares, ... of the
    schedule start_at + i / rate (rate None: all due at once, each timed from when a thread sends
    it); returns latencies, errors and when its last answer arrived."""
    send = Sender(target)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    last_done = [start_at]

    def one(i: int, due: float | None) -> None:
        began = time.time() if due is None else due
        try:
            send(review_body(i) if body_kind == "review" else GPU_POD if body_kind == "gpu" else PLAIN_POD)
            done = time.time()
            with lock:
                latencies.append(done - began)
                last_done[0] = max(last_done[0], done)
        except Exception as error:
            with lock:
                errors.append(str(error))

    body = {"review": review_body(0), "gpu": GPU_POD, "plain": PLAIN_POD}[body_kind]
    ready = threading.Barrier(THREADS_PER_PROCESS)

    def warm() -> None:  # every pool thread up, with its connection open, before the clock starts
        send(body)
        ready.wait()

    with ThreadPoolExecutor(THREADS_PER_PROCESS) as pool:
        for warming in [pool.submit(warm) for _ in range(THREADS_PER_PROCESS)]:
            warming.result()
        delay = start_at - time.time()
        if delay > 0:
            time.sleep(delay)
        for i in range(share, count, shares):
            due = None if rate is None else start_at + i / rate
            if due is not None and (delay := due - time.time()) > 0:
                time.sleep(delay)
            pool.submit(one, i, due)
    return latencies, errors, last_done[0]


def open_loop(
    target: Target,
    body_kind: str,
    rate: float | None,
    seconds: float,
    processes: int,
    count: int | None = None,
    keep_latencies: bool = False,
) -> dict[str, Any]:
    """Send at ``rate`` per second for ``seconds`` (or ``count`` requests) from ``processes`` client
    processes (one Python process cannot keep a schedule of hundreds of TLS requests a second);
    latencies from each request's due time. Rate None is a burst: ``count`` requests as fast as
    the ``processes`` x THREADS_PER_PROCESS senders go, each timed from its sending. The achieved
    rate is answers over the time from the start to the last answer. keep_latencies: every latency
    (seconds) under "latencies", for pooling rounds."""
    total = count if count is not None else int((rate or 0) * seconds)
    start_at = time.time() + 3.0  # after every worker has its threads and connections up
    with ProcessPoolExecutor(processes) as pool:
        parts = [
            pool.submit(_open_loop_share, target, body_kind, rate, total, start_at, k, processes)
            for k in range(processes)
        ]
        results = [part.result() for part in parts]
    latencies = [x for part in results for x in part[0]]
    errors = [x for part in results for x in part[1]]
    answering = max(part[2] for part in results) - start_at
    figures = summary(latencies, errors, len(latencies) / answering if answering > 0 else 0.0)
    if keep_latencies:
        figures["latencies"] = latencies
    return figures


def summary(latencies: list[float], errors: list[str], rate: float) -> dict[str, Any]:
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return (
            round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)
            if ordered
            else float("nan")
        )

    return {
        "requests": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "rate_per_s": round(rate, 1),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(ordered[-1] * 1000, 2) if ordered else float("nan"),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2) if ordered else float("nan"),
    }


def converted(data: bytes) -> None:
    answer = json.loads(data)
    answer = answer.get("response", answer)
    if "patch" in answer:  # a review answer
        return
    if answer.get("spec", {}).get("resourceClaims"):  # a dry-run pod, converted by the apiserver's call
        return
    raise RuntimeError(f"not converted: {data[:300]!r}")


def untouched(data: bytes) -> None:
    if json.loads(data)["spec"].get("resourceClaims"):
        raise RuntimeError("a pod without GPUs was converted")


def healthy(port: int, path: str) -> bool:
    """Whether the webhook's plain-HTTP ``path`` (/healthz, /readyz) answers 200 within 2 s."""
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except OSError:
        return False


@dataclass
class RunningWebhook:
    """A started webhook: where to post reviews as the API server does, and what else it runs on."""

    cluster: LocalCluster
    port: int
    metrics_port: int
    ca: str
    """The webhook's CA bundle (PEM), read back from the configuration it wrote it into."""
    direct: Target
    """``/mutate`` with the API server's webhook client certificate."""
    pid: int
    """The webhook process's, for its CPU time."""
    exit_code: int | None = None
    """The process's exit status on SIGTERM, set when the context ends."""


@dataclass
class WebhookProcess:
    """``tessera-webhook`` started as in production against one cluster."""

    process: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    ca: str
    """The webhook's CA bundle (PEM), read back from the configuration it wrote it into."""


@contextmanager
def webhook_process(cluster: LocalCluster, configuration: str) -> Iterator[WebhookProcess]:
    """The chart's webhook configuration registered under ``configuration`` with a loopback URL, and
    ``tessera-webhook`` as its own process serving it, ready and with its CA in that configuration;
    stopped with SIGTERM at the end (its exit status is then ``process.returncode``)."""
    assert cluster.webhook_client_ca is not None
    kube = api_client(cluster.admin_kubeconfig)
    port, metrics_port = free_port(), free_port()
    body = yaml.safe_load(CONFIGURATION.read_text())
    body["metadata"]["name"] = configuration
    for webhook in body["webhooks"]:
        webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
    registration = client.AdmissionregistrationV1Api(kube)
    registration.create_mutating_webhook_configuration(
        client.V1MutatingWebhookConfiguration.model_validate(body)
    )
    process = subprocess.Popen(
        loopback_webhook_command(
            cluster.admin_kubeconfig,
            port,
            metrics_port,
            configuration,
            cluster.webhook_client_ca.pair.cert,
            "--log-level=warning",
        ),
        stdout=subprocess.DEVNULL,
        stderr=sys.stderr,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        poll_until(lambda: healthy(metrics_port, "/readyz"), 60, "webhook ready")

        def bundle() -> str | None:
            read = raw_json(
                registration.read_mutating_webhook_configuration(configuration, _preload_content=False)
            )
            value: str | None = read["webhooks"][0]["clientConfig"].get("caBundle")
            return value

        ca = base64.b64decode(poll_until(bundle, 60, "caBundle set by the webhook")).decode()
        yield WebhookProcess(process, port, metrics_port, ca)
    finally:
        process.terminate()
        process.wait(30)


@contextmanager
def running_webhook(configuration: str = "tessera-webhook-bench") -> Iterator[RunningWebhook]:
    """A local control plane, a kubelet-less Node with the node daemon over 4 simulated 80 GiB GPUs
    (so the slice cache holds real slices), and ``tessera-webhook`` as :func:`webhook_process` starts it."""
    with LocalCluster() as cluster:
        assert cluster.webhook_client is not None
        kube = api_client(cluster.admin_kubeconfig)
        ensure_device_class(kube)
        create_ready_node(kube, "bench-node", None)
        driver = DriverNode(cluster, "bench-node", gpus=4)
        driver.start()
        driver.wait_published()
        core = client.CoreV1Api(kube)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        poll_until(
            lambda: core.read_namespaced_service_account("default", NAMESPACE), 30, "default ServiceAccount"
        )
        running: RunningWebhook | None = None
        try:
            with webhook_process(cluster, configuration) as webhook:
                # Posting as the API server does: with its webhook client certificate.
                direct = Target(
                    "127.0.0.1",
                    webhook.port,
                    "/mutate",
                    cadata=webhook.ca,
                    cert_file=str(cluster.webhook_client.cert),
                    key_file=str(cluster.webhook_client.key),
                )
                running = RunningWebhook(
                    cluster, webhook.port, webhook.metrics_port, webhook.ca, direct, webhook.process.pid
                )
                yield running
        finally:
            if running is not None:
                running.exit_code = webhook.process.returncode
            driver.cleanup()
