"""The Active condition is written only when it would change."""

from __future__ import annotations

from typing import Any

from tessera.admissioncheck.checks import desired_condition, needs_write, sync_active


def check(controller: str, conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "generation": 1},
        "spec": {"controllerName": controller},
        "status": {"conditions": conditions or []},
    }


class RecordingApi:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def patch_cluster_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(args)


def test_a_check_that_already_says_active_is_not_written_again() -> None:
    desired = desired_condition("tessera.dev/gpu-fit")
    assert not needs_write(check("tessera.dev/gpu-fit", [dict(desired, lastTransitionTime="x")]), desired)
    assert needs_write(check("tessera.dev/gpu-fit"), desired)
    assert needs_write(check("tessera.dev/gpu-fit", [dict(desired, status="False")]), desired)


def test_only_our_checks_are_marked_and_only_when_needed() -> None:
    desired = desired_condition("tessera.dev/gpu-fit")
    api = RecordingApi()
    checks = {
        "ours-new": check("tessera.dev/gpu-fit"),
        "ours-done": check("tessera.dev/gpu-fit", [desired]),
        "theirs": check("kueue.x-k8s.io/provisioning-request"),
    }
    assert sync_active(api, checks, "tessera.dev/gpu-fit", "test") == 1  # type: ignore[arg-type]
    assert [call[3] for call in api.calls] == ["ours-new"]
