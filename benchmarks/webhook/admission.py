"""How fast the webhook answers: admission latency p50/p99 at a fixed rate, posted to the webhook
directly and through the apiserver (pods created with dryRun=All, so the apiserver calls the webhook
exactly as for a real pod and stores nothing), and the most reviews per second one webhook process
answers. Writes admission.{md,json} into benchmarks/webhook/results/ (or --out DIR).

    .venv/bin/python benchmarks/webhook/admission.py [--rate 200] [--seconds 60] [--out DIR]

It starts a local control plane, a kubelet-less Node with the node daemon over 4 simulated 80 GiB
GPUs (so the webhook's slice cache holds real slices), registers the chart's webhook configuration
with a URL, and runs ``tessera-webhook`` as its own process with a self-made CA, as in production.
Latency is measured open-loop: each request has a due time (start + i / rate) and its latency runs
from that due time to its answer, so a stalled server is charged for the queue it causes. The load
generator runs on the same machine and its own cost is in the figures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import base64

import yaml
from kubernetes import client

from benchmarks.run_info import RunInfo
from tessera.kube import api_client, raw_json
from tessera.testbed.cluster import LocalCluster
from tessera.testbed.driver_node import DriverNode, ensure_device_class
from tessera.testbed.fake_nodes import create_ready_node
from tessera.testbed.polling import poll_until

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGURATION = Path(__file__).resolve().parents[2] / "charts/tessera/files/webhook-configuration.yaml"
NAMESPACE = "bench"
GPU_LIMITS = {"nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "30"}
THREADS_PER_PROCESS = 8


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pod(limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "bench-", "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
    }


GPU_POD = json.dumps(pod(GPU_LIMITS)).encode()
PLAIN_POD = json.dumps(pod({"cpu": "100m"})).encode()


def review_body(i: int) -> bytes:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"00000000-0000-0000-0000-{i:012d}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": NAMESPACE,
            "object": pod(GPU_LIMITS),
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
    target: Target, body_kind: str, rate: float, seconds: float, start_at: float, share: int, shares: int
) -> tuple[list[float], list[str], float]:
    """One worker process's part of the open loop: requests share, share + shares, ... of the
    schedule start_at + i / rate; returns latencies, errors and when its last request was sent."""
    send = Sender(target)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one(i: int, due: float) -> None:
        try:
            send(review_body(i) if body_kind == "review" else GPU_POD if body_kind == "gpu" else PLAIN_POD)
            elapsed = time.time() - due
            with lock:
                latencies.append(elapsed)
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
        for i in range(share, int(rate * seconds), shares):
            due = start_at + i / rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, i, due)
        last_sent = time.time()
    return latencies, errors, last_sent


def open_loop(target: Target, body_kind: str, rate: float, seconds: float, processes: int) -> dict[str, Any]:
    """Send at ``rate`` per second for ``seconds`` from ``processes`` client processes (one Python
    process cannot keep a schedule of hundreds of TLS requests a second); latencies from each
    request's due time."""
    start_at = time.time() + 3.0  # after every worker has its threads and connections up
    with ProcessPoolExecutor(processes) as pool:
        parts = [
            pool.submit(_open_loop_share, target, body_kind, rate, seconds, start_at, k, processes)
            for k in range(processes)
        ]
        results = [part.result() for part in parts]
    latencies = [x for part in results for x in part[0]]
    errors = [x for part in results for x in part[1]]
    sending = max(part[2] for part in results) - start_at
    return summary(latencies, errors, len(latencies) / sending if sending > 0 else 0.0)


def _closed_share(target: Target, threads: int, seconds: float) -> tuple[list[float], list[str]]:
    send = Sender(target)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def worker(k: int) -> None:
        i = (os.getpid() * 100 + k) * 1_000_000
        while time.perf_counter() < stop:
            began = time.perf_counter()
            try:
                send(review_body(i))
                with lock:
                    latencies.append(time.perf_counter() - began)
            except Exception as error:
                with lock:
                    errors.append(str(error))
            i += 1

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return latencies, errors


