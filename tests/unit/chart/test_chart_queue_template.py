"""charts/tessera's queue admission values rendered by ``helm template`` (no cluster): the admission
check's Deployment runs the check's own command with flags it accepts, two replicas electing a leader
on a Lease (a PodDisruptionBudget keeping one), unprivileged; its role is its rules file, and its Lease
role the one the test bed grants; the AdmissionCheck names the check's controller; the example queues form a
cohort of borrowing ClusterQueues with LocalQueues and three priority tiers; and what cannot work is
refused. The real API server and Kueue's webhooks judge the same objects in
tests/integration/test_chart_queue_install.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.admissioncheck import cli
from testbed import queue_bed
from tests.chart_helm import CHART, HelmError, find, render

KUEUE_API = "kueue.x-k8s.io/v1beta2"
WITH_KUEUE = ("--api-versions", KUEUE_API)
CHECK_ON: dict[str, Any] = {"queue": {"admissionCheck": {"enabled": True}}}
EXAMPLES_ON: dict[str, Any] = {"queue": {"examples": {"enabled": True}}}
BOTH_ON: dict[str, Any] = {"queue": {"admissionCheck": {"enabled": True}, "examples": {"enabled": True}}}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-queue")


@pytest.fixture(scope="module")
def both(home: Path) -> list[dict[str, Any]]:
    return render(home / "both", BOTH_ON, extra=WITH_KUEUE)


def kueue_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["apiVersion"] == KUEUE_API]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def check_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = find(objects, "Deployment", "tessera-admissioncheck")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def refusal(home: Path, values: dict[str, Any], extra: tuple[str, ...] = WITH_KUEUE) -> str:
    with pytest.raises(HelmError) as caught:
        render(home / "refused", values, extra=extra)
    return str(caught.value)


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    """Values dicts merged key by key (later wins), as Helm merges several -f files."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def examples(**changes: Any) -> dict[str, Any]:
    return merged(EXAMPLES_ON, {"queue": {"examples": changes}})


# ----------------------------------------------------------------------------------- off by default


def test_by_default_nothing_of_the_queue_is_installed(home: Path) -> None:
    # With Kueue's API served too: the values, not the cluster, turn the queue parts on.
    objects = render(home / "default", extra=WITH_KUEUE)
    assert kueue_objects(objects) == []
    assert not [o for o in objects if "admissioncheck" in o["metadata"]["name"]]


def test_queue_values_need_kueues_api_which_the_chart_does_not_install(home: Path) -> None:
    for values in (CHECK_ON, EXAMPLES_ON):
        message = refusal(home, values, extra=())
        assert f"need Kueue's API {KUEUE_API}" in message
        assert "install Kueue first" in message


# ------------------------------------------------------------------------------- the admission check


def test_the_check_runs_its_own_command_from_the_webhook_image(both: list[dict[str, Any]]) -> None:
    container = check_container(both)
    assert container["command"] == ["tessera-admission-check"]
    webhook = find(both, "Deployment", "tessera-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == webhook["image"] == "ghcr.io/tessera-gpu/tessera-webhook:0.1.0"


def test_every_flag_the_chart_passes_is_one_the_check_accepts(both: list[dict[str, Any]]) -> None:
    args = cli.parser().parse_args(check_container(both)["args"])
    assert args.controller_name == cli.CONTROLLER_NAME
    assert args.health_port == 8081
    assert args.bind_address == "0.0.0.0"
    assert args.leader_elect is True
    assert args.leader_election_id == "tessera-admissioncheck"


def test_two_replicas_elect_a_leader_on_a_lease_in_the_release_namespace(both: list[dict[str, Any]]) -> None:
    # Only the Lease's holder decides, so replicas may overlap, in a rollout too.
    spec = find(both, "Deployment", "tessera-admissioncheck")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert container["env"] == [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    ]
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    budget = find(both, "PodDisruptionBudget", "tessera-admissioncheck")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == spec["selector"]


def test_one_replica_gets_no_disruption_budget(home: Path) -> None:
    # minAvailable 1 of one replica would block every drain of its node.
    values = merged(CHECK_ON, {"queue": {"admissionCheck": {"replicas": 1}}})
    objects = render(home / "one", values, extra=WITH_KUEUE)
    assert find(objects, "Deployment", "tessera-admissioncheck")["spec"]["replicas"] == 1
    assert not [
        o for o in objects if o["kind"] == "PodDisruptionBudget" and "admissioncheck" in o["metadata"]["name"]
    ]


def test_the_lease_role_is_the_test_beds_and_names_the_checks_lease(both: list[dict[str, Any]]) -> None:
    role = find(both, "Role", "tessera-admissioncheck-leader-election")
    assert role["metadata"]["namespace"] == "tessera"
    assert role["rules"] == queue_bed.lease_rules("tessera-admissioncheck")
    binding = find(both, "RoleBinding", "tessera-admissioncheck-leader-election")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tessera-admissioncheck", "namespace": "tessera"}
    ]


