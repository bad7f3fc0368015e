"""The pod index the exporter labels containers from: claims named directly or through templates,
containers that pick some of a pod's claims, and pods that finish or go."""

from __future__ import annotations

from typing import Any

from tessera.exporter.containers import ContainerIndex, ContainerRef, containers_by_claim, containers_by_id


def pod(
    name: str,
    claims: list[dict[str, str]],
    containers: dict[str, list[str]],
    statuses: dict[str, str] | None = None,
    phase: str = "Running",
    uid: str | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid or f"uid-{name}"},
        "spec": {
            "resourceClaims": claims,
            "containers": [
                {"name": c, "resources": {"claims": [{"name": n} for n in used]}}
                for c, used in containers.items()
            ],
        },
        "status": {
            "phase": phase,
            "resourceClaimStatuses": [
                {"name": k, "resourceClaimName": v} for k, v in (statuses or {}).items()
            ],
        },
    }


def test_a_template_claim_is_found_by_the_name_the_status_gives_it() -> None:
    p = pod(
        "p1", [{"name": "gpu", "resourceClaimTemplateName": "t"}], {"main": ["gpu"]}, {"gpu": "p1-gpu-x7k"}
    )
    assert containers_by_claim(p) == {("ns", "p1-gpu-x7k"): [ContainerRef("ns", "p1", "main")]}


def test_a_directly_named_claim_needs_no_status() -> None:
    p = pod("p1", [{"name": "gpu", "resourceClaimName": "shared"}], {"main": ["gpu"]})
    assert containers_by_claim(p) == {("ns", "shared"): [ContainerRef("ns", "p1", "main")]}


def test_only_containers_that_name_the_claim_use_it() -> None:
    p = pod(
        "p1",
        [{"name": "gpu", "resourceClaimName": "c1"}],
        {"a": ["gpu"], "sidecar": [], "b": ["gpu"]},
    )
    assert containers_by_claim(p) == {
        ("ns", "c1"): [ContainerRef("ns", "p1", "a"), ContainerRef("ns", "p1", "b")]
    }


def test_a_template_claim_not_generated_yet_and_finished_pods_have_no_containers() -> None:
    waiting = pod("p1", [{"name": "gpu", "resourceClaimTemplateName": "t"}], {"main": ["gpu"]})
    done = pod("p2", [{"name": "gpu", "resourceClaimName": "c1"}], {"main": ["gpu"]}, phase="Succeeded")
    assert containers_by_claim(waiting) == {}
    assert containers_by_claim(done) == {}


def test_the_index_follows_pods_added_changed_and_deleted_across_pods_sharing_a_claim() -> None:
    index = ContainerIndex(lambda **_: None, "node-a")
    one = pod("p1", [{"name": "g", "resourceClaimName": "shared"}], {"main": ["g"]})
    two = pod("p2", [{"name": "g", "resourceClaimName": "shared"}], {"main": ["g"]})
    index.on_event("SYNCED", {"items": [one]})
    assert index.synced.is_set()
    index.on_event("ADDED", two)
    assert index.containers("ns", "shared") == [
        ContainerRef("ns", "p1", "main"),
        ContainerRef("ns", "p2", "main"),
    ]
    index.on_event("MODIFIED", {**two, "status": {"phase": "Failed"}})
    assert index.containers("ns", "shared") == [ContainerRef("ns", "p1", "main")]
    index.on_event("DELETED", one)
    assert index.containers("ns", "shared") == []


def test_a_fresh_list_replaces_everything_the_index_knew() -> None:
    index = ContainerIndex(lambda **_: None, "node-a")
    index.on_event("ADDED", pod("p1", [{"name": "g", "resourceClaimName": "c1"}], {"main": ["g"]}))
    index.on_event("SYNCED", {"items": []})
    assert index.containers("ns", "c1") == []


def test_containers_are_found_by_pod_uid_and_the_runtime_id_the_kubelet_reports() -> None:
    """The status's ``containerd://<id>`` is what the container's cgroup path ends in; a container
    not started yet (no ID) has none, and the pod's going takes its IDs with it."""
    running = pod("p1", [{"name": "g", "resourceClaimName": "c1"}], {"main": ["g"], "side": []})
    running["status"]["initContainerStatuses"] = [{"name": "init", "containerID": "containerd://" + "a" * 64}]
    running["status"]["containerStatuses"] = [
        {"name": "main", "containerID": "containerd://" + "b" * 64},
        {"name": "side"},
    ]
    assert containers_by_id(running) == {
        ("uid-p1", "a" * 64): ContainerRef("ns", "p1", "init"),
        ("uid-p1", "b" * 64): ContainerRef("ns", "p1", "main"),
    }
    index = ContainerIndex(lambda **_: None, "node-a")
    index.on_event("SYNCED", {"items": [running]})
    assert index.container("uid-p1", "b" * 64) == ContainerRef("ns", "p1", "main")
    assert index.container("uid-p2", "b" * 64) is None  # the same ID under another pod is not it
    index.on_event("DELETED", running)
    assert index.container("uid-p1", "b" * 64) is None
