"""charts/tessera's queue admission values installed into a local control plane running the real Kueue
v0.17 (its CRDs and webhooks): the API server and Kueue's webhooks accept every object, Kueue makes
the example queues Active once the admission check, run under the chart's own service account, marks
its AdmissionCheck Active; the account may do what the check needs and nothing else; the example
ClusterQueues admit GPU Jobs by quota, borrow within the cohort and give quota back to a higher
tier; and an uninstall leaves nothing behind.

No node runs the chart's check Deployment here (it would need the product image on real nodes):
the check runs as a process with the token of the account the chart made for it, and with the
flags of the chart's Deployment. Nodes are Node objects without a kubelet that publish the
driver's slices (testbed/queue_bed.py); no webhook runs, so the Jobs' pods are never placed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.kube import api_client, raw_json
from tessera.quantity import GiB, quantity_to_int
from testbed import queue_bed
from testbed.accounts import token_kubeconfig
from testbed.cluster import LocalCluster
from testbed.kueue import VALIDATING_CONFIGURATION
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.process import ManagedProcess
from tests.chart_helm import CHART, Release, helm, installed, values_file
from tests.integration.test_chart_install import kubectl_name, labelled, manifest_objects, read_back
from tests.integration.test_chart_rbac import Ask, failures

pytestmark = pytest.mark.integration

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
RESOURCE = "resource.k8s.io"
ANYWHERE = "some-namespace"
# Beside another release in the same cluster: the DeviceClass exists once.
NO_CLUSTER_SINGLETONS: dict[str, Any] = {
    "deviceClass": {"enabled": False},
}


@pytest.fixture(scope="module")
def api(kueue_cluster: LocalCluster) -> client.ApiClient:
    return api_client(kueue_cluster.admin_kubeconfig)


def make_namespaces(api: client.ApiClient, *names: str) -> None:
    core = client.CoreV1Api(api)
    for name in names:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))


def read_kueue(api: client.ApiClient, plural: str, name: str, namespace: str = "") -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    if namespace:
        response = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, name, _preload_content=False
        )
    else:
        response = custom.get_cluster_custom_object(GROUP, VERSION, plural, name, _preload_content=False)
    return raw_json(response)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for item in (obj.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


def is_active(api: client.ApiClient, plural: str, name: str, namespace: str = "") -> bool:
    return condition(read_kueue(api, plural, name, namespace), "Active").get("status") == "True"


def kueue_validated(api: client.ApiClient) -> set[str]:
    """The resources Kueue's validating webhooks judge, refusing what they cannot reach (Fail)."""
    configuration = raw_json(
        client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
            VALIDATING_CONFIGURATION, _preload_content=False
        )
    )
    return {
        resource
        for webhook in configuration["webhooks"]
        if webhook.get("failurePolicy") == "Fail"
        for rule in webhook["rules"]
        for resource in rule["resources"]
    }


def check_under_chart_account(
    cluster: LocalCluster, api: client.ApiClient, release: Release, manifest: list[dict[str, Any]], home: Path
) -> tuple[ManagedProcess, int]:
    """tessera-admission-check with the flags of the release's Deployment (but on a free loopback
    port) and a token of the release's own service account, so it has exactly the chart's RBAC;
    returns the process and its health port."""
    account = release.object_name("admissioncheck")
    request = client.AuthenticationV1TokenRequest.model_validate({"spec": {"expirationSeconds": 7200}})
    status = (
        client.CoreV1Api(api)
        .create_namespaced_service_account_token(account, release.namespace, request)
        .status
    )
    assert status is not None
    kubeconfig = token_kubeconfig(cluster, str(status.token), account, home / f"{account}.kubeconfig")
    [deployment] = [o for o in manifest if o["kind"] == "Deployment" and o["metadata"]["name"] == account]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["tessera-admission-check"]
    chart_args = [a for a in container["args"] if not a.startswith(("--bind-address=", "--health-port="))]
    # The pod's POD_NAMESPACE (the downward API's metadata.namespace) names the Lease's namespace.
    assert {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    } in container["env"]
    lease_namespace = f"--leader-election-namespace={release.namespace}"
    # The test bed's own --kubeconfig (the admin's) and Lease namespace come first; the last one given wins.
    process, port = queue_bed.admission_check_process(
        cluster, *chart_args, f"--kubeconfig={kubeconfig}", lease_namespace
    )
    process.wait_until(lambda: queue_bed.http_status(port, "/readyz") == 200, 180, "caches synced")
    return process, port


