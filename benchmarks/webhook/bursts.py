"""Pod bursts through the API server, and what the webhook adds to them: GPU pods created as fast as
the client goes and at fixed rates, server-side dry-run and for real, each round beside a round of
the same pods without their GPU resources (which the webhook's matchConditions never send it) in
the same run. Also counts the connections the webhook accepted per round against the reviews it
answered: whether the API server reuses its connections or pays a TLS handshake per review.
Writes bursts.{md,json} into benchmarks/webhook/results/ (or --out DIR).

    .venv/bin/python benchmarks/webhook/bursts.py [--seconds 6] [--burst 600] [--repeats 2]

The cluster and webhook are started as benchmarks/webhook/admission.py starts them (harness.py).
Real pods name a scheduler that does not exist, so they stay Pending and nothing schedules them,
and the controller manager is paused (SIGSTOP) while the rounds run, so no ResourceClaims are made
from the GPU pods' templates: the rounds measure admission, not the claim controller's writes
competing for the API server. Real pods are deleted after each round, and the next round starts
once they are gone. Rounds alternate GPU, baseline, baseline, GPU
for each load, so a drift in the machine's load falls on both sides alike.
Latency at a fixed rate runs from each request's due time (open loop, queueing counts); in a burst
from its sending, with 4 x 8 senders. The load generator shares the machine with everything else.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml
from kubernetes import client

from benchmarks.run_info import RunInfo
from benchmarks.webhook.admission import histogram_quantiles, webhook_histogram
from benchmarks.webhook.harness import (
    GPU_POD,
    NAMESPACE,
    RunningWebhook,
    Sender,
    Target,
    open_loop,
    running_webhook,
)
from tessera.kube import api_client
from testbed.polling import poll_until

RESULTS = Path(__file__).resolve().parent / "results"
HOW_TO_READ = [
    "How to read it: latencies at a fixed rate run from each request's due time (queueing counts), "
    "in a burst from each request's sending. Added = GPU minus baseline over the pooled latencies of "
    "their rounds; the ratio is GPU pods/s over baseline pods/s (answers over the time to the last "
    "answer), below 1 only where the machine could not keep the rate. Connections are those the "
    "webhook accepted (`tessera_webhook_connections_total`) during the GPU rounds, against the "
    "reviews it answered (each round also sends 32 warm-up pods). CPU is per answered pod, from "
    "/proc over each round, its idle seconds included: at low rates the fixed background work of "
    "each process weighs more per pod. The load generator and other work on the machine share the "
    "same cores; see the load average above.",
]
RATES = (50.0, 200.0, 500.0)


def webhook_counters(metrics_port: int) -> dict[str, float]:
    """Connections accepted and reviews answered so far, from the webhook's own /metrics."""
    connection = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=10)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connections = re.search(r"^tessera_webhook_connections_total (\S+)$", text, re.M)
    reviews = re.findall(r"^tessera_webhook_reviews_total\{[^}]*\} (\S+)$", text, re.M)
    return {
        "connections": float(connections[1]) if connections else float("nan"),
        "reviews": sum(float(x) for x in reviews),
    }


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far (/proc/PID/stat, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p99 over every latency of the rounds of one side, and their mean achieved rate."""
    latencies: list[float] = sorted(x for r in rounds for x in r.pop("_latencies"))

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2)

    return {
        "requests": len(latencies),
        "errors": sum(r["errors"] for r in rounds),
        "p50_ms": pct(0.5) if latencies else float("nan"),
        "p99_ms": pct(0.99) if latencies else float("nan"),
        "rate_per_s": round(sum(r["rate_per_s"] for r in rounds) / len(rounds), 1),
        "cpu_ms_per_pod": {
            name: round(sum(r["cpu_ms_per_pod"][name] for r in rounds) / len(rounds), 3)
            for name in rounds[0]["cpu_ms_per_pod"]
        },
    }


class Bench:
    def __init__(self, webhook: RunningWebhook, processes: int) -> None:
        self.webhook = webhook
        self.processes = processes
        cluster = webhook.cluster
        self.core = client.CoreV1Api(api_client(cluster.admin_kubeconfig))
        self.resource = client.ResourceV1Api(api_client(cluster.admin_kubeconfig))
        apiserver = urlparse(cluster.server)
        admin = yaml.safe_load(cluster.admin_kubeconfig.read_text())
        self.where = (apiserver.hostname or "127.0.0.1", apiserver.port or 443)
        self.tls = {
            "ca_file": admin["clusters"][0]["cluster"]["certificate-authority"],
            "cert_file": admin["users"][0]["user"]["client-certificate"],
            "key_file": admin["users"][0]["user"]["client-key"],
        }

    def target(self, dry_run: bool, gpu: bool) -> Target:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods" + ("?dryRun=All" if dry_run else "")
        return Target(*self.where, path, expect_converted=gpu, **self.tls)

    @contextmanager
    def controller_manager_paused(self) -> Iterator[None]:
        (manager,) = [p for p in self.webhook.cluster.processes if p.name == "kube-controller-manager"]
        os.kill(manager.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(manager.pid, signal.SIGCONT)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the API server, etcd and the webhook."""
        pids = {p.name: p.pid for p in self.webhook.cluster.processes if p.name in ("kube-apiserver", "etcd")}
        pids["webhook"] = self.webhook.pid
        return {name: cpu_seconds(pid) for name, pid in pids.items()}

    def leftovers(self) -> int:
        pods = len(self.core.list_namespaced_pod(NAMESPACE).items)
        return pods + len(self.resource.list_namespaced_resource_claim(NAMESPACE).items)

    def clean(self) -> float:
        """Delete the round's pods; seconds until they and their claims are gone."""
        began = time.time()
        self.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        poll_until(lambda: self.leftovers() == 0, 300, "pods and claims of the round deleted", interval=0.5)
        return round(time.time() - began, 1)

    def round(
        self, dry_run: bool, gpu: bool, rate: float | None, seconds: float, count: int
    ) -> dict[str, Any]:
        cluster = self.webhook.cluster
        before = webhook_counters(self.webhook.metrics_port)
        calls_before = webhook_histogram(cluster.component_metrics("kube-apiserver"))
        cpu_before = self.cpu()
        figures = open_loop(
            self.target(dry_run, gpu), "gpu" if gpu else "plain", rate, seconds, self.processes, count, True
        )
        cpu_after = self.cpu()
        after = webhook_counters(self.webhook.metrics_port)
        calls = histogram_quantiles(
            calls_before, webhook_histogram(cluster.component_metrics("kube-apiserver"))
        )
        answered = max(1, figures["requests"])
        figures["cpu_ms_per_pod"] = {
            name: round((cpu_after[name] - cpu_before[name]) * 1000 / answered, 3) for name in cpu_after
        }
        figures["webhook_connections"] = after["connections"] - before["connections"]
        figures["webhook_reviews"] = after["reviews"] - before["reviews"]
        figures["apiserver_webhook_call"] = {k: calls[k] for k in ("calls", "p50", "p99")}
        if not dry_run:
            figures["claims_at_end"] = len(self.resource.list_namespaced_resource_claim(NAMESPACE).items)
            figures["cleanup_s"] = self.clean()
        return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6, help="length of a fixed-rate round")
    parser.add_argument("--burst", type=int, default=600, help="pods in a burst round")
    parser.add_argument("--repeats", type=int, default=2, help="GPU/baseline pairs per load (ABBA order)")
    parser.add_argument("--processes", type=int, default=4, help="client processes generating load")
    parser.add_argument("--modes", default="dry-run,real")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = RunInfo.start(
        ["tessera/webhook", "tessera/names.py", "tessera/watching.py", "charts/tessera/files"]
    )
    loads: list[tuple[str, float | None, int]] = [("burst", None, args.burst)]
    loads += [(f"{rate:g}/s", rate, int(rate * args.seconds)) for rate in RATES]
    results: list[dict[str, Any]] = []
    with running_webhook() as webhook:
        bench = Bench(webhook, args.processes)
        probe = Sender(bench.target(True, True))

        def calls_webhook() -> bool:
            probe(GPU_POD)
            return True

        for _ in range(100):  # warm: the apiserver's webhook client and the template cache
            poll_until(calls_webhook, 60, "the apiserver calling the webhook")
        with bench.controller_manager_paused():
            for mode in args.modes.split(","):
                dry_run = mode == "dry-run"
                for label, rate, count in loads:
                    sides: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
                    for repeat in range(args.repeats):
                        for gpu in (True, False) if repeat % 2 == 0 else (False, True):
                            one = bench.round(dry_run, gpu, rate, args.seconds, count)
                            one["_latencies"] = one.pop("latencies")
                            sides[gpu].append(one)
                            shown = {k: v for k, v in one.items() if k != "_latencies"}
                            print(mode, label, "gpu" if gpu else "baseline", shown, flush=True)
                    gpu_side, base_side = _pooled(sides[True]), _pooled(sides[False])
                    results.append(
                        {
                            "mode": mode,
                            "load": label,
                            "pods_per_round": count,
                            "gpu": gpu_side,
                            "baseline": base_side,
                            "added_p50_ms": round(gpu_side["p50_ms"] - base_side["p50_ms"], 2),
                            "added_p99_ms": round(gpu_side["p99_ms"] - base_side["p99_ms"], 2),
                            "rate_ratio": round(gpu_side["rate_per_s"] / base_side["rate_per_s"], 3),
                            "webhook_connections": sum(r["webhook_connections"] for r in sides[True]),
                            "webhook_reviews": sum(r["webhook_reviews"] for r in sides[True]),
                            "rounds": {"gpu": sides[True], "baseline": sides[False]},
                        }
                    )
                    print(json.dumps({k: v for k, v in results[-1].items() if k != "rounds"}), flush=True)
    info.finish()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bursts.json").write_text(
        json.dumps({"run": info.as_json(), "results": results}, indent=1) + "\n"
    )
    lines = [
        "# Pod bursts through the API server: what the webhook adds",
        "",
        *info.markdown(),
        "",
        f"Each load: {args.repeats} GPU rounds and {args.repeats} baseline rounds (same pods without "
        "`nvidia.com/gpumem`/`gpucores`, which the webhook is never sent), alternated GPU, baseline, "
        f"baseline, GPU. Fixed rates run {args.seconds:g} s a round; a burst is {args.burst} pods from "
        f"{args.processes} x 8 senders.",
        "",
        "| mode | load | GPU p50 / p99 ms | baseline p50 / p99 ms | added p50 / p99 ms "
        "| GPU / baseline pods/s | ratio | webhook connections / reviews | errors GPU / baseline "
        "| CPU ms per pod, GPU: API server / etcd / webhook | CPU ms per pod, baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cpu(side: dict[str, Any]) -> str:
        used = side["cpu_ms_per_pod"]
        return f"{used['kube-apiserver']:.2f} / {used['etcd']:.2f} / {used['webhook']:.2f}"

    for r in results:
        g, b = r["gpu"], r["baseline"]
        lines.append(
            f"| {r['mode']} | {r['load']} | {g['p50_ms']} / {g['p99_ms']} | {b['p50_ms']} / {b['p99_ms']} "
            f"| {r['added_p50_ms']} / {r['added_p99_ms']} | {g['rate_per_s']} / {b['rate_per_s']} "
            f"| {r['rate_ratio']} | {r['webhook_connections']:g} / {r['webhook_reviews']:g} "
            f"| {g['errors']} / {b['errors']} | {cpu(g)} | {cpu(b)} |"
        )
    lines += ["", *HOW_TO_READ]
    (args.out / "bursts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
