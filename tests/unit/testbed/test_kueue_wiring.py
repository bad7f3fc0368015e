"""How the test bed wires Kueue to a loopback cluster: its configuration, and the module's webhook
manifest rewritten to call 127.0.0.1 with the test bed's CA, keeping only what is switched on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.kueue import (
    MUTATING_CONFIGURATION,
    NAMESPACE,
    VALIDATING_CONFIGURATION,
    KueueOptions,
    kueue_configuration,
    loopback_webhooks,
)


def webhook(name: str, group: str, resource: str, path: str) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "rules": [
            {"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": [resource]}
        ],
    }


MANIFEST: list[dict[str, Any]] = [
    {
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            webhook("mjob.kb.io", "batch", "jobs", "/mutate-batch-v1-job"),
            webhook("mpod.kb.io", "", "pods", "/mutate--v1-pod"),
            webhook("mrayjob.kb.io", "ray.io", "rayjobs", "/mutate-ray-io-v1-rayjob"),
            webhook(
                "mworkload.kb.io", "kueue.x-k8s.io", "workloads", "/mutate-kueue-x-k8s-io-v1beta2-workload"
            ),
        ],
    },
    {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "x"}, "webhooks": []},
]


def test_webhooks_call_loopback_with_the_ca_and_only_switched_on_kinds_are_kept() -> None:
    mutating, validating = loopback_webhooks(MANIFEST, 9443, "Q0E=")
    assert mutating["metadata"]["name"] == MUTATING_CONFIGURATION
    assert validating["metadata"]["name"] == VALIDATING_CONFIGURATION
    names = [w["name"] for w in mutating["webhooks"]]
    assert names == ["mjob.kb.io", "mpod.kb.io", "mworkload.kb.io"], "no handler would answer for RayJobs"
    job = mutating["webhooks"][0]
    assert job["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate-batch-v1-job", "caBundle": "Q0E="}
    pods = mutating["webhooks"][1]
    excluded = pods["namespaceSelector"]["matchExpressions"][0]["values"]
    assert excluded == ["kube-system", NAMESPACE]
    assert MANIFEST[0]["webhooks"][0]["clientConfig"]["service"], "the module's manifest is not changed"


def test_the_configuration_is_loopback_only_and_takes_a_tests_gates_and_extras() -> None:
    options = KueueOptions(
        feature_gates={"DynamicResourceAllocation": True}, extra_config={"resources": {"x": 1}}
    )
    config = kueue_configuration(9443, Path("/certs"), 8080, 8081, options)
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": "/certs"}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["featureGates"] == {"VisibilityOnDemand": False, "DynamicResourceAllocation": True}
    assert config["integrations"]["frameworks"] == ["batch/job", "pod"]
    assert config["resources"] == {"x": 1}


def test_kueue_runs_with_the_concurrency_and_rate_limits_its_release_manifests_set() -> None:
    config = kueue_configuration(9443, Path("/certs"), 8080, 8081, KueueOptions())
    assert config["controller"]["groupKindConcurrency"]["Workload.kueue.x-k8s.io"] == 5
    assert config["clientConnection"] == {"qps": 50, "burst": 100}
    raised = KueueOptions(extra_config={"clientConnection": {"qps": 500, "burst": 1000}})
    assert kueue_configuration(9443, Path("/certs"), 8080, 8081, raised)["clientConnection"]["qps"] == 500