# -------------------------------------------------------------------------- install and uninstall


def test_kueue_accepts_every_queue_object_and_uninstall_leaves_nothing(
    kueue_cluster: LocalCluster, api: client.ApiClient, tmp_path: Path
) -> None:
    """The defaults with both queue parts on: the flavor, the two ClusterQueues in a cohort, a
    LocalQueue in each team namespace, the three tiers, and the admission check."""
    make_namespaces(api, "team-a", "team-b")
    release, namespace = unique_name("tessera"), unique_name("tessera-ns")
    make_namespaces(api, namespace)
    values = {"queue": {"admissionCheck": {"enabled": True}, "examples": {"enabled": True}}}
    kubeconfig = kueue_cluster.admin_kubeconfig
    helm(
        tmp_path,
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "-f",
        str(values_file(tmp_path, values)),
        kubeconfig=kubeconfig,
    )
    process: ManagedProcess | None = None
    try:
        objects = manifest_objects(kueue_cluster, tmp_path, release, namespace)
        kueue_kinds = sorted(o["kind"] for o in objects if o["apiVersion"] == f"{GROUP}/{VERSION}")
        assert kueue_kinds == sorted(
            ["AdmissionCheck", "ResourceFlavor", "ClusterQueue", "ClusterQueue", "LocalQueue", "LocalQueue"]
            + ["WorkloadPriorityClass"] * 3
        )
        for obj in objects:
            assert read_back(kueue_cluster, obj, namespace) is not None, (
                f"{kubectl_name(obj)} was not created"
            )
        assert {kubectl_name(o) for o in objects} <= labelled(kueue_cluster, release)
        # The flavor and the ClusterQueues went through Kueue's own validation on the way in.
        assert {"clusterqueues", "resourceflavors"} <= kueue_validated(api)
        tiers = {
            name: read_kueue(api, "workloadpriorityclasses", name)["value"]
            for name in ("production-inference", "interactive", "batch-training")
        }
        assert tiers == {"production-inference": 1000, "interactive": 500, "batch-training": 100}

        # Kueue holds the queues inactive until the check they name is Active; the check, under
        # the account the chart made for it, marks it so, and then every queue is usable.
        check = f"{release}-gpu-fit"
        assert read_kueue(api, "admissionchecks", check)["spec"]["controllerName"] == "tessera.dev/gpu-fit"
        process, port = check_under_chart_account(
            kueue_cluster, api, Release(release, namespace), objects, tmp_path
        )
        poll_until(lambda: is_active(api, "admissionchecks", check), 90, f"AdmissionCheck {check} Active")

        def queues_active() -> bool:
            return all(
                is_active(api, "clusterqueues", team) and is_active(api, "localqueues", "gpus", team)
                for team in ("team-a", "team-b")
            )

        poll_until(queues_active, 90, "ClusterQueues team-a, team-b and their LocalQueues Active")
        assert read_kueue(api, "clusterqueues", "team-a")["spec"]["cohortName"] == "tessera-gpus"
        # What the Deployment's probes ask answers; SIGTERM, as the kubelet sends it, ends the check
        # by itself within the pod's grace period.
        assert queue_bed.http_status(port, "/healthz") == queue_bed.http_status(port, "/readyz") == 200
        [deployment] = [
            o for o in objects if o["kind"] == "Deployment" and "admissioncheck" in o["metadata"]["name"]
        ]
        process.stop(grace=deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
        assert process.returncode == 0, process.log_tail()

        notes = helm(tmp_path, "get", "notes", release, "-n", namespace, kubeconfig=kubeconfig).stdout
        assert f"kubectl get admissionchecks.kueue.x-k8s.io {check}" in notes
        assert f"rollout status deployment/{release}-admissioncheck" in notes
        assert "ClusterQueue team-a (cohort tessera-gpus): LocalQueue gpus in team-a" in notes
        assert "production-inference (1000), interactive (500), batch-training (100)" in notes
        assert "kueue.x-k8s.io/queue-name: gpus" in notes
    finally:
        if process is not None:
            process.stop()
        helm(tmp_path, "uninstall", release, "-n", namespace, "--wait", kubeconfig=kubeconfig)

    def nothing_left() -> bool:
        return not labelled(kueue_cluster, release)

    # Kueue's finalizers on the ClusterQueues and the flavor go once it sees them unused.
    poll_until(nothing_left, 120, f"no object labelled with release {release}")
    for obj in objects:
        assert read_back(kueue_cluster, obj, namespace) is None, f"{kubectl_name(obj)} outlived the uninstall"


# -------------------------------------------------------- a release whose check runs, and its queues


@dataclass
class QueueRelease:
    cluster: LocalCluster
    api: client.ApiClient
    release: Release
    check: str
    teams: dict[str, str]  # ClusterQueue -> its namespace
    tiers: dict[str, str]  # tier -> WorkloadPriorityClass name

    def log_tails(self) -> dict[str, str]:
        return self.cluster.log_tails(60)


@pytest.fixture(scope="module")
def queues(
    kueue_cluster: LocalCluster, api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[QueueRelease]:
    """A release with the admission check and example queues of its own names, beside any other:
    two teams with 20Gi of GPU memory each that may borrow 20Gi from each other, and the check
    running under the release's account."""
    prefix = unique_name("q")
    teams = {f"{prefix}-{team}": f"{prefix}-{team}-ns" for team in ("a", "b")}
    tiers = {tier: f"{prefix}-{tier}" for tier in ("production-inference", "interactive", "batch-training")}
    make_namespaces(api, *teams.values())
    quota = {"nvidia.com/gpu": "4", queue_bed.GPU_MEMORY: "20Gi", queue_bed.GPU_CORES: "400"}
    values = {
        **NO_CLUSTER_SINGLETONS,
        "queue": {
            "admissionCheck": {"enabled": True},
            "examples": {
                "enabled": True,
                "resourceFlavor": {"name": f"{prefix}-gpu"},
                "cohort": f"{prefix}-pool",
                "clusterQueues": [
                    {"name": cq, "namespaces": [ns], "nominalQuota": quota, "borrowingLimit": quota}
                    for cq, ns in teams.items()
                ],
                "priorityClasses": [
                    {"name": tiers["production-inference"], "value": 1000},
                    {"name": tiers["interactive"], "value": 500},
                    {"name": tiers["batch-training"], "value": 100},
                ],
            },
        },
    }
    home = tmp_path_factory.mktemp("queues")
    with installed(kueue_cluster, api, home, values) as release:
        manifest = manifest_objects(kueue_cluster, home, release.name, release.namespace)
        process, _ = check_under_chart_account(kueue_cluster, api, release, manifest, home)
        check = f"{release.name}-gpu-fit"
        poll_until(
            lambda: all(is_active(api, "clusterqueues", cq) for cq in teams), 120, "ClusterQueues Active"
        )
        try:
            yield QueueRelease(kueue_cluster, api, release, check, teams, tiers)
        finally:
            batch = client.BatchV1Api(api)
            for namespace in teams.values():
                batch.delete_collection_namespaced_job(namespace, propagation_policy="Background")
            process.stop()


# ----------------------------------------------------------------------------------------- RBAC


CHECK_MUST = [
    *(
        Ask(verb, f"{RESOURCE}/{kind}")
        for verb in ("list", "watch")
        for kind in ("resourceslices", "resourceclaims", "resourceclaimtemplates")
    ),
    *(Ask(verb, "pods") for verb in ("list", "watch")),
    *(
        Ask(verb, f"{GROUP}/{kind}")
        for verb in ("list", "watch")
        for kind in ("workloads", "admissionchecks")
    ),
    Ask("patch", f"{GROUP}/workloads/status", name="some-workload", namespace=ANYWHERE),
    Ask("patch", f"{GROUP}/admissionchecks/status", name="some-check"),
]
CHECK_MUST_NOT = [
    # Kueue owns Workloads and their specs; the check writes only its own status entry.
    *(
        Ask(verb, f"{GROUP}/workloads", namespace=ANYWHERE)
        for verb in ("get", "create", "update", "patch", "delete")
    ),
    Ask("update", f"{GROUP}/workloads/status", namespace=ANYWHERE),
    *(Ask(verb, f"{GROUP}/admissionchecks") for verb in ("create", "update", "patch", "delete")),
    *(Ask(verb, f"{GROUP}/clusterqueues") for verb in ("list", "create", "patch", "delete")),
    Ask("create", f"{GROUP}/localqueues", namespace=ANYWHERE),
    Ask("create", f"{GROUP}/workloadpriorityclasses"),
    # It never places or changes GPU work itself.
    *(
        Ask(verb, f"{RESOURCE}/resourceclaims", namespace=ANYWHERE)
        for verb in ("get", "create", "update", "delete")
    ),
    Ask("patch", f"{RESOURCE}/resourceclaims/status", namespace=ANYWHERE),
    *(Ask(verb, f"{RESOURCE}/resourceslices") for verb in ("get", "create", "update", "delete")),
    Ask("create", f"{RESOURCE}/resourceclaimtemplates", namespace=ANYWHERE),
    *(Ask(verb, "pods", namespace=ANYWHERE) for verb in ("get", "create", "patch", "delete")),
    Ask("create", "pods/binding", namespace=ANYWHERE),
    Ask("create", "pods/eviction", namespace=ANYWHERE),
    Ask("create", "pods/exec", namespace=ANYWHERE),
    Ask("patch", "batch/jobs", namespace=ANYWHERE),
    Ask("list", "nodes"),
    Ask("get", "secrets", namespace=ANYWHERE),
    Ask("list", "secrets"),
    Ask("list", "configmaps"),
    Ask("create", "serviceaccounts/token", namespace=ANYWHERE),
    Ask("update", "admissionregistration.k8s.io/mutatingwebhookconfigurations"),
    Ask("escalate", "rbac.authorization.k8s.io/clusterroles"),
]


def test_the_checks_account_may_do_what_the_check_needs(queues: QueueRelease) -> None:
    assert failures(queues.api, queues.release, "admissioncheck", CHECK_MUST, True) == []


def test_the_checks_account_may_do_nothing_else(queues: QueueRelease) -> None:
    assert failures(queues.api, queues.release, "admissioncheck", CHECK_MUST_NOT, False) == []


def test_the_checks_account_may_hold_its_own_lease_and_no_other(queues: QueueRelease) -> None:
    own, lease = queues.release.namespace, queues.release.object_name("admissioncheck")
    leases = "coordination.k8s.io/leases"
    must = [
        Ask("create", leases, namespace=own),
        *(Ask(v, leases, name=lease, namespace=own) for v in ("get", "update")),
    ]
    must_not = [
        *(Ask(v, leases, name="kube-scheduler", namespace=own) for v in ("get", "update")),
        *(Ask(v, leases, name=lease, namespace="kube-system") for v in ("create", "get", "update")),
        *(Ask(v, leases, name=lease, namespace=own) for v in ("delete", "patch")),
        Ask("list", leases, namespace=own),
    ]
    assert failures(queues.api, queues.release, "admissioncheck", must, True) == []
    assert failures(queues.api, queues.release, "admissioncheck", must_not, False) == []


# --------------------------------------------------------------------------- admission by quota


def submit(queues: QueueRelease, team: str, name: str, gpumem_gi: int, tier: str) -> str:
    """A one-pod GPU Job (one GPU, gpumem_gi of its memory, 30 % of its time) in ``team``'s
    namespace, on the chart's LocalQueue, at ``tier``; returns its Workload's name."""
    namespace = queues.teams[team]
    job = queue_bed.gpu_job(name, "gpus", 1, gpumem_gi * 1024, 30, priority=queues.tiers[tier])
    client.BatchV1Api(queues.api).create_namespaced_job(namespace, client.V1Job.model_validate(job))
    return str(queue_bed.workload_of_job(queues.api, namespace, name, timeout=120)["metadata"]["name"])


def workload(queues: QueueRelease, team: str, name: str) -> dict[str, Any]:
    return queue_bed.read_workload(queues.api, queues.teams[team], name)


def admitted_to(queues: QueueRelease, team: str, name: str) -> str | None:
    """The ClusterQueue that admitted the Workload (quota reserved and every check Ready), if any."""
    current = workload(queues, team, name)
    if not queue_bed.has_condition(current, "Admitted"):
        return None
    return str(current["status"]["admission"]["clusterQueue"])


def wait_admitted(queues: QueueRelease, team: str, name: str, timeout: float = 120) -> str:
    try:
        found: str = poll_until(lambda: admitted_to(queues, team, name), timeout, f"Workload {name} admitted")
    except TimeoutError as error:
        status = workload(queues, team, name).get("status")
        raise AssertionError(f"{error}: status {json.dumps(status, indent=1)}") from error
    return found


def test_the_example_queues_admit_by_quota_borrow_and_give_back_to_a_higher_tier(
    queues: QueueRelease,
) -> None:
    """Team a fills its 20Gi (interactive), borrows team b's idle 20Gi (batch), and waits beyond; when b asks
    for its quota at production priority, Kueue preempts team a's borrowed batch Job and admits b's,
    each admission after the check found the share a GPU."""
    a, b = list(queues.teams)
    queue_bed.gpu_node(queues.api, unique_name("gpu-node"), [80, 80])

    # Within its own quota at the interactive tier: Kueue records admission times to the second, so
    # two batch Jobs admitted together would tie, and the reclaim's victim must be the borrowed one.
    own = submit(queues, a, "own", 20, "interactive")
    assert wait_admitted(queues, a, own) == a
    assert queue_bed.check_state(workload(queues, a, own), queues.check)["state"] == "Ready"
    usage = workload(queues, a, own)["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
    assert {k: quantity_to_int(v) for k, v in usage.items()} == {
        "nvidia.com/gpu": 1,
        queue_bed.GPU_MEMORY: 20 * GiB,
        queue_bed.GPU_CORES: 30,
    }

    borrowed = submit(queues, a, "borrowed", 20, "batch-training")
    assert wait_admitted(queues, a, borrowed) == a
    # Beyond nominal quota plus borrowing limit: quota, not capacity, keeps it waiting.
    beyond = submit(queues, a, "beyond", 20, "batch-training")

    def waits_for_quota() -> bool:
        current = workload(queues, a, beyond)
        reserved = condition(current, "QuotaReserved")
        return reserved.get("status") == "False" and "insufficient" in reserved.get("message", "").lower()

    poll_until(waits_for_quota, 60, "the third Job waiting for quota")
    assert admitted_to(queues, a, beyond) is None

    reclaim = submit(queues, b, "reclaim", 20, "production-inference")
    assert wait_admitted(queues, b, reclaim, timeout=180) == b
    preempted = workload(queues, a, borrowed)
    assert admitted_to(queues, a, borrowed) is None
    assert condition(preempted, "Preempted").get("status") == "True", json.dumps(
        preempted.get("status"), indent=1
    )
    assert admitted_to(queues, a, own) == a, "the Job within its own quota keeps running"
    assert queue_bed.check_state(workload(queues, b, reclaim), queues.check)["state"] == "Ready"


def test_quota_values_reach_kueue_as_written(queues: QueueRelease) -> None:
    """The chart's quantities arrive as Kueue reads them (strings, not floats)."""
    a = next(iter(queues.teams))
    spec = read_kueue(queues.api, "clusterqueues", a)["spec"]
    resources = {r["name"]: r for r in spec["resourceGroups"][0]["flavors"][0]["resources"]}
    assert {name: (r["nominalQuota"], r["borrowingLimit"]) for name, r in resources.items()} == {
        "nvidia.com/gpu": ("4", "4"),
        queue_bed.GPU_CORES: ("400", "400"),
        queue_bed.GPU_MEMORY: ("20Gi", "20Gi"),
    }
    assert spec["preemption"] == {
        "withinClusterQueue": "LowerPriority",
        "reclaimWithinCohort": "LowerPriority",
        "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 100},
    }