def test_the_checks_probes_use_a_port_no_scraper_shares(home: Path) -> None:
    values = {"queue": {"admissionCheck": {"healthPort": 9191, "probePort": 9292}}}
    objects = render(home / "port", merged(CHECK_ON, values), extra=WITH_KUEUE)
    container = check_container(objects)
    assert container["ports"] == [
        {"name": "health", "containerPort": 9191, "protocol": "TCP"},
        {"name": "probes", "containerPort": 9292, "protocol": "TCP"},
    ]
    assert {"--health-port=9191", "--probe-port=9292"} <= set(container["args"])
    paths = {
        probe: (container[probe]["httpGet"]["path"], container[probe]["httpGet"]["port"])
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert paths == {
        "startupProbe": ("/healthz", "probes"),
        "livenessProbe": ("/healthz", "probes"),
        "readinessProbe": ("/readyz", "probes"),
    }
    # The check waits up to 120 s for its first lists before /healthz answers.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] > 120


def test_the_check_runs_unprivileged_and_has_time_to_stop(both: list[dict[str, Any]]) -> None:
    pod = find(both, "Deployment", "tessera-admissioncheck")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    container = pod["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["terminationGracePeriodSeconds"] >= 45
    assert pod["serviceAccountName"] == "tessera-admissioncheck"
    assert "volumes" not in pod and "hostNetwork" not in pod


def test_the_checks_role_is_exactly_its_rules_file(both: list[dict[str, Any]]) -> None:
    rules = yaml.safe_load((CHART / "files" / "admissioncheck-rules.yaml").read_text())
    assert find(both, "ClusterRole", "tessera-admissioncheck")["rules"] == rules
    binding = find(both, "ClusterRoleBinding", "tessera-admissioncheck")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tessera-admissioncheck", "namespace": "tessera"}
    ]
    # Reads are lists and watches, and gets of nodes; the only writes are two status subresources.
    writes = {
        (group, resource)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        if set(rule["verbs"]) - {"list", "watch", "get"}
    }
    assert writes == {("kueue.x-k8s.io", "workloads/status"), ("kueue.x-k8s.io", "admissionchecks/status")}
    gets = {
        (group, resource)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        if "get" in rule["verbs"]
    }
    assert gets == {("", "nodes")}


def test_the_admission_check_object_names_the_checks_controller(both: list[dict[str, Any]]) -> None:
    check = find(both, "AdmissionCheck")
    assert check["metadata"]["name"] == "tessera-gpu-fit"
    assert check["spec"] == {"controllerName": cli.CONTROLLER_NAME}


def test_a_second_controller_name_reaches_both_the_object_and_the_check(home: Path) -> None:
    values = merged(CHECK_ON, {"queue": {"admissionCheck": {"controllerName": "example.com/other-fit"}}})
    objects = render(home / "name", values, release="other", extra=WITH_KUEUE)
    assert find(objects, "AdmissionCheck")["metadata"]["name"] == "other-tessera-gpu-fit"
    assert find(objects, "AdmissionCheck")["spec"]["controllerName"] == "example.com/other-fit"
    container = find(objects, "Deployment", "other-tessera-admissioncheck")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert cli.parser().parse_args(container["args"]).controller_name == "example.com/other-fit"


# ------------------------------------------------------------------------------------ example queues


def test_two_cluster_queues_share_a_cohort_and_may_borrow(both: list[dict[str, Any]]) -> None:
    queues = {q["metadata"]["name"]: q["spec"] for q in of_kind(both, "ClusterQueue")}
    assert set(queues) == {"team-a", "team-b"}
    flavor = find(both, "ResourceFlavor")["metadata"]["name"]
    for name, spec in queues.items():
        assert spec["cohortName"] == "tessera-gpus", name
        [group] = spec["resourceGroups"]
        [assigned] = group["flavors"]
        assert assigned["name"] == flavor
        # Kueue needs the flavor's resources in coveredResources' order.
        assert [r["name"] for r in assigned["resources"]] == group["coveredResources"]
        for resource in assigned["resources"]:
            assert resource["borrowingLimit"] == resource["nominalQuota"], (name, resource)


def test_the_queues_cover_what_kueue_charges_a_gpu_job(both: list[dict[str, Any]]) -> None:
    """docs/queue.md: with its transformations Kueue charges a Job's HAMi resources as these."""
    for queue in of_kind(both, "ClusterQueue"):
        covered = queue["spec"]["resourceGroups"][0]["coveredResources"]
        assert set(covered) == set(queue_bed.QUOTA_RESOURCES)
        quotas = {
            r["name"]: r["nominalQuota"]
            for r in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
        }
        # Quantities stay strings: Helm would write large numbers as floats (1e+06).
        assert all(isinstance(v, str) for v in quotas.values())
        assert quotas == {"nvidia.com/gpu": "8", queue_bed.GPU_MEMORY: "320Gi", queue_bed.GPU_CORES: "800"}


def test_the_queues_use_the_admission_check_only_when_it_is_installed(home: Path) -> None:
    with_check = render(home / "with", BOTH_ON, extra=WITH_KUEUE)
    for queue in of_kind(with_check, "ClusterQueue"):
        assert queue["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": "tessera-gpu-fit"}]}
    without = render(home / "without", EXAMPLES_ON, extra=WITH_KUEUE)
    assert not of_kind(without, "AdmissionCheck")
    for queue in of_kind(without, "ClusterQueue"):
        assert "admissionChecksStrategy" not in queue["spec"]


