"""The administrator's two decisions at admission (the chart's webhook.highPriorityNamespaces and
webhook.seccomp): priority 0 only in the namespaces granted it, the annotation form answered with
a warning; and the seccomp profile of containers whose share the shim enforces added, refused or
warned about, the container's own profile winning over the pod's."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.names import HAMI_RESOURCES
from tessera.webhook import seccomp
from tessera.webhook.admission import DEFAULT_POLICY, AdmissionPolicy, Decision, admit
from tessera.webhook.review import ReviewRequest
from tests.unit.webhook.webhook_samples import FLEET, apply_patch, container, decoded_patch, pod, request

G, MEM, PCT, CORES = HAMI_RESOURCES
PRIORITY = "nvidia.com/priority"
RUNTIME_DEFAULT = {"type": "RuntimeDefault"}


def decide(obj: dict[str, Any], policy: AdmissionPolicy = DEFAULT_POLICY) -> Decision:
    return admit(ReviewRequest(**request(obj)), FLEET, policy)  # type: ignore[typeddict-item]


def patched_pod(obj: dict[str, Any], policy: AdmissionPolicy = DEFAULT_POLICY) -> dict[str, Any]:
    decision = decide(obj, policy)
    assert decision.outcome == "converted", decision.response
    return apply_patch(obj, decoded_patch(decision.response))


def denial(obj: dict[str, Any], policy: AdmissionPolicy = DEFAULT_POLICY) -> str:
    decision = decide(obj, policy)
    assert decision.outcome == "denied", decision.response
    message: str = decision.response["response"]["status"]["message"]
    return message


def warnings_of(obj: dict[str, Any], policy: AdmissionPolicy = DEFAULT_POLICY) -> list[str]:
    decision = decide(obj, policy)
    assert decision.outcome == "converted", decision.response
    return list(decision.response["response"].get("warnings", []))


# ---------------------------------------------------------------------------------------- priority


@pytest.mark.parametrize("granted", [frozenset(), frozenset({"inference", "team-b"})], ids=["none", "others"])
def test_priority_0_outside_the_granted_namespaces_is_refused_naming_the_namespace_and_the_value(
    granted: frozenset[str],
) -> None:
    """A high-priority share holds its neighbours back: only the administrator's list grants it."""
    obj = pod(container("main", {G: 1, MEM: 1000, PRIORITY: 0}))
    assert denial(obj, AdmissionPolicy(high_priority_namespaces=granted)) == (
        'container "main": nvidia.com/priority 0 (high) is granted only to namespaces an administrator '
        'lists in the chart value webhook.highPriorityNamespaces, and namespace "team" is not listed.'
    )


def test_priority_0_in_a_granted_namespace_travels_as_share_config() -> None:
    obj = pod(container("main", {G: 1, MEM: 1000, PRIORITY: 0}))
    decision = decide(obj, AdmissionPolicy(high_priority_namespaces=frozenset({"team"})))
    assert decision.outcome == "converted", decision.response
    [template] = decision.templates
    [config] = template["spec"]["spec"]["devices"]["config"]
    assert config["opaque"]["parameters"]["priority"] == 0


def test_priority_0_is_refused_in_an_init_container_too_and_priority_1_is_anyones() -> None:
    init = container("warm", {G: 1, MEM: 1000, PRIORITY: "0"})
    refused = denial(pod(container("main"), init=[init]))
    assert refused.startswith('init container "warm": nvidia.com/priority 0')
    assert decide(pod(container("main", {G: 1, MEM: 1000, PRIORITY: 1}))).outcome == "converted"


def test_priority_as_a_pod_annotation_is_answered_with_a_warning_naming_the_resource_form() -> None:
    obj = pod(container("main", {G: 1, MEM: 1000}), annotations={PRIORITY: "0"})
    decision = decide(obj)
    assert decision.outcome == "converted"
    assert "config" not in decision.templates[0]["spec"]["spec"]["devices"], "the annotation grants nothing"
    assert (
        "annotation nvidia.com/priority is not read; the container resource nvidia.com/priority (in "
        "resources.limits, 0 high or 1 low) is the one honoured."
    ) in decision.response["response"]["warnings"]


