"""How long the admission check takes to decide one Workload with 1 000 Workloads pending over
100 nodes x 8 GPUs, on the real control plane with real Kueue. Writes decisions.{md,json} into
benchmarks/admissioncheck/results/ (or --out DIR).

    .venv/bin/python benchmarks/admissioncheck/decisions.py [--workloads 1000] [--nodes 100] [--gpus 8]

It starts a local control plane with Kueue v0.17, creates kubelet-less Nodes publishing the driver's
ResourceSlices (80 GiB GPUs, memory and cores consumable), one ClusterQueue with quota for
everything and the gpu-fit check, and runs the controller (inventory watches and decision loop, the
code ``tessera-admission-check`` runs) in this process so its decision timings can be read. Then it
creates the Workloads at once (each 1-4 pods of 10-40 GiB and 0-50 cores, seeded; about what the GPUs
hold); with ``--sizes 10,20,30,40,50,60`` they ask more than the GPUs hold, so a tail stays Pending and
is decided again on every pass. A decision is one
Workload read, packed on the free capacity and written; the figure is its time in the controller
(``decide``), plus, separately, each pass's planning of the shares already reserved.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubernetes import client

from benchmarks.run_info import RunInfo
from tessera.admissioncheck.controller import WorkloadController
from tessera.admissioncheck.inventory import Inventory
from tessera.kube import api_client, raw_json
from testbed import queue_bed
from testbed.cluster import LocalCluster
from testbed.polling import poll_until

RESULTS = Path(__file__).resolve().parent / "results"
NAMESPACE = "bench"
CHECK = "gpu-fit"


def workload_body(name: str, pods: int, memory_gi: int, cores: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory_gi * 1024)}
    if cores:
        limits["nvidia.com/gpucores"] = str(cores)
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "queueName": "q",
            "podSets": [
                {
                    "name": "main",
                    "count": pods,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "work",
                                    "image": "tessera.local/none",
                                    "resources": {"requests": dict(limits), "limits": limits},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--sizes",
        default="10,20,30,40",
        help="GiB per pod to choose from; larger sizes ask more than the GPUs hold, so a tail waits",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = RunInfo.start(
        [
            "tessera/admissioncheck",
            "tessera/gpu_request.py",
            "tessera/watching.py",
        ]
    )
    rng = random.Random(args.seed)
    sizes = tuple(int(size) for size in args.sizes.split(","))
    figures: dict[str, Any] = {"workloads": args.workloads, "nodes": args.nodes, "gpus_per_node": args.gpus}
    with LocalCluster(kueue=True) as cluster:
        api = api_client(cluster.admin_kubeconfig)
        started = time.monotonic()
        for index in range(args.nodes):
            queue_bed.gpu_node(api, f"bench-node-{index:03d}", [80] * args.gpus)
        figures["nodes_published_s"] = round(time.monotonic() - started, 1)
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        queue_bed.create(api, queue_bed.kueue_object("ResourceFlavor", "gpus", {}))
        queue_bed.create(api, queue_bed.admission_check(CHECK))
        huge = {
            "nvidia.com/gpu": "100000",
            "nvidia.com/gpumem": "1000000000",
            "nvidia.com/gpucores": "10000000",
        }
        queue_bed.create(api, queue_bed.cluster_queue("bench-cq", "gpus", huge, checks=[CHECK]))
        queue_bed.create(api, queue_bed.local_queue("q", NAMESPACE, "bench-cq"))

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

        custom = client.CustomObjectsApi(api)
        demand = 0
        started = time.monotonic()
        for index in range(args.workloads):
            pods, memory, cores = rng.randint(1, 4), rng.choice(sizes), rng.choice((0, 10, 25, 50))
            demand += pods * memory
            custom.create_namespaced_custom_object(
                "kueue.x-k8s.io",
                "v1beta2",
                NAMESPACE,
                "workloads",
                workload_body(f"w-{index:04d}", pods, memory, cores),
            )
        figures["created_s"] = round(time.monotonic() - started, 1)
        figures["demand_gi"] = demand
        figures["capacity_gi"] = 80 * args.nodes * args.gpus

        def all_decided() -> dict[str, int] | None:
            listed = raw_json(
                custom.list_namespaced_custom_object(
                    "kueue.x-k8s.io", "v1beta2", NAMESPACE, "workloads", _preload_content=False
                )
            )
            states: dict[str, int] = {}
            for item in listed["items"]:
                state = queue_bed.check_state(item, CHECK)
                decided = state.get("state") == "Ready" or (
                    state.get("state") == "Pending" and state.get("message")
                )
                key = state.get("state", "none") if decided else "undecided"
                states[key] = states.get(key, 0) + 1
            return (
                states
                if set(states) <= {"Ready", "Pending"} and sum(states.values()) == args.workloads
                else None
            )

        states = poll_until(all_decided, 1800, "every Workload decided", interval=2.0)
        figures["all_decided_s"] = round(time.monotonic() - started, 1)
        figures["states"] = states
        controller.stop()
        inventory.stop()
        durations = list(controller.stats.durations)
        passes = list(controller.stats.pass_durations)
    info.finish()
    ms = [d * 1000 for d in durations]
    figures["decisions"] = len(ms)
    figures["decision_ms"] = {
        "p50": round(statistics.median(ms), 2),
        "p90": round(percentile(ms, 0.9), 2),
        "p99": round(percentile(ms, 0.99), 2),
        "max": round(max(ms), 2),
        "mean": round(statistics.fmean(ms), 2),
    }
    figures["passes"] = len(passes)
    figures["pass_planning_ms"] = {
        "p50": round(statistics.median(passes) * 1000, 1) if passes else None,
        "max": round(max(passes) * 1000, 1) if passes else None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "decisions" if args.sizes == "10,20,30,40" else f"decisions-sizes-{args.sizes.replace(',', '-')}"
    (args.out / f"{stem}.json").write_text(
        json.dumps({"run": info.as_json(), "figures": figures}, indent=2) + "\n"
    )
    target = "met" if figures["decision_ms"]["p99"] <= 50 else "NOT met"
    d, planning = figures["decision_ms"], figures["pass_planning_ms"]
    lines = [
        "# Admission check: decision latency",
        "",
        *info.markdown(),
        "",
        f"- {args.workloads} Workloads (1-4 pods of {args.sizes} GiB, 0-50 cores, seed {args.seed}) "
        f"created at once on {args.nodes} nodes x {args.gpus} GPUs of 80 GiB: demand {demand} GiB, capacity "
        f"{figures['capacity_gi']} GiB.",
        f"- Every Workload decided after {figures['all_decided_s']} s: {states}.",
        f"- {len(ms)} decisions (a Pending Workload is decided again on every pass): per decision "
        f"p50 {d['p50']} ms, p90 {d['p90']} ms, p99 {d['p99']} ms, max {d['max']} ms. "
        f"Target p99 <= 50 ms: {target}.",
        f"- {len(passes)} passes; planning the reserved shares at the start of a pass: "
        f"p50 {planning['p50']} ms, max {planning['max']} ms (not in the per-decision figure).",
    ]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
