"""A claim's ShareConfig (priority, enforcement) is read strictly from its allocation: every
malformation refuses the claim with one sentence, enforcement off only on whole GPUs, and priority 0
only in the namespaces an administrator granted it."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.driver.allocation import AllocationError, shares
from tessera.driver.share_config import ClaimSettings, ShareConfig, configs, settings
from tessera.names import DRIVER_NAME
from tessera.quantity import GiB
from tests.unit.driver.driver_samples import claim, result

DEVICES = ["gpu-a", "gpu-b"]
CAPACITY = {"gpu-a": 80 * GiB, "gpu-b": 80 * GiB}
GRANTED = frozenset({"ns"})
"""The namespace of driver_samples.claim, granted priority 0 unless a test says otherwise."""


def configured(*entries: dict[str, Any], results: tuple[dict[str, Any], ...] | None = None) -> dict[str, Any]:
    body = claim(*(results or (result("gpu-a", "20Gi", "30"),)))
    body["status"]["allocation"]["devices"]["config"] = list(entries)
    return body


def entry(
    requests: list[str] | None = None, driver: str = DRIVER_NAME, source: str = "FromClaim", **keys: Any
) -> dict[str, Any]:
    parameters = {"apiVersion": "gpu.tessera.dev/v1", "kind": "ShareConfig", **keys}
    out: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        out["requests"] = requests
    return out


def settle(body: dict[str, Any], granted: frozenset[str] = GRANTED) -> ClaimSettings:
    return settings(body, DRIVER_NAME, shares(body, DRIVER_NAME, "node-a", DEVICES), CAPACITY, granted)


def test_no_configuration_is_low_priority_and_enforced() -> None:
    assert settle(configured()) == ClaimSettings({"gpu-a": 1}, enforced=True)


def test_priority_applies_to_the_requests_it_names_or_to_all() -> None:
    body = configured(entry(["gpu"], priority=0))
    assert settle(body).priorities == {"gpu-a": 0}
    assert settle(configured(entry(priority=0))).priorities == {"gpu-a": 0}
    assert settle(configured(entry(["other"], priority=0))).priorities == {"gpu-a": 1}
    assert settle(configured(entry(["gpu/large"], priority=0))).priorities == {"gpu-a": 0}


def test_later_entries_override_earlier_keys_and_other_drivers_are_ignored() -> None:
    body = configured(
        entry(source="FromClass", priority=0, enforcement="on"),
        entry(priority=1),
        {"opaque": {"driver": "net.example.com", "parameters": {"anything": ["goes"]}}},
    )
    assert configs(body, DRIVER_NAME, ["gpu"]) == {"gpu": ShareConfig(priority=1, enforcement="on")}


@pytest.mark.parametrize("granted", [frozenset(), frozenset({"other", "ns-2"})], ids=["none", "others"])
def test_priority_0_outside_the_granted_namespaces_is_refused_naming_the_namespace_and_the_value(
    granted: frozenset[str],
) -> None:
    """A claim written by hand never passes the webhook: the daemon is the last line, and its
    sentence names the namespace and the chart value that grants priority 0."""
    with pytest.raises(AllocationError) as refused:
        settle(configured(entry(["gpu"], priority=0)), granted)
    assert str(refused.value) == (
        "ResourceClaim ns/c1: priority 0 (high), asked by request gpu, is granted only to namespaces "
        'an administrator lists in the chart value webhook.highPriorityNamespaces, and namespace "ns" '
        "is not listed"
    )


def test_outside_the_granted_namespaces_priority_1_prepares_and_an_overridden_0_is_not_asked() -> None:
    """Only the priority a request ends up with counts: 1 over a class's 0 is low, and allowed."""
    assert settle(configured(entry(priority=1)), frozenset()).priorities == {"gpu-a": 1}
    body = configured(entry(source="FromClass", priority=0), entry(priority=1))
    assert settle(body, frozenset()).priorities == {"gpu-a": 1}
    with pytest.raises(AllocationError, match="asked by request gpu"):
        settle(configured(entry(source="FromClass", priority=0)), frozenset())


def test_a_gpu_shared_by_two_requests_takes_the_higher_priority() -> None:
    results = (
        result("gpu-a", "1Gi", "10", request="a"),
        result("gpu-a", "1Gi", "10", share="s-2", request="b"),
    )
    body = configured(entry(["a"], priority=0), results=results)
    assert settle(body).priorities == {"gpu-a": 0}