# ----------------------------------------------------------------------------------------- seccomp


def test_enforce_gives_a_gpu_container_without_a_profile_runtime_default_and_leaves_the_others() -> None:
    """Only the container the shim limits changes: a sidecar keeps running as it would have."""
    gpu = container("main", {G: 1, MEM: 1000}, securityContext={"runAsUser": 1000})
    obj = pod(gpu, container("sidecar"), init=[container("fetch", {G: 1})])
    result = patched_pod(obj)
    main, sidecar = result["spec"]["containers"]
    assert main["securityContext"] == {"runAsUser": 1000, "seccompProfile": RUNTIME_DEFAULT}
    assert "securityContext" not in sidecar
    assert result["spec"]["initContainers"][0]["securityContext"] == {"seccompProfile": RUNTIME_DEFAULT}
    assert "securityContext" not in result["spec"], "the pod's own context is not touched"


@pytest.mark.parametrize(
    ("pod_profile", "own_profile"),
    [
        ({"type": "RuntimeDefault"}, None),
        ({"type": "Localhost", "localhostProfile": "gpu.json"}, None),
        (None, {"type": "Localhost", "localhostProfile": "gpu.json"}),
        ({"type": "Unconfined"}, {"type": "RuntimeDefault"}),
    ],
    ids=["pod-runtime-default", "pod-localhost", "own-localhost", "own-wins-over-pod"],
)
def test_enforce_passes_a_container_that_runs_under_runtime_default_or_localhost_unchanged(
    pod_profile: dict[str, str] | None, own_profile: dict[str, str] | None
) -> None:
    gpu = container("main", {G: 1, MEM: 1000})
    if own_profile is not None:
        gpu["securityContext"] = {"seccompProfile": own_profile}
    obj = pod(gpu)
    if pod_profile is not None:
        obj["spec"]["securityContext"] = {"seccompProfile": pod_profile}
    result = patched_pod(obj)
    assert result["spec"].get("securityContext") == obj["spec"].get("securityContext")
    assert result["spec"]["containers"][0].get("securityContext") == gpu.get("securityContext")


@pytest.mark.parametrize(
    ("level", "message"),
    [
        (
            "container",
            'container "main": seccomp profile "Unconfined", set on the container, would let it leave its '
            "GPU share's limits through a user namespace (unshare); ask RuntimeDefault or Localhost, or "
            "ask an administrator about the chart value webhook.seccomp.",
        ),
        ("pod", 'container "main": seccomp profile "Unconfined", set on the pod, would let it leave its '),
    ],
)
def test_enforce_refuses_a_gpu_container_that_runs_unconfined_in_one_sentence(
    level: str, message: str
) -> None:
    gpu = container("main", {G: 1, MEM: 1000})
    obj = pod(gpu)
    if level == "container":
        gpu["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    else:
        obj["spec"]["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    assert denial(obj).startswith(message)


def test_containers_without_the_shim_keep_their_profile_whatever_the_mode() -> None:
    """A MIG instance or a whole GPU with enforcement off has no shim limits to lift."""
    unconfined = {"seccompProfile": {"type": "Unconfined"}}
    mig = container("mig", {"nvidia.com/mig-1g.10gb": 1}, securityContext=unconfined)
    whole = container(
        "whole", {G: 1}, env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}], securityContext=unconfined
    )
    bare = container("bare", {"nvidia.com/mig-1g.10gb": 1})
    for mode in seccomp.MODES:
        obj = pod(mig, whole, bare)
        result = patched_pod(obj, AdmissionPolicy(seccomp=mode))
        contexts = [c.get("securityContext") for c in result["spec"]["containers"]]
        assert contexts == [unconfined, unconfined, None]
        assert not [w for w in warnings_of(obj, AdmissionPolicy(seccomp=mode)) if "seccomp" in w]


