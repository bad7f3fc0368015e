"""What the claims the webhook writes cost kube-scheduler: scheduled pods per second for each common
request shape, beside (a) the same pods asking whole devices of an exclusive DRA driver and (b)
plain pods without claims, in one run on one control plane. Writes pods_per_second.{md,json} into
benchmarks/scheduling/results/ (or --out DIR).

    .venv/bin/python benchmarks/scheduling/pods_per_second.py [--nodes 300] [--pods 500] [--passes 2]

The other recorded runs (results/README.md reads all three):

    ... pods_per_second.py --pods 300 --kinds mem-cores,exclusive-1 --exclusive-like-ours --name like_ours
    ... pods_per_second.py --pods 300 --kinds gputype,gputype-exact --name gputype_exact

It starts a local control plane (real etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
and creates ``--nodes`` kubelet-less Ready nodes. Each publishes the driver's own ResourceSlice with
8 GPUs of 80 GiB (tessera.driver.devices.device and tessera.driver.slices.slice_object, via
testbed/queue_bed.py; every other node an A100, the rest H100s) and a slice of a second driver,
``exclusive.bench.dev``, with 8 plain devices (no consumable capacity, no multiple allocations).
The chart's DeviceClass (every device of the driver) and one for the exclusive driver are created.

Shapes, each a ResourceClaimTemplate made by the webhook's own code (claim_template with a Fleet
read from the published slices) and referenced from the pod as the webhook's patch does:
``mem-cores`` (gpumem 10240 + gpucores 10), ``percent`` (gpumem-percentage 10: a firstAvailable
request), ``gpu-2`` (nvidia.com/gpu 2 with gpumem 10240: a distinctAttribute constraint),
``gputype`` (gpumem 10240 and nvidia.com/use-gputype A100: a CEL selector). Baselines:
``exclusive-1`` / ``exclusive-2`` (one ExactCount request of 1 / 2 whole devices of the exclusive
driver, the same pods otherwise) and ``plain`` (no claim).

A round creates ``--pods`` pods in a namespace of its own, held by a scheduling gate, waits until
kube-controller-manager has made every pod's ResourceClaim (so claim creation, which that
controller does at its own client rate, is not in the figure), then lifts the gates as fast as
this process can and measures from the first lift to the last pod bound (spec.nodeName, as a watch
of the namespace's pods delivers it). Pods the scheduler refused at least once (PodScheduled
False, Unschedulable) are counted. The scheduler's /metrics is read before and after the scheduling
part, and the difference says where its time went (framework extension points, plugins (sampled), scheduling
attempts, and how long its client waited on its own rate limiter). Pods and claims are deleted
before the next round, so every round starts with every GPU free. Rounds go through all kinds in
turn, the second pass in the opposite order, so drift on a shared machine falls on every kind.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubernetes import client

from benchmarks.admissioncheck.decisions import percentile
from benchmarks.run_info import RunInfo
from tessera.gpu_request import read_request, selection_for
from tessera.kube import api_client, raw_json
from tessera.names import (
    DEVICE_CLASS,
    DRIVER_NAME,
    HAMI_GPU,
    HAMI_GPUCORES,
    HAMI_GPUMEM,
    HAMI_GPUMEM_PERCENTAGE,
    HAMI_USE_TYPE,
)
from tessera.selection_cel import cel_string
from tessera.watching import watch_forever
from tessera.webhook.conversion import claim_template, template_name
from tessera.webhook.fleet import Fleet, fleet_from_slices
from tessera.webhook.mutation import pod_claim_name
from testbed import queue_bed
from testbed.cluster import LocalCluster
from testbed.dra_objects import device_class
from testbed.polling import poll_until

RESULTS = Path(__file__).resolve().parent / "results"
MEASURED = ["tessera/webhook/conversion.py", "tessera/selection_cel.py", "tessera/driver/devices.py"]
"""The code whose output the scheduler reads: the claim the webhook writes and the device the driver
publishes."""
EXCLUSIVE_DRIVER = "exclusive.bench.dev"
GATE = "bench.tessera.dev/hold"
GPUS_PER_NODE = 8
PRODUCTS = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
CONTAINER = "work"
CLAIM = pod_claim_name("containers", CONTAINER)
UNGATE = [{"op": "remove", "path": "/spec/schedulingGates"}]

SHAPES: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "mem-cores": ({HAMI_GPU: "1", HAMI_GPUMEM: "10240", HAMI_GPUCORES: "10"}, {}),
    "percent": ({HAMI_GPU: "1", HAMI_GPUMEM_PERCENTAGE: "10"}, {}),
    "gpu-2": ({HAMI_GPU: "2", HAMI_GPUMEM: "10240"}, {}),
    "gputype": ({HAMI_GPU: "1", HAMI_GPUMEM: "10240"}, {HAMI_USE_TYPE: "A100"}),
}
"""Tessera's shapes: the HAMi limits and annotations a user writes."""

