"""How fast the webhook answers: admission latency p50/p99 at a fixed rate, posted to the webhook
directly and through the apiserver (pods created with dryRun=All, so the apiserver calls the webhook
exactly as for a real pod and stores nothing), and the most reviews per second one webhook process
answers. Writes admission.{md,json} into benchmarks/webhook/results/ (or --out DIR).

    .venv/bin/python benchmarks/webhook/admission.py [--rate 200] [--seconds 60] [--out DIR]

It starts (benchmarks/webhook/harness.py) a local control plane, a kubelet-less Node with the node
daemon over 4 simulated 80 GiB GPUs (so the webhook's slice cache holds real slices), registers the
chart's webhook configuration with a URL, and runs ``tessera-webhook`` as its own process with a
self-made CA, as in production.
Latency is measured open-loop: each request has a due time (start + i / rate) and its latency runs
from that due time to its answer, so a stalled server is charged for the queue it causes. The load
generator runs on the same machine and its own cost is in the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml

from benchmarks.run_info import RunInfo
from benchmarks.webhook.harness import (
    GPU_POD,
    NAMESPACE,
    Sender,
    Target,
    open_loop,
    review_body,
    running_webhook,
    summary,
)
from testbed.polling import poll_until

RESULTS = Path(__file__).resolve().parent / "results"


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
    info = RunInfo.start(
        ["tessera/webhook", "tessera/names.py", "tessera/watching.py", "charts/tessera/files"]
    )
    figures: dict[str, Any] = {"rate": args.rate, "seconds": args.seconds}
    with running_webhook() as webhook:
        cluster, direct = webhook.cluster, webhook.direct
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
    figures["webhook_exit_code_on_sigterm"] = webhook.exit_code
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
