"""The admission check's promise at scale, measured: of many GPU Jobs, more than the GPUs hold at
once, does Kueue with the check admit any whose pods then wait Pending for capacity? Every pod is
watched from creation to end; writes admitted_pods-<nodes>x<gpus>.{md,json} into
benchmarks/admissioncheck/results/ (or --out). Exits 1 when a pod was unschedulable (or the watch
lost its place, so that one could have been missed), unless --without-check.

    .venv/bin/python benchmarks/admissioncheck/admitted_pods.py [--jobs 1000] [--nodes 100] [--gpus 8]

The whole admission path runs as in production, on one machine: the local control plane (real
kube-apiserver, kube-scheduler, controller manager with the Job and claim controllers), real Kueue
charging GPU memory and cores as docs/queue.md configures it, ``tessera-admission-check`` and
``tessera-webhook`` as their own processes. The nodes are Node objects without a kubelet publishing
the driver's ResourceSlices (80 GiB GPUs); the scheduler really allocates each pod's claims and binds
it, and this process then ends each bound pod after ``--run-seconds`` by writing the status its
kubelet would (Succeeded), which frees its shares for the next Workloads.

The Jobs (1-4 pods of 20-60 GiB, 0-50 cores, seeded) ask about 1.5 times what the GPUs hold, and the
ClusterQueue's quota covers all of them: only the check stands between Kueue and pods the GPUs
cannot take. With ``--without-check`` the same Jobs go through Kueue alone, to show what the watch
catches when nothing packs the shares.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubernetes import client
from kubernetes.client import ApiException

from benchmarks.admissioncheck.decisions import percentile
from benchmarks.run_info import RunInfo
from benchmarks.webhook.harness import webhook_process
from tessera.admissioncheck.pinning import HOSTNAME_LABEL
from tessera.watching import watch_forever
from testbed import queue_bed
from testbed.driver_node import ensure_device_class
from testbed.fake_nodes import report_succeeded
from testbed.polling import poll_until
from testbed.webhook_effect import wait_until_webhook_answers

RESULTS = Path(__file__).resolve().parent / "results"
CHECK = "gpu-fit"
FLAVOR = "gpus"
NAMESPACE = "burst"
CONTAINER = "work"
GiB_MIB = 1024
QUOTA = {"nvidia.com/gpu": "1000000", queue_bed.GPU_MEMORY: "1000Ti", queue_bed.GPU_CORES: "100000000"}


@dataclass
class PodWatch:
    """Every pod of the namespace as the watch delivers it: when each was created (first seen),
    bound, and whether the scheduler ever said it could not place it."""

    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    unschedulable: dict[str, str] = field(default_factory=dict)
    unschedulable_at: dict[str, float] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)
    """Pods created with a hostname nodeSelector: held by the check to their planned node."""
    lists: int = 0
    """Full lists the watch made: one at the start; any more mean it lost its place and re-listed,
    and a pod that was unschedulable only in between would not have been seen."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, kind: str, obj: Mapping[str, Any]) -> None:
        now = time.monotonic()
        with self.lock:
            if kind == "SYNCED":
                self.lists += 1
            for pod in obj["items"] if kind == "SYNCED" else [obj]:
                name = pod["metadata"]["name"]
                self.created.setdefault(name, now)
                if HOSTNAME_LABEL in ((pod.get("spec") or {}).get("nodeSelector") or {}):
                    self.held.add(name)
                if (pod.get("spec") or {}).get("nodeName"):
                    self.bound.setdefault(name, now)
                for condition in (pod.get("status") or {}).get("conditions") or []:
                    if (
                        condition.get("type") == "PodScheduled"
                        and condition.get("status") == "False"
                        and condition.get("reason") == "Unschedulable"
                    ):
                        message = condition.get("message", "")
                        self.unschedulable.setdefault(
                            name, f"{condition.get('lastTransitionTime')}: {message}"
                        )
                        self.unschedulable_at.setdefault(name, now)

    def due_to_finish(self, finished: set[str], run_seconds: float) -> list[str]:
        now = time.monotonic()
        with self.lock:
            return [n for n, t in self.bound.items() if n not in finished and now - t >= run_seconds]