def test_warn_changes_nothing_and_warns_for_each_gpu_container_without_a_confining_profile() -> None:
    policy = AdmissionPolicy(seccomp=seccomp.WARN)
    unconfined = container("a", {G: 1, MEM: 1000}, securityContext={"seccompProfile": {"type": "Unconfined"}})
    confined = container("b", {G: 1, MEM: 1000}, securityContext={"seccompProfile": RUNTIME_DEFAULT})
    obj = pod(unconfined, confined, container("c", {G: 1, MEM: 1000}))
    result = patched_pod(obj, policy)
    assert [c.get("securityContext") for c in result["spec"]["containers"]] == [
        unconfined["securityContext"],
        confined["securityContext"],
        None,
    ]
    warned = [w for w in warnings_of(obj, policy) if "seccomp" in w]
    assert warned == [
        f'container "{name}": it runs without a RuntimeDefault or Localhost seccomp profile, so it could '
        "leave its GPU share's limits through a user namespace (unshare); set "
        "securityContext.seccompProfile.type RuntimeDefault."
        for name in ("a", "c")
    ]


def test_off_changes_nothing_and_says_nothing() -> None:
    policy = AdmissionPolicy(seccomp=seccomp.OFF)
    unconfined = {"seccompProfile": {"type": "Unconfined"}}
    obj = pod(container("main", {G: 1, MEM: 1000}, securityContext=unconfined))
    result = patched_pod(obj, policy)
    assert result["spec"]["containers"][0]["securityContext"] == unconfined
    assert warnings_of(obj, policy) == []


def test_a_windows_pod_gets_no_profile_since_windows_has_no_seccomp() -> None:
    obj = pod(container("main", {G: 1, MEM: 1000}))
    obj["spec"]["os"] = {"name": "windows"}
    assert "securityContext" not in patched_pod(obj)["spec"]["containers"][0]


def test_the_patched_pod_reviewed_again_is_left_alone() -> None:
    """Reinvocation after other webhooks: the converted pod names no HAMi resource any more."""
    result = patched_pod(pod(container("main", {G: 1, MEM: 1000})))
    assert decide(result).outcome == "untouched"


# ---------------------------------------------------------------------------------- reserved paths


@pytest.mark.parametrize(
    "path",
    [
        "/run/tessera",
        "/run/tessera/limits",
        "/run/tessera/usage/",
        "/etc/ld.so.preload",
        "/run/x/../tessera/limits",
        "//run/./tessera",
    ],
)
def test_a_volume_over_the_claims_files_or_the_preload_is_refused_in_one_sentence(path: str) -> None:
    """A pod volume there would land on the node's limits file, usage region or preload: the shim
    would stop every CUDA program of the container, so the pod is refused when it is created."""
    gpu = container("main", {G: 1, MEM: 1000})
    gpu["volumeMounts"] = [{"name": "mine", "mountPath": path}]
    assert denial(pod(gpu)) == (
        f'container "main": volume "mine" is mounted at "{path}", where the node puts its GPU '
        "share's limits and shim (/run/tessera and /etc/ld.so.preload are reserved); mount it elsewhere."
    )


@pytest.mark.parametrize("path", ["/run", "/run/tesseract", "/etc", "/data"])
def test_volumes_beside_or_above_the_claims_files_are_left_alone(path: str) -> None:
    """A volume above /run/tessera is mounted before the claim's folder, which lands on top of it."""
    gpu = container("main", {G: 1, MEM: 1000})
    gpu["volumeMounts"] = [{"name": "mine", "mountPath": path}]
    assert patched_pod(pod(gpu))["spec"]["containers"][0]["volumeMounts"] == gpu["volumeMounts"]


def test_a_container_without_the_shim_may_mount_anywhere() -> None:
    """A MIG instance runs without the shim and the claim's folder: nothing there to cover."""
    mig = container("main", {"nvidia.com/mig-1g.10gb": 1})
    mig["volumeMounts"] = [{"name": "mine", "mountPath": "/run/tessera"}]
    assert decide(pod(mig)).outcome == "converted"


def test_the_reserved_paths_are_where_the_driver_mounts_the_claims_files() -> None:
    from tessera.driver import claim_files
    from tessera.webhook import reserved_paths

    assert reserved_paths.CLAIM_FOLDER == claim_files.CONTAINER_DIR
    assert reserved_paths.PRELOAD == claim_files.CONTAINER_PRELOAD