BASELINES = ("exclusive-1", "exclusive-2", "plain")
KINDS = (*SHAPES, *BASELINES)
VARIANTS = ("gputype-exact",)
"""Kinds run only when --kinds names them: a change to a shape, measured before it is made.
``gputype-exact`` is the webhook's gputype template with its type selector resolved against the
published product names (``productName in [...]``, no lowerAscii, contains or exists)."""
EXCLUSIVE_OF = {
    "mem-cores": "exclusive-1",
    "percent": "exclusive-1",
    "gpu-2": "exclusive-2",
    "gputype": "exclusive-1",
    "gputype-exact": "exclusive-1",
}
"""The exclusive baseline each shape is compared with: the same number of devices."""


# -- objects ---------------------------------------------------------------------------------------


def exclusive_devices(node: str, product: str, like_ours: bool) -> list[dict[str, Any]]:
    """The exclusive driver's 8 devices on ``node``, each taken whole: two attributes and a plain
    memory capacity, or (``like_ours``) the attributes and capacity values of the driver's own
    devices with neither multiple allocations nor request policies, which tells what the shares
    themselves cost apart from how much a device carries."""
    if like_ours:
        return [
            {
                "name": ours["name"],
                "attributes": ours["attributes"],
                "capacity": {name: {"value": value["value"]} for name, value in ours["capacity"].items()},
            }
            for ours in queue_bed.gpu_devices(node, [80] * GPUS_PER_NODE, product)
        ]
    return [
        {
            "name": f"dev-{index}",
            "attributes": {"index": {"int": index}, "uuid": {"string": f"EX-{node}-{index}"}},
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for index in range(GPUS_PER_NODE)
    ]


def exclusive_slice(node: str, uid: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """A ResourceSlice of the exclusive driver on ``node`` with ``devices``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-{EXCLUSIVE_DRIVER}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": {
            "driver": EXCLUSIVE_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def make_node(api: client.ApiClient, index: int, like_ours: bool) -> None:
    name = f"bench-node-{index:03d}"
    product = PRODUCTS[index % 2]
    queue_bed.gpu_node(api, name, [80] * GPUS_PER_NODE, product=product)
    core = client.CoreV1Api(api)
    uid = str(raw_json(core.read_node(name, _preload_content=False))["metadata"]["uid"])
    body = exclusive_slice(name, uid, exclusive_devices(name, product, like_ours))
    client.ResourceV1Api(api).create_resource_slice(client.V1ResourceSlice.model_validate(body))


def exclusive_class() -> dict[str, Any]:
    """The exclusive driver's DeviceClass, written like the chart's: every device of the driver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": EXCLUSIVE_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{EXCLUSIVE_DRIVER}'"}}]},
    }


def exclusive_template(namespace: str, count: int) -> dict[str, Any]:
    request = {"deviceClassName": EXCLUSIVE_DRIVER, "allocationMode": "ExactCount", "count": count}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"exclusive-{count}", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


def template_for(kind: str, namespace: str, fleet: Fleet) -> dict[str, Any] | None:
    """The ResourceClaimTemplate of ``kind``: for a Tessera shape the webhook's own conversion."""
    if kind == "plain":
        return None
    if kind.startswith("exclusive-"):
        return exclusive_template(namespace, int(kind.rsplit("-", 1)[1]))
    if kind == "gputype-exact":
        return exact_types(template_for("gputype", namespace, fleet), fleet)
    limits, annotations = SHAPES[kind]
    container = {"name": CONTAINER, "resources": {"limits": limits}}
    request = read_request(f'container "{CONTAINER}"', container, selection_for(annotations))
    assert request is not None
    return claim_template(namespace, f'container "{CONTAINER}"', request, fleet)