def test_higher_tiers_reclaim_from_lower_ones(both: list[dict[str, Any]]) -> None:
    tiers = {c["metadata"]["name"]: c["value"] for c in of_kind(both, "WorkloadPriorityClass")}
    assert tiers == {"production-inference": 1000, "interactive": 500, "batch-training": 100}
    for queue in of_kind(both, "ClusterQueue"):
        assert queue["spec"]["preemption"] == {
            "withinClusterQueue": "LowerPriority",
            "reclaimWithinCohort": "LowerPriority",
            # A borrowing Workload may preempt only the lowest tier elsewhere.
            "borrowWithinCohort": {
                "policy": "LowerPriority",
                "maxPriorityThreshold": tiers["batch-training"],
            },
        }


def test_each_team_namespace_gets_a_local_queue_to_its_cluster_queue(both: list[dict[str, Any]]) -> None:
    local = {
        (q["metadata"]["namespace"], q["metadata"]["name"]): q["spec"] for q in of_kind(both, "LocalQueue")
    }
    assert local == {
        ("team-a", "gpus"): {"clusterQueue": "team-a"},
        ("team-b", "gpus"): {"clusterQueue": "team-b"},
    }
    # Each ClusterQueue takes Workloads only from its own teams' namespaces.
    for queue in of_kind(both, "ClusterQueue"):
        [expression] = queue["spec"]["namespaceSelector"]["matchExpressions"]
        assert expression == {
            "key": "kubernetes.io/metadata.name",
            "operator": "In",
            "values": [queue["metadata"]["name"]],
        }