def closed_loop(target: Target, connections: int, seconds: float, processes: int) -> dict[str, Any]:
    """``connections`` senders (over ``processes`` client processes) back to back for ``seconds``:
    the most reviews per second the one webhook process answers."""
    per_process = max(1, connections // processes)
    with ProcessPoolExecutor(processes) as pool:
        parts = [pool.submit(_closed_share, target, per_process, seconds) for _ in range(processes)]
        results = [part.result() for part in parts]
    latencies = [x for part in results for x in part[0]]
    errors = [x for part in results for x in part[1]]
    return summary(latencies, errors, len(latencies) / seconds)


_BUCKET = re.compile(
    r"^apiserver_admission_webhook_admission_duration_seconds_bucket"
    r"\{(?P<labels>[^}]*)\} (?P<count>[0-9.e+]+)$"
)


def webhook_histogram(metrics: str) -> dict[float, float]:
    """The apiserver's histogram of its calls to our webhook: upper bound -> cumulative count."""
    buckets: dict[float, float] = {}
    for line in metrics.splitlines():
        match = _BUCKET.match(line)
        if not match or 'name="pods.gpu.tessera.dev"' not in match["labels"]:
            continue
        bound = re.search(r'le="([^"]+)"', match["labels"])
        if bound:
            key = float("inf") if bound[1] == "+Inf" else float(bound[1])
            buckets[key] = buckets.get(key, 0.0) + float(match["count"])
    return buckets


def histogram_quantiles(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """p50/p99 of the calls between two readings, as the bucket bound they fall under (coarse: the
    apiserver's buckets are 5, 25, 100, 500 ms...)."""
    delta = {bound: after.get(bound, 0.0) - before.get(bound, 0.0) for bound in sorted(after)}
    total = delta.get(float("inf"), 0.0)

    def under(q: float) -> str:
        for bound, count in delta.items():
            if total and count >= q * total:
                return f"<= {bound * 1000:g} ms"
        return "n/a"

    return {
        "calls": total,
        "buckets_ms": {f"{b * 1000:g}": c for b, c in delta.items()},
        "p50": under(0.5),
        "p99": under(0.99),
    }


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--max-seconds", type=float, default=15)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--processes", type=int, default=4, help="client processes generating load")
    parser.add_argument(
        "--sustainable-rate",
        type=float,
        default=25,
        help="a second, lower rate through the apiserver, which a small machine's apiserver keeps up with",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = RunInfo.start(["webhook", "tessera/names.py", "tessera/watching.py", "charts/tessera/files"])
    figures: dict[str, Any] = {"rate": args.rate, "seconds": args.seconds}
    with LocalCluster() as cluster:
        assert cluster.webhook_client_ca is not None and cluster.webhook_client is not None
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
        port, metrics_port = free_port(), free_port()
        body = yaml.safe_load(CONFIGURATION.read_text())
        body["metadata"]["name"] = "tessera-webhook-bench"
        for webhook in body["webhooks"]:
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
        registration = client.AdmissionregistrationV1Api(kube)
        registration.create_mutating_webhook_configuration(
            client.V1MutatingWebhookConfiguration.model_validate(body)
        )
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "tessera-webhook"),
                f"--kubeconfig={cluster.admin_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--port={port}",
                f"--metrics-port={metrics_port}",
                "--ip-addresses=127.0.0.1",
                "--webhook-configuration=tessera-webhook-bench",
                f"--client-ca-file={cluster.webhook_client_ca.pair.cert}",
                "--log-level=warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=sys.stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:

            def ready() -> bool:
                try:
                    connection = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=2)
                    connection.request("GET", "/readyz")
                    return connection.getresponse().status == 200
                except OSError:
                    return False

            poll_until(ready, 60, "webhook ready")

            def bundle() -> str | None:
                read = raw_json(
                    registration.read_mutating_webhook_configuration(
                        "tessera-webhook-bench", _preload_content=False
                    )
                )
                value: str | None = read["webhooks"][0]["clientConfig"].get("caBundle")
                return value

            ca = base64.b64decode(poll_until(bundle, 60, "caBundle set by the webhook")).decode()
            # Posting as the API server does: with its webhook client certificate.
            direct = Target(
                "127.0.0.1",
                port,
                "/mutate",
                cadata=ca,
                cert_file=str(cluster.webhook_client.cert),
                key_file=str(cluster.webhook_client.key),
            )
            warm = Sender(direct)
            for i in range(200):  # warm: the template created and remembered
                warm(review_body(i))
            figures["direct"] = open_loop(direct, "review", args.rate, args.seconds, args.processes)
            print("direct", figures["direct"], flush=True)

            apiserver = urlparse(cluster.server)
            admin = yaml.safe_load(cluster.admin_kubeconfig.read_text())
            tls_files = {
                "ca_file": admin["clusters"][0]["cluster"]["certificate-authority"],
                "cert_file": admin["users"][0]["user"]["client-certificate"],
                "key_file": admin["users"][0]["user"]["client-key"],
            }
            path = f"/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All"
            through = Target(apiserver.hostname or "127.0.0.1", apiserver.port or 443, path, **tls_files)
            through_sender = Sender(through)

            def calls_webhook() -> bool:
                try:
                    through_sender(GPU_POD)
                except RuntimeError:
                    return False
                return True

            poll_until(calls_webhook, 60, "the apiserver calling the webhook")
            before = webhook_histogram(cluster.component_metrics("kube-apiserver"))
            figures["through_apiserver"] = open_loop(through, "gpu", args.rate, args.seconds, args.processes)
            after = webhook_histogram(cluster.component_metrics("kube-apiserver"))
            figures["through_apiserver"]["apiserver_webhook_call"] = histogram_quantiles(before, after)
            print("through apiserver", figures["through_apiserver"], flush=True)
            baseline = Target(
                apiserver.hostname or "127.0.0.1",
                apiserver.port or 443,
                path,
                expect_converted=False,
                **tls_files,
            )
            figures["through_apiserver_no_gpu_baseline"] = open_loop(
                baseline, "plain", args.rate, min(args.seconds, 20), args.processes
            )
            print("baseline", figures["through_apiserver_no_gpu_baseline"], flush=True)
            low = args.sustainable_rate
            before = webhook_histogram(cluster.component_metrics("kube-apiserver"))
            figures["through_apiserver_low"] = open_loop(through, "gpu", low, args.seconds, args.processes)
            after = webhook_histogram(cluster.component_metrics("kube-apiserver"))
            figures["through_apiserver_low"]["apiserver_webhook_call"] = histogram_quantiles(before, after)
            print("through apiserver, low rate", figures["through_apiserver_low"], flush=True)
            figures["through_apiserver_low_no_gpu_baseline"] = open_loop(
                baseline, "plain", low, args.seconds, args.processes
            )
            print("baseline, low rate", figures["through_apiserver_low_no_gpu_baseline"], flush=True)
            figures["max_direct"] = closed_loop(direct, args.connections, args.max_seconds, args.processes)
            figures["max_direct"]["connections"] = args.connections
            print("max", figures["max_direct"], flush=True)
        finally:
            process.terminate()
            figures["webhook_exit_code_on_sigterm"] = process.wait(30)
            driver.cleanup()
    info.finish()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "admission.json").write_text(
        json.dumps({"run": info.as_json(), "figures": figures}, indent=1) + "\n"
    )

    def row(label: str, offered: str, f: dict[str, Any]) -> str:
        cells = [label, offered, f["rate_per_s"], f["p50_ms"], f["p99_ms"], f["max_ms"], f["errors"]]
        return "| " + " | ".join(str(c) for c in cells) + " |"

    d, t = figures["direct"], figures["through_apiserver"]
    b, m = figures["through_apiserver_no_gpu_baseline"], figures["max_direct"]
    call = t["apiserver_webhook_call"]
    low_call = figures["through_apiserver_low"]["apiserver_webhook_call"]
    low = args.sustainable_rate
    lines = [
        "# Webhook admission latency and throughput",
        "",
        *info.markdown(),
        "",
        "| path | offered | achieved req/s | p50 ms | p99 ms | max ms | errors |",
        "|---|---|---|---|---|---|---|",
        row("direct to `/mutate` (warm cache)", f"{args.rate:g}/s for {args.seconds:g} s", d),
        row("through the apiserver, GPU pod (dryRun=All)", f"{args.rate:g}/s for {args.seconds:g} s", t),
        row("through the apiserver, pod without GPUs (not sent)", f"{args.rate:g}/s for 20 s", b),
        row(
            "through the apiserver, GPU pod",
            f"{low:g}/s for {args.seconds:g} s",
            figures["through_apiserver_low"],
        ),
        row(
            "through the apiserver, pod without GPUs",
            f"{low:g}/s for {args.seconds:g} s",
            figures["through_apiserver_low_no_gpu_baseline"],
        ),
        row(f"direct, closed loop, {args.connections} connections", f"flat out, {args.max_seconds:g} s", m),
        "",
        f"The apiserver's own histogram of its calls to the webhook during the GPU-pod run "
        "(`apiserver_admission_webhook_admission_duration_seconds`, coarse buckets): "
        f"{call['calls']:g} calls, "
        f"p50 {call['p50']}, p99 {call['p99']}; per bucket (ms: calls) {call['buckets_ms']}. "
        f"At {low:g}/s: {low_call['calls']:g} calls, p50 {low_call['p50']}, p99 {low_call['p99']}; "
        f"per bucket {low_call['buckets_ms']}.",
        "",
        "How to read it: latencies run from each request's due time (open loop), so queueing counts. "
        f"Load comes from {args.processes} client processes on the same machine as the apiserver, "
        "the node daemon and the webhook, all sharing its cores. The apiserver rows include the "
        "apiserver's own work on a dry-run pod create; the no-GPU row is that work alone "
        "(matchConditions keep the pod from the webhook), so the difference is what the webhook adds. "
        "The closed-loop row is the most reviews per second one webhook process answered.",
    ]
    (args.out / "admission.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
