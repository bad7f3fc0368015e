"""What the gpu-fit admission check costs Kueue's admission rate: the same Workloads admitted by
Kueue alone (quota only) and by Kueue with the check, in one run, on one machine. Writes
queue_rate.{md,json} (queue_rate-qps<N>.* with --kueue-qps) into benchmarks/admissioncheck/results/
(or --out DIR).

    .venv/bin/python benchmarks/admissioncheck/queue_rate.py [--workloads 1000] [--nodes 100] [--gpus 8]

It starts a local control plane with real Kueue, creates kubelet-less Nodes publishing the driver's
ResourceSlices (80 GiB GPUs), and runs the check's controller (the code ``tessera-admission-check``
runs) in this process. Each round gets its own namespace, LocalQueue and ClusterQueue (quota for
everything), the ClusterQueue created held (``stopPolicy: Hold``); the Workloads are created (1-4 pods
of 10-30 GiB, 0-50 cores, seeded: every round the same, and all of them fit the GPUs), then the hold is
lifted and a watch records when each Workload gets QuotaReserved, the check's Ready and Admitted.
The rate is Workloads admitted per second from the release to the last admission, so creating the
objects is not in it. Rounds alternate (alone, checked, alone, checked) so that drift on a shared
machine falls on both; a round's Workloads are deleted before the next, so the check's inventory
starts each round with every GPU free.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubernetes import client

from benchmarks.admissioncheck.decisions import percentile, workload_body
from benchmarks.run_info import RunInfo
from tessera.admissioncheck.checks import sync_active
from tessera.admissioncheck.controller import WRITERS, WorkloadController
from tessera.admissioncheck.inventory import Inventory
from tessera.kube import api_client, raw_json
from tessera.watching import watch_forever
from testbed import queue_bed
from testbed.cluster import LocalCluster
from testbed.kueue import KueueOptions
from testbed.polling import poll_until

RESULTS = Path(__file__).resolve().parent / "results"
CHECK = "gpu-fit"
NULL_CHECK = "null"
NULL_CONTROLLER = "bench.tessera.dev/null"
KINDS = ("alone", "null", "gpu-fit")
"""Kueue alone (quota only); Kueue with a check that says Ready at once; Kueue with the gpu-fit check."""
TITLES = {"alone": "Kueue alone", "null": "Kueue + null check", "gpu-fit": "Kueue + gpu-fit check"}
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
HUGE_QUOTA = {
    "nvidia.com/gpu": "100000",
    "nvidia.com/gpumem": "1000000000",
    "nvidia.com/gpucores": "10000000",
}


class Milestones:
    """When (this process's monotonic clock, as the watch delivers it) each Workload of a namespace
    first showed QuotaReserved, ``check``'s Ready, and Admitted."""

    def __init__(self, api: client.ApiClient, namespace: str, check: str | None) -> None:
        self.seen: dict[str, dict[str, float]] = {}
        self.released = False
        self.writes_after_release = 0
        """Workload changes the watch delivered after the release (every write is one): with Kueue
        alone one per Workload (quota reserved and admitted at once)."""
        self._check = check
        self._lock = threading.Lock()
        self._stop = threading.Event()
        custom = client.CustomObjectsApi(api)
        list_call = functools.partial(
            custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "workloads"
        )
        threading.Thread(
            target=watch_forever, args=(list_call, self._handle, self._stop, "workloads"), daemon=True
        ).start()

    def _handle(self, kind: str, obj: Mapping[str, Any]) -> None:
        now = time.monotonic()
        if kind == "MODIFIED" and self.released:
            with self._lock:
                self.writes_after_release += 1
        for workload in obj["items"] if kind == "SYNCED" else [obj]:
            marks = {
                "quota": queue_bed.has_condition(workload, "QuotaReserved"),
                "check": queue_bed.check_state(workload, self._check or "").get("state") == "Ready",
                "admitted": queue_bed.has_condition(workload, "Admitted"),
            }
            with self._lock:
                times = self.seen.setdefault(workload["metadata"]["name"], {})
                for mark, reached in marks.items():
                    if reached:
                        times.setdefault(mark, now)

    def count(self, mark: str) -> int:
        with self._lock:
            return sum(1 for times in self.seen.values() if mark in times)

    def times(self, mark: str) -> list[float]:
        with self._lock:
            return [times[mark] for times in self.seen.values() if mark in times]

    def gaps(self, first: str, then: str) -> list[float]:
        with self._lock:
            return [t[then] - t[first] for t in self.seen.values() if first in t and then in t]

    def stop(self) -> None:
        self._stop.set()


class NullCheck:
    """An admission check that says Ready to every Workload at once, written the way the gpu-fit
    check writes (server-side apply of its one entry, writes in parallel): what any admission check
    costs Kueue (the second phase of its admission), with no decision in it."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._stop = threading.Event()
        self._writers = ThreadPoolExecutor(WRITERS)
        self._told: set[str] = set()
        list_call = functools.partial(
            self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "workloads"
        )
        threading.Thread(
            target=watch_forever, args=(list_call, self._handle, self._stop, "workloads"), daemon=True
        ).start()

    def _handle(self, kind: str, obj: Mapping[str, Any]) -> None:
        for workload in obj["items"] if kind == "SYNCED" else [obj]:
            metadata = workload["metadata"]
            version = f"{metadata['name']}@{metadata['resourceVersion']}"
            pending = queue_bed.check_state(workload, NULL_CHECK).get("state") == "Pending"
            # Kueue sets the entry Pending again when it reserves quota: answer each version that asks.
            if not pending or not queue_bed.has_condition(workload, "QuotaReserved") or version in self._told:
                continue
            self._told.add(version)
            self._writers.submit(self._ready, metadata["namespace"], metadata["name"])

    def _ready(self, namespace: str, name: str) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        entry = {"name": NULL_CHECK, "state": "Ready", "message": "null check", "lastTransitionTime": now}
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"admissionChecks": [entry]},
        }
        self._custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            "workloads",
            name,
            body,
            field_manager="null-check",
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    def stop(self) -> None:
        self._stop.set()
        self._writers.shutdown(wait=True)


def _ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    ms = [v * 1000 for v in values]
    return {"p50": round(statistics.median(ms), 1), "p99": round(percentile(ms, 0.99), 1)}


def run_round(api: client.ApiClient, index: int, kind: str, workloads: int, seed: int) -> dict[str, Any]:
    """One round: a held queue filled with the seeded Workloads, released, watched until every
    Workload is admitted; then its Workloads deleted."""
    checks = {"alone": [], "null": [NULL_CHECK], "gpu-fit": [CHECK]}[kind]
    mark = {"alone": None, "null": NULL_CHECK, "gpu-fit": CHECK}[kind]
    namespace = f"round-{index}"
    queue = f"cq-{index}"
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    body = queue_bed.cluster_queue(queue, "gpus", HUGE_QUOTA, checks=checks)
    body["spec"]["stopPolicy"] = "Hold"
    queue_bed.create(api, body)
    queue_bed.create(api, queue_bed.local_queue("q", namespace, queue))
    rng = random.Random(seed)
    for number in range(workloads):
        pods, memory, cores = rng.randint(1, 4), rng.choice((10, 20, 30)), rng.choice((0, 10, 25, 50))
        workload = workload_body(f"w-{number:04d}", pods, memory, cores)
        workload["metadata"]["namespace"] = namespace
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", workload)
    milestones = Milestones(api, namespace, mark)
    null_check = NullCheck(api, namespace) if kind == "null" else None
    poll_until(lambda: len(milestones.seen) == workloads, 120, "the watch listing every Workload")
    released = time.monotonic()
    milestones.released = True
    custom.patch_cluster_custom_object(
        GROUP, VERSION, "clusterqueues", queue, {"spec": {"stopPolicy": "None"}}
    )
    poll_until(
        lambda: milestones.count("admitted") == workloads, 1800, "every Workload admitted", interval=0.5
    )
    milestones.stop()
    if null_check:
        null_check.stop()
    last = max(milestones.times("admitted"))
    figures: dict[str, Any] = {
        "kind": kind,
        "workloads": workloads,
        "admitted_s": round(last - released, 2),
        "admitted_per_s": round(workloads / (last - released), 2),
        "writes_per_workload": round(milestones.writes_after_release / workloads, 2),
        "release_to_quota_ms": _ms([t - released for t in milestones.times("quota")]),
        "release_to_admitted_ms": _ms([t - released for t in milestones.times("admitted")]),
    }
    if mark:
        figures["quota_to_check_ready_ms"] = _ms(milestones.gaps("quota", "check"))
        figures["check_ready_to_admitted_ms"] = _ms(milestones.gaps("check", "admitted"))
    custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")

    def emptied() -> bool:
        listed = raw_json(
            custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, "workloads", _preload_content=False
            )
        )
        return not listed["items"]

    poll_until(emptied, 300, f"round {index}'s Workloads deleted", interval=1.0)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--rounds", type=int, default=2, help="how many times each of the three kinds runs, in turn"
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--kueue-qps",
        type=float,
        default=0,
        help="Kueue's client rate limit (clientConnection.qps, burst twice it); 0: what Kueue's release "
        "manifests set (50, burst 100)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = RunInfo.start(["tessera/admissioncheck", "tessera/gpu_request.py", "tessera/watching.py"])
    rounds: list[dict[str, Any]] = []
    extra = (
        {"clientConnection": {"qps": args.kueue_qps, "burst": int(2 * args.kueue_qps)}}
        if args.kueue_qps
        else {}
    )
    with LocalCluster(kueue=KueueOptions(extra_config=extra)) as cluster:
        api = api_client(cluster.admin_kubeconfig)
        for index in range(args.nodes):
            queue_bed.gpu_node(api, f"bench-node-{index:03d}", [80] * args.gpus)
        queue_bed.create(api, queue_bed.kueue_object("ResourceFlavor", "gpus", {}))
        queue_bed.create(api, queue_bed.admission_check(CHECK))
        queue_bed.create(
            api, queue_bed.kueue_object("AdmissionCheck", NULL_CHECK, {"controllerName": NULL_CONTROLLER})
        )
        sync_active(
            client.CustomObjectsApi(api),
            {NULL_CHECK: {"spec": {"controllerName": NULL_CONTROLLER}}},
            NULL_CONTROLLER,
            "null-check",
        )
        controller: WorkloadController | None = None
        inventory = Inventory(
            api, queue_bed.CONTROLLER_NAME, lambda what: controller.wake(what) if controller else None
        )
        controller = WorkloadController(api, inventory, "tessera-admission-check")
        inventory.start()
        if not inventory.wait_synced(120):
            raise RuntimeError("caches did not sync")
        controller.start()
        poll_until(lambda: len(inventory.gpus) == args.nodes * args.gpus, 60, "every GPU in the cache")
        for index in range(args.rounds * len(KINDS)):
            figures = run_round(api, index, KINDS[index % len(KINDS)], args.workloads, args.seed)
            print(f"round {index}", figures, flush=True)
            rounds.append(figures)
        controller.stop()
        inventory.stop()
    info.finish()
    rates = {
        kind: round(statistics.median(r["admitted_per_s"] for r in rounds if r["kind"] == kind), 2)
        for kind in KINDS
    }
    summary: dict[str, float] = {f"{kind}_per_s": rate for kind, rate in rates.items()}
    summary["cost_percent"] = round(100 * (1 - rates["gpu-fit"] / rates["alone"]), 1)
    summary["cost_over_null_percent"] = round(100 * (1 - rates["gpu-fit"] / rates["null"]), 1)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "run": info.as_json(),
        "nodes": args.nodes,
        "gpus": args.gpus,
        "kueue_qps": args.kueue_qps or "default",
        "rounds": rounds,
        "summary": summary,
    }
    stem = f"queue_rate-qps{args.kueue_qps:g}" if args.kueue_qps else "queue_rate"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    target = "met" if summary["cost_percent"] <= 10 else "NOT met"
    qps = (
        f"clientConnection.qps {args.kueue_qps:g}"
        if args.kueue_qps
        else "as its release manifests configure it (5 Workload reconciles at once, 50 requests/s)"
    )
    lines = [
        "# Admission check: its cost to Kueue's admission rate",
        "",
        *info.markdown(),
        "",
        f"{args.workloads} Workloads (1-4 pods of 10-30 GiB, 0-50 cores, seed {args.seed}) per round on "
        f"{args.nodes} nodes x {args.gpus} GPUs of 80 GiB, released from a held ClusterQueue at once; "
        f"Kueue {qps}.",
        "",
        "| round | queue | admitted/s | Workload writes each | release to admitted p50 / p99 ms | "
        "quota to check Ready p50 / p99 ms | check Ready to admitted p50 / p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, r in enumerate(rounds):
        gaps = [r.get("quota_to_check_ready_ms"), r.get("check_ready_to_admitted_ms")]
        cells = [f"{g['p50']} / {g['p99']}" if g else "-" for g in gaps]
        lines.append(
            f"| {index} | {TITLES[r['kind']]} | {r['admitted_per_s']} | {r['writes_per_workload']} | "
            f"{r['release_to_admitted_ms']['p50']} / {r['release_to_admitted_ms']['p99']} | "
            f"{cells[0]} | {cells[1]} |"
        )
    lines += [
        "",
        f"Median admitted/s: Kueue alone {rates['alone']}, with a null check {rates['null']}, "
        f"with the gpu-fit check {rates['gpu-fit']}: the check costs {summary['cost_percent']} % of "
        f"Kueue's rate (target <= 10 %: {target}), {summary['cost_over_null_percent']} % of the rate "
        "Kueue reaches with a check that decides nothing.",
    ]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