def job_shapes(jobs: int, seed: int) -> list[tuple[int, int, int]]:
    """(pods, GiB per pod, cores per pod) for each Job; the same for every run with one seed."""
    rng = random.Random(seed)
    return [
        (rng.randint(1, 4), rng.choice((20, 30, 40, 60)), rng.choice((0, 10, 25, 50))) for _ in range(jobs)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--run-seconds", type=float, default=20.0, help="how long each bound pod 'runs'")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--without-check", action="store_true", help="Kueue alone (quota only): what the watch sees then"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for every Job to finish")
    parser.add_argument("--keep-logs", type=Path, help="copy every component's log here at the end")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = RunInfo.start(["tessera/admissioncheck", "tessera/gpu_request.py", "tessera/webhook"])
    shapes = job_shapes(args.jobs, args.seed)
    demand_gib = sum(pods * gib for pods, gib, _ in shapes)
    capacity_gib = args.nodes * args.gpus * 80
    watch = PodWatch()
    stop = threading.Event()
    with queue_bed.checked_kueue_cluster() as (cluster, api, _, _), webhook_process(cluster, "tessera-burst"):
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        ensure_device_class(api)
        for index in range(args.nodes):
            queue_bed.gpu_node(api, f"node-{index:03d}", [80] * args.gpus)
        queue_bed.create(api, queue_bed.kueue_object("ResourceFlavor", FLAVOR, {}))
        queue_bed.create(api, queue_bed.admission_check(CHECK))
        checks = [] if args.without_check else [CHECK]
        queue_bed.create(api, queue_bed.cluster_queue("burst", FLAVOR, QUOTA, checks=checks))
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        queue_bed.create(api, queue_bed.local_queue("q", NAMESPACE, "burst"))
        wait_until_webhook_answers(api, NAMESPACE)
        threading.Thread(
            target=watch_forever,
            args=(lambda **kw: core.list_namespaced_pod(NAMESPACE, **kw), watch.handle, stop, "pods"),
            daemon=True,
        ).start()
        poll_until(lambda: watch.lists > 0, 60, "the pod watch's first list")
        started = time.monotonic()
        with ThreadPoolExecutor(8) as senders:
            creates = []
            for number, (pods, gib, cores) in enumerate(shapes):
                # 0 cores: the pod leaves nvidia.com/gpucores out (HAMi: no compute limit).
                job = queue_bed.gpu_job(f"job-{number:04d}", "q", pods, gib * GiB_MIB, cores or None)
                creates.append(
                    senders.submit(batch.create_namespaced_job, NAMESPACE, client.V1Job.model_validate(job))
                )
            for create in creates:
                create.result()  # a refused Job stops the run here, not at the timeout
        created = time.monotonic()
        expected = sum(pods for pods, _, _ in shapes)
        finished: set[str] = set()

        def finish_due() -> bool:
            for name in watch.due_to_finish(finished, args.run_seconds):
                try:
                    report_succeeded(core, NAMESPACE, name, CONTAINER)
                except ApiException as error:
                    if error.status != 404:
                        raise
                finished.add(name)
            return len(finished) >= expected  # a failed pod's replacement is one more

        try:
            poll_until(finish_due, args.timeout, f"all {expected} pods bound and ended", interval=1.0)
        finally:
            stop.set()
            if args.keep_logs:
                shutil.copytree(cluster.log_dir, args.keep_logs, dirs_exist_ok=True)
        ended = time.monotonic()
    info.finish()
    waits = [watch.bound[n] - watch.created[n] for n in watch.bound if n in watch.created]
    figures: dict[str, Any] = {
        "run": info.as_json(),
        "check": not args.without_check,
        "jobs": args.jobs,
        "pods": expected,
        "nodes": args.nodes,
        "gpus": args.gpus,
        "run_seconds": args.run_seconds,
        "demand_over_capacity": round(demand_gib / capacity_gib, 2),
        "create_s": round(created - started, 1),
        "all_ended_s": round(ended - started, 1),
        "pods_bound": len(watch.bound),
        "pods_held_to_their_planned_node": len(watch.held),
        "created_to_bound_ms": {
            "p50": round(statistics.median(waits) * 1000, 1),
            "p99": round(percentile([w * 1000 for w in waits], 0.99), 1),
        },
        "pods_ever_unschedulable": len(watch.unschedulable),
        "watch_relisted": watch.lists - 1,
        "longest_unschedulable_s": round(
            max((watch.bound.get(n, ended) - t for n, t in watch.unschedulable_at.items()), default=0.0), 1
        ),
        "unschedulable_examples": dict(list(watch.unschedulable.items())[:5]),
    }
    stem = f"admitted_pods-{args.nodes}x{args.gpus}" + ("-without-check" if args.without_check else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(figures, indent=2) + "\n")
    queue = "Kueue alone (quota only)" if args.without_check else "Kueue with the gpu-fit check"
    verdict = (
        f"unknown: the watch re-listed {watch.lists - 1} times"
        if watch.lists > 1
        else "none"
        if not watch.unschedulable
        else f"{len(watch.unschedulable)}, the longest for {figures['longest_unschedulable_s']} s "
        "(see the json)"
    )
    lines = [
        "# Do admitted pods wait for capacity? GPU Jobs beyond what the GPUs hold",
        "",
        *info.markdown(),
        "",
        f"{args.jobs} Jobs ({expected} pods of 20-60 GiB, 0-50 cores, seed {args.seed}) created at once "
        f"into one ClusterQueue whose quota covers them all, {queue}; {args.nodes} nodes x {args.gpus} "
        f"GPUs of 80 GiB; the Jobs ask {figures['demand_over_capacity']} times the GPUs' memory; each "
        f"bound pod ends {args.run_seconds:g} s after it was bound.",
        "",
        "| created in | all ended after | pods bound | created to bound p50 / p99 ms | "
        "pods ever unschedulable |",
        "|---|---|---|---|---|",
        f"| {figures['create_s']} s | {figures['all_ended_s']} s | {len(watch.bound)} | "
        f"{figures['created_to_bound_ms']['p50']} / {figures['created_to_bound_ms']['p99']} | {verdict} |",
        "",
        f"Pods held by the check to the node it planned them on (hostname nodeSelector): {len(watch.held)}.",
    ]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if (watch.unschedulable or watch.lists > 1) and not args.without_check else 0


if __name__ == "__main__":
    sys.exit(main())