def exact_types(template: dict[str, Any] | None, fleet: Fleet) -> dict[str, Any]:
    """``template`` (the webhook's gputype one) with its type selector replaced by an exact match on
    the published product names that selector matches."""
    assert template is not None
    selection = selection_for(SHAPES["gputype"][1])
    names = sorted(p for p in fleet.products if selection.matches("", p))
    attribute = f"device.attributes[{cel_string(DRIVER_NAME)}].productName"
    exact = f"{attribute} in [{', '.join(cel_string(n) for n in names)}]"
    spec = template["spec"]
    spec["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": exact}}]
    template["metadata"]["name"] = template_name(spec)
    return template


def pod_body(name: str, kind: str, template: str | None) -> dict[str, Any]:
    annotations = SHAPES[kind.removesuffix("-exact")][1] if kind.removesuffix("-exact") in SHAPES else {}
    container: dict[str, Any] = {"name": CONTAINER, "image": "tessera.local/none"}
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": GATE}],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    if template:
        container["resources"] = {"claims": [{"name": CLAIM}]}
        spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": template}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations)},
        "spec": spec,
    }


# -- watching pods ---------------------------------------------------------------------------------


class PodTimes:
    """When (this process's monotonic clock, as the watch delivers it) each pod of a namespace had its
        claim made (status.resourceClaimStatuses), was first refused (PodScheduled False, Unschedulable:
    not the SchedulingGated of a held pod) and bound."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.claimed: dict[str, float] = {}
        self.refused: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.seen: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        core = client.CoreV1Api(api)

        def list_call(**kwargs: Any) -> Any:
            return core.list_namespaced_pod(namespace, **kwargs)

        threading.Thread(
            target=watch_forever, args=(list_call, self._handle, self._stop, "pods"), daemon=True
        ).start()

    def _handle(self, kind: str, obj: Mapping[str, Any]) -> None:
        now = time.monotonic()
        for pod in obj["items"] if kind == "SYNCED" else [obj]:
            name = pod["metadata"]["name"]
            status = pod.get("status") or {}
            with self._lock:
                self.seen.add(name)
                if status.get("resourceClaimStatuses"):
                    self.claimed.setdefault(name, now)
                if (pod.get("spec") or {}).get("nodeName"):
                    self.bound.setdefault(name, now)
                for condition in status.get("conditions") or []:
                    if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                        self.refused.setdefault(name, now)

    def count(self, which: str) -> int:
        with self._lock:
            return len(getattr(self, which))

    def times(self, which: str) -> list[float]:
        with self._lock:
            return list(getattr(self, which).values())

    def stop(self) -> None:
        self._stop.set()


# -- scheduler metrics -----------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
WANTED = (
    "scheduler_framework_extension_point_duration_seconds",
    "scheduler_plugin_execution_duration_seconds",
    "scheduler_scheduling_attempt_duration_seconds",
    "scheduler_schedule_attempts_total",
    "rest_client_rate_limiter_duration_seconds",
    "rest_client_requests_total",
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The ``_sum``/``_count`` series and counters of WANTED in Prometheus text, keyed by name and
    labels (``le`` buckets are left out: sums and counts say where the time went)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or not match.group(1).startswith(WANTED) or match.group(1).endswith("_bucket"):
            continue
        labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
        out[(match.group(1), labels)] = float(match.group(3))
    return out


def grouped(
    before: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    after: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    keys: tuple[str, ...],
) -> dict[str, float]:
    """The increase of series ``name`` between two scrapes, summed by the values of ``keys``."""
    totals: dict[str, float] = defaultdict(float)
    for (series, labels), value in after.items():
        if series != name:
            continue
        label = dict(labels)
        totals["/".join(label.get(k, "") for k in keys)] += value - before.get((series, labels), 0.0)
    return {k: round(v, 4) for k, v in sorted(totals.items()) if v > 0}


def where_time_went(before: Mapping[Any, float], after: Mapping[Any, float]) -> dict[str, Any]:
    ext = "scheduler_framework_extension_point_duration_seconds"
    plugin = "scheduler_plugin_execution_duration_seconds"
    attempt = "scheduler_scheduling_attempt_duration_seconds"
    limiter = "rest_client_rate_limiter_duration_seconds"
    return {
        "extension_point_s": grouped(before, after, f"{ext}_sum", ("extension_point",)),
        "extension_point_calls": grouped(before, after, f"{ext}_count", ("extension_point",)),
        "plugin_sampled_s": grouped(before, after, f"{plugin}_sum", ("plugin", "extension_point")),
        "attempt_s": grouped(before, after, f"{attempt}_sum", ("result",)),
        "attempts": grouped(before, after, "scheduler_schedule_attempts_total", ("result",)),
        "rate_limiter_wait_s": grouped(before, after, f"{limiter}_sum", ()).get("", 0.0),
        "requests": grouped(before, after, "rest_client_requests_total", ("method",)),
    }


# -- rounds ----------------------------------------------------------------------------------------


def run_round(
    cluster: LocalCluster, api: client.ApiClient, index: int, kind: str, pods: int, fleet: Fleet
) -> dict[str, Any]:
    namespace = f"round-{index}"
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    template = template_for(kind, namespace, fleet)
    if template:
        resource.create_namespaced_resource_claim_template(
            namespace, client.V1ResourceClaimTemplate.model_validate(template)
        )
    times = PodTimes(api, namespace)
    name = template["metadata"]["name"] if template else None
    names = [f"p-{number:05d}" for number in range(pods)]
    creating = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        bodies = [client.V1Pod.model_validate(pod_body(n, kind, name)) for n in names]
        list(pool.map(lambda body: core.create_namespaced_pod(namespace, body), bodies))
    created = time.monotonic() - creating
    ready = "claimed" if template else "seen"
    poll_until(lambda: times.count(ready) == pods, 900, f"round {index}: every pod's claim", interval=0.5)
    claims_made = time.monotonic() - creating
    before = samples(cluster.component_metrics("kube-scheduler"))
    released = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda n: core.patch_namespaced_pod(n, namespace, UNGATE),
                names,
            )
        )
    lifted = time.monotonic() - released
    poll_until(lambda: times.count("bound") == pods, 1800, f"round {index}: every pod bound", interval=0.2)
    after = samples(cluster.component_metrics("kube-scheduler"))
    times.stop()
    bound = sorted(t - released for t in times.times("bound"))
    figures: dict[str, Any] = {
        "kind": kind,
        "pods": pods,
        "create_pods_s": round(created, 1),
        "pods_and_claims_s": round(claims_made, 1),
        "lift_gates_s": round(lifted, 2),
        "all_bound_s": round(bound[-1], 2),
        "pods_per_s": round(pods / bound[-1], 2),
        "bound_p50_s": round(statistics.median(bound), 2),
        "bound_p99_s": round(percentile(bound, 0.99), 2),
        "refused_once": times.count("refused"),
        "scheduler": where_time_went(before, after),
    }
    cleanup_started = time.monotonic()
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    if template:
        resource.delete_collection_namespaced_resource_claim(namespace)

    def emptied() -> bool:
        left = raw_json(core.list_namespaced_pod(namespace, _preload_content=False))["items"]
        claims = raw_json(resource.list_namespaced_resource_claim(namespace, _preload_content=False))["items"]
        return not left and not claims

    poll_until(emptied, 900, f"round {index}'s pods and claims deleted", interval=1.0)
    figures["cleanup_s"] = round(time.monotonic() - cleanup_started, 1)
    return figures


def order(passes: int) -> list[str]:
    """Every kind in turn, every other pass in the opposite order."""
    out: list[str] = []
    for number in range(passes):
        out += [*KINDS, *VARIANTS] if number % 2 == 0 else list(reversed([*KINDS, *VARIANTS]))
    return out


# -- report ----------------------------------------------------------------------------------------


def summary_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    rates = {
        kind: round(statistics.median(r["pods_per_s"] for r in rounds if r["kind"] == kind), 2)
        for kind in (*KINDS, *VARIANTS)
        if any(r["kind"] == kind for r in rounds)
    }
    ratios: dict[str, dict[str, float]] = {}
    for kind, rate in rates.items():
        if EXCLUSIVE_OF.get(kind) in rates:
            ratios.setdefault(kind, {})["over_exclusive"] = round(rate / rates[EXCLUSIVE_OF[kind]], 2)
        if kind != "plain" and "plain" in rates:
            ratios.setdefault(kind, {})["over_plain"] = round(rate / rates["plain"], 2)
    return {"pods_per_s": rates, "ratios": ratios}


LIKE_OURS = " (with the attributes and capacity values of ours)"

POINTS = ("Filter", "PreFilter", "Reserve", "PreBind")
"""The extension points the results table shows per pod."""


def per_pod_ms(r: Mapping[str, Any], section: str, key: str) -> float:
    seconds = float(r["scheduler"][section].get(key, 0.0))
    return round(1000 * seconds / int(r["pods"]), 2)


def markdown(
    info: RunInfo, args: argparse.Namespace, rounds: list[dict[str, Any]], summary: Mapping[str, Any]
) -> str:
    lines = [
        "# Scheduling: pods per second with the claims the webhook writes",
        "",
        *info.markdown(),
        "",
        f"{args.pods} pods per round on {args.nodes} kubelet-less nodes x {GPUS_PER_NODE} GPUs of 80 GiB "
        f"(the driver's slices; A100 and H100 on alternate nodes) plus {GPUS_PER_NODE} devices of an "
        f"exclusive driver per node{LIKE_OURS if args.exclusive_like_ours else ''}; {args.passes} "
        f"passes over the kinds {args.kinds}, alternating order.",
        "Rate: pods / (first gate lifted to last pod bound), claims made by kube-controller-manager "
        "before the gates are lifted.",
        "",
        "| round | kind | pods/s | lift gates s | all bound s | bound p50 / p99 s | refused once | "
        "Filter ms/pod | PreFilter ms/pod | Reserve ms/pod | PreBind ms/pod | attempt ms/pod | "
        "client rate-limit wait s | cleanup s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for index, r in enumerate(rounds):
        attempt = sum(r["scheduler"]["attempt_s"].values())
        points = [per_pod_ms(r, "extension_point_s", p) for p in POINTS]
        lines.append(
            f"| {index} | {r['kind']} | {r['pods_per_s']} | {r['lift_gates_s']} | {r['all_bound_s']} | "
            f"{r['bound_p50_s']} / {r['bound_p99_s']} | {r['refused_once']} | "
            f"{' | '.join(map(str, points))} | {round(1000 * attempt / r['pods'], 2)} | "
            f"{r['scheduler']['rate_limiter_wait_s']} | {r['cleanup_s']} |"
        )
    lines += [
        "",
        "Median pods/s per kind, and each Tessera shape's ratio to its exclusive baseline "
        "(same device count) and to plain pods:",
        "",
        "| kind | pods/s | / exclusive | / plain |",
        "|---|---|---|---|",
    ]
    for kind, rate in summary["pods_per_s"].items():
        ratio = summary["ratios"].get(kind, {})
        over = [ratio.get("over_exclusive", "-"), ratio.get("over_plain", "-")]
        lines.append(f"| {kind} | {rate} | {over[0]} | {over[1]} |")
    lines += ["", "Analysis and target: see README.md beside this file.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of the kinds")
    parser.add_argument(
        "--exclusive-like-ours",
        action="store_true",
        help="give the exclusive driver's devices the attributes and capacities of ours",
    )
    parser.add_argument("--name", default="pods_per_second", help="the results' file name, without suffix")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    chosen = args.kinds.split(",")
    info = RunInfo.start(MEASURED)
    rounds: list[dict[str, Any]] = []
    with LocalCluster() as cluster:
        api = api_client(cluster.admin_kubeconfig)
        resource = client.ResourceV1Api(api)
        resource.create_device_class(device_class(DEVICE_CLASS))
        resource.create_device_class(client.V1DeviceClass.model_validate(exclusive_class()))
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: make_node(api, i, args.exclusive_like_ours), range(args.nodes)))
        print(f"{args.nodes} nodes in {time.monotonic() - started:.0f} s", flush=True)
        slices = raw_json(resource.list_resource_slice(_preload_content=False))["items"]
        fleet = fleet_from_slices(slices)
        for index, kind in enumerate(k for k in order(args.passes) if k in chosen):
            figures = run_round(cluster, api, index, kind, args.pods, fleet)
            brief = {k: v for k, v in figures.items() if k != "scheduler"}
            print(f"round {index}", json.dumps(brief), flush=True)
            rounds.append(figures)
    info.finish()
    summary = summary_of(rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "run": info.as_json(),
        "nodes": args.nodes,
        "pods": args.pods,
        "exclusive_like_ours": args.exclusive_like_ours,
        "rounds": rounds,
        "summary": summary,
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(info, args, rounds, summary))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