@pytest.mark.parametrize(
    ("config", "sentence"),
    [
        (
            entry(priority=2),
            "ResourceClaim ns/c1: the ShareConfig in its configuration has priority 2; "
            "it must be 0 (high) or 1 (low)",
        ),
        (entry(priority=True), "has priority True; it must be 0"),
        (entry(priority="0"), "has priority '0'; it must be 0"),
        (entry(priority=0.0 + 0.5), "has priority 0.5"),
        (entry(enforcement="false"), 'has enforcement \'false\'; it must be "on" or "off"'),
        (entry(enforcement=None), "has enforcement None"),
        (entry(nice=1), "has unknown key 'nice' (it takes apiVersion, kind, priority, enforcement)"),
        (
            {
                "opaque": {
                    "driver": DRIVER_NAME,
                    "parameters": {"apiVersion": "gpu.tessera.dev/v2", "kind": "ShareConfig"},
                }
            },
            "its configuration for this driver must be apiVersion 'gpu.tessera.dev/v1', kind "
            "'ShareConfig', not 'gpu.tessera.dev/v2', 'ShareConfig'",
        ),
        (
            {
                "opaque": {
                    "driver": DRIVER_NAME,
                    "parameters": {"apiVersion": "gpu.tessera.dev/v1", "kind": "GpuConfig"},
                }
            },
            "kind 'ShareConfig', not 'gpu.tessera.dev/v1', 'GpuConfig'",
        ),
        (
            {"opaque": {"driver": DRIVER_NAME, "parameters": ["priority", 0]}},
            "the ShareConfig in its configuration is not an object",
        ),
        ({"opaque": {"driver": DRIVER_NAME}}, "is not an object"),
    ],
    ids=[
        "priority-2",
        "priority-bool",
        "priority-string",
        "priority-float",
        "enforcement-word",
        "enforcement-null",
        "unknown-key",
        "api-version",
        "kind",
        "not-object",
        "no-parameters",
    ],
)
def test_a_malformed_share_config_refuses_the_claim_in_one_sentence(
    config: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(AllocationError, match=r"^[^\n]*$") as refused:
        settle(configured(config))
    assert sentence in str(refused.value)


def test_more_configuration_entries_than_the_api_allows_are_refused() -> None:
    with pytest.raises(AllocationError, match="not a list of at most 32 entries"):
        settle(configured(*[entry(priority=1)] * 33))


def test_enforcement_off_on_whole_gpus_drops_the_shim() -> None:
    whole = (
        result("gpu-a", "80Gi", "100"),
        result("gpu-b", "40Gi", "60", share="s-2"),
        result("gpu-b", "40Gi", "40", share="s-3"),
    )
    assert settle(configured(entry(enforcement="off"), results=whole)).enforced is False


@pytest.mark.parametrize(
    ("results", "sentence"),
    [
        ((result("gpu-a", "40Gi", "100"),), "holds 40960 MiB of 81920 MiB and 100 of 100 cores of gpu-a"),
        ((result("gpu-a", "80Gi", "99"),), "holds 81920 MiB of 81920 MiB and 99 of 100 cores of gpu-a"),
        ((result("gpu-a", "80Gi", "100"), result("gpu-b", "1Gi", "100", share="s-2")), "of gpu-b"),
    ],
    ids=["half-memory", "99-cores", "second-gpu-partial"],
)
def test_enforcement_off_on_a_partial_share_is_refused(
    results: tuple[dict[str, Any], ...], sentence: str
) -> None:
    with pytest.raises(AllocationError) as refused:
        settle(configured(entry(enforcement="off"), results=results))
    message = str(refused.value)
    assert message.startswith(
        "ResourceClaim ns/c1 asks for enforcement off (request gpu), which is allowed only on a whole GPU"
    )
    assert sentence in message


def test_enforcement_off_for_one_request_needs_every_gpu_of_the_claim_whole() -> None:
    """All the claim's containers get one spec: a partial share in another request would run
    unenforced too."""
    results = (
        result("gpu-a", "80Gi", "100", request="a"),
        result("gpu-b", "1Gi", "10", share="s-2", request="b"),
    )
    with pytest.raises(AllocationError, match="of gpu-b"):
        settle(configured(entry(["a"], enforcement="off"), results=results))