def test_quotas_names_and_namespaces_come_from_values(home: Path) -> None:
    values = examples(
        resourceFlavor={"name": "a100", "nodeLabels": {"gpu": "a100"}},
        cohort="research",
        localQueueName="work",
        queueingStrategy="StrictFIFO",
        clusterQueues=[
            {
                "name": "vision",
                "namespaces": ["vision-dev", "vision-prod"],
                "nominalQuota": {"nvidia.com/gpu": 4, "cpu": 32, "memory": "256Gi"},
                "borrowingLimit": {"nvidia.com/gpu": 2},
            },
            {"name": "speech", "namespaces": ["speech"], "nominalQuota": {"nvidia.com/gpu": 1000000}},
        ],
    )
    objects = render(home / "custom", values, extra=WITH_KUEUE)
    assert find(objects, "ResourceFlavor")["spec"] == {"nodeLabels": {"gpu": "a100"}}
    vision = find(objects, "ClusterQueue", "vision")["spec"]
    assert vision["queueingStrategy"] == "StrictFIFO"
    assert vision["cohortName"] == "research"
    resources = {r["name"]: r for r in vision["resourceGroups"][0]["flavors"][0]["resources"]}
    assert resources == {
        "cpu": {"name": "cpu", "nominalQuota": "32"},
        "memory": {"name": "memory", "nominalQuota": "256Gi"},
        "nvidia.com/gpu": {"name": "nvidia.com/gpu", "nominalQuota": "4", "borrowingLimit": "2"},
    }
    speech = find(objects, "ClusterQueue", "speech")["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert speech == [{"name": "nvidia.com/gpu", "nominalQuota": "1000000"}]
    local = {
        (q["metadata"]["namespace"], q["metadata"]["name"], q["spec"]["clusterQueue"])
        for q in of_kind(objects, "LocalQueue")
    }
    assert local == {
        ("vision-dev", "work", "vision"),
        ("vision-prod", "work", "vision"),
        ("speech", "work", "speech"),
    }


def test_queue_objects_carry_the_release_labels(both: list[dict[str, Any]]) -> None:
    for obj in kueue_objects(both):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "tessera", obj["metadata"]["name"]
        assert labels["app.kubernetes.io/component"] in {"queue", "admissioncheck"}


# --------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "values, message",
    [
        (
            examples(
                clusterQueues=[
                    {"name": "a", "namespaces": ["shared"], "nominalQuota": {"nvidia.com/gpu": 1}},
                    {"name": "b", "namespaces": ["shared"], "nominalQuota": {"nvidia.com/gpu": 1}},
                ]
            ),
            "namespace shared is under both a and b",
        ),
        (
            examples(
                clusterQueues=[
                    {
                        "name": "a",
                        "namespaces": ["a"],
                        "nominalQuota": {"nvidia.com/gpu": 1},
                        "borrowingLimit": {"cpu": 1},
                    }
                ]
            ),
            "borrowingLimit names cpu, which its nominalQuota does not cover",
        ),
        (examples(cohort=""), "needs queue.examples.cohort"),
        (
            examples(
                clusterQueues=[
                    {"name": "a", "namespaces": ["a"], "nominalQuota": {"nvidia.com/gpu": 1}},
                    {"name": "a", "namespaces": ["b"], "nominalQuota": {"nvidia.com/gpu": 1}},
                ]
            ),
            "clusterQueues names a twice",
        ),
        (
            examples(priorityClasses=[{"name": "p", "value": 1}, {"name": "p", "value": 2}]),
            "priorityClasses names p twice",
        ),
        (
            examples(
                preemption={"reclaimWithinCohort": "Never", "borrowWithinCohort": {"policy": "LowerPriority"}}
            ),
            "needs queue.examples.preemption.reclaimWithinCohort other than Never",
        ),
        (examples(preemption={"withinClusterQueue": "Always"}), "withinClusterQueue"),
        (
            examples(
                clusterQueues=[{"name": "a", "namespaces": ["a"], "nominalQuota": {"nvidia.com/gpu": "lots"}}]
            ),
            "nominalQuota",
        ),
        (
            examples(clusterQueues=[{"name": "A_queue", "namespaces": ["a"], "nominalQuota": {"cpu": 1}}]),
            "name",
        ),
        (examples(bogus=1), "additional properties 'bogus' not allowed"),
        (
            merged(CHECK_ON, {"queue": {"admissionCheck": {"replicas": 0}}}),
            "replicas': minimum",
        ),
    ],
    ids=[
        "namespace-in-two-queues",
        "borrowing-uncovered-resource",
        "borrowing-without-cohort",
        "queue-named-twice",
        "priority-class-named-twice",
        "borrow-without-reclaim",
        "preemption-policy",
        "quota-not-a-quantity",
        "queue-name-not-dns",
        "unknown-example-key",
        "no-replica",
    ],
)
def test_values_that_cannot_work_are_refused(home: Path, values: dict[str, Any], message: str) -> None:
    assert message in refusal(home, values)


def test_no_pod_of_the_chart_gets_service_variables(home: Path) -> None:
    """A release named "tessera" has a Service "tessera-webhook", whose link variables would include
    TESSERA_WEBHOOK_PORT=tcp://...: the webhook read it as its port setting and exited (found by the
    demo, which installs the release as "tessera")."""
    objects = render(home / "links", BOTH_ON, extra=WITH_KUEUE)
    workloads = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    assert {o["kind"] for o in workloads} == {"Deployment", "DaemonSet"}
    assert len(workloads) == 4
    for workload in workloads:
        assert workload["spec"]["template"]["spec"]["enableServiceLinks"] is False, workload["metadata"][
            "name"
        ]
