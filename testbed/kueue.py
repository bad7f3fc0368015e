"""Kueue on a test-bed cluster: its CRDs, its webhooks on loopback, and the controller as a process.

Kueue is built from the Go module proxy (build-binaries.sh; v0.17.0, the one version served) with
its CRDs and webhook manifest copied from the same module into the cache. Here it is wired to one
LocalCluster the way a cluster install would be, minus in-cluster networking:

- the CRDs are created from the module's ``config/components/crd/bases``;
- the webhook configurations are the module's, with each Service reference replaced by
  ``https://127.0.0.1:<port><path>`` and the test bed's CA as ``caBundle``; the controller serves a
  certificate from the same CA with ``IP:127.0.0.1`` (internal certificate management is off);
- only the webhooks of what is switched on are kept (Kueue's own types, batch/v1 Jobs, plain Pods),
  since a ``failurePolicy: Fail`` webhook whose handler is not registered would refuse every object
  of its kind;
- Kueue v0.17 always reads its metrics certificate from ``/etc/kueue/metrics/certs``; the process runs
  in its own mount namespace with a tmpfs over ``/etc/kueue`` holding that certificate, so nothing is
  written on the host but the empty mount point.

LocalCluster(kueue=True) starts it after the scheduler and stops it with the rest.
"""

from __future__ import annotations

import base64
import copy
import logging
import os
import shutil
import socket
import ssl
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client

from tessera.kube import api_client, create_if_absent
from testbed.binaries import COMPONENTS, binary
from testbed.polling import poll_until
from testbed.process import ManagedProcess, free_port

if TYPE_CHECKING:
    from testbed.cluster import LocalCluster

log = logging.getLogger(__name__)

NAMESPACE = "kueue-system"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
MUTATING_CONFIGURATION = "kueue-mutating-webhook-configuration"
VALIDATING_CONFIGURATION = "kueue-validating-webhook-configuration"
_METRICS_CERT_DIR = "/etc/kueue"
_START_TIMEOUT = 180.0

# (API group, resource) pairs whose webhooks are kept: Kueue's own objects and the two integrations
# the test bed switches on.
_FRAMEWORKS = ("batch/job", "pod")
_KEPT = {(KUEUE_GROUP, None), ("batch", "jobs"), ("", "pods")}
_SYSTEM_NAMESPACES = {
    "matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}
    ]
}


@dataclass
class KueueOptions:
    """What a test may change: Kueue's feature gates (``{"DynamicResourceAllocation": True}``) and
    any further top-level configuration keys (``resources``, ``waitForPodsReady``...)."""

    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    extra_config: Mapping[str, Any] = field(default_factory=dict)


RELEASED_TUNING: Mapping[str, Any] = {
    "controller": {
        "groupKindConcurrency": {
            "Job.batch": 5,
            "Pod": 5,
            "Workload.kueue.x-k8s.io": 5,
            "LocalQueue.kueue.x-k8s.io": 1,
            "Cohort.kueue.x-k8s.io": 1,
            "ClusterQueue.kueue.x-k8s.io": 1,
            "ResourceFlavor.kueue.x-k8s.io": 1,
        }
    },
    "clientConnection": {"qps": 50, "burst": 100},
}
"""The reconcile concurrency and API client rate limits Kueue's release manifests start the manager
with (``config/components/manager/controller_manager_config.yaml`` of v0.17.0). Kueue's built-in
defaults are lower (one Workload reconcile at a time, 20 requests/s): a test bed without these would
measure a Kueue nobody installs. ``extra_config`` replaces either key whole."""


def manifests_dir() -> Path:
    return COMPONENTS["kueue"].directory / "manifests"


def kueue_configuration(
    webhook_port: int, cert_dir: Path, metrics_port: int, health_port: int, options: KueueOptions
) -> dict[str, Any]:
    """Kueue's Configuration object for one loopback install; pure."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "integrations": {"frameworks": list(_FRAMEWORKS)},
        # The visibility API server would need its own certificates; nothing here uses it.
        "featureGates": {"VisibilityOnDemand": False, **options.feature_gates},
        **copy.deepcopy(dict(RELEASED_TUNING)),
    }
    config.update(copy.deepcopy(dict(options.extra_config)))
    return config


def _kept(webhook: Mapping[str, Any]) -> bool:
    for rule in webhook.get("rules") or []:
        for group in rule.get("apiGroups") or []:
            if (group, None) in _KEPT:
                return True
            if any((group, resource) in _KEPT for resource in rule.get("resources") or []):
                return True
    return False


def loopback_webhooks(
    manifest: Sequence[Mapping[str, Any]], port: int, ca_bundle: str
) -> list[dict[str, Any]]:
    """The module's webhook configurations rewritten for loopback; pure (see the module docstring)."""
    names = {
        "MutatingWebhookConfiguration": MUTATING_CONFIGURATION,
        "ValidatingWebhookConfiguration": VALIDATING_CONFIGURATION,
    }
    out = []
    for document in manifest:
        configuration = copy.deepcopy(dict(document))
        configuration["metadata"] = {"name": names[configuration["kind"]]}
        webhooks = []
        for webhook in configuration.get("webhooks") or []:
            if not _kept(webhook):
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
            if any("pods" in (rule.get("resources") or []) for rule in webhook.get("rules") or []):
                webhook["namespaceSelector"] = _SYSTEM_NAMESPACES
            webhooks.append(webhook)
        configuration["webhooks"] = webhooks
        out.append(configuration)
    return out


class Kueue:
    """Kueue installed on and running against one LocalCluster."""

    def __init__(self, cluster: LocalCluster, options: KueueOptions | None = None) -> None:
        self.cluster = cluster
        self.options = options or KueueOptions()
        self.directory = cluster.state_dir / "kueue"
        self.process: ManagedProcess | None = None
        self.webhook_port = 0
        self.health_port = 0
        self.metrics_port = 0

    def start(self) -> ManagedProcess:
        """Install CRDs and webhooks, start the controller, and wait until it is ready and its
        webhooks answer; returns the process (the cluster stops it with its own)."""
        assert self.cluster.ca is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        cert_dir = self.directory / "webhook-certs"
        metrics_dir = self.directory / "metrics-certs"
        for folder, name in ((cert_dir, "kueue-webhook"), (metrics_dir, "kueue-metrics")):
            folder.mkdir(exist_ok=True)
            pair = self.cluster.ca.issue(
                name, common_name=name, ip_addresses=("127.0.0.1",), dns_names=("localhost",), server=True
            )
            shutil.copy(pair.cert, folder / "tls.crt")
            shutil.copy(pair.key, folder / "tls.key")
        self.webhook_port, self.health_port, self.metrics_port = free_port(), free_port(), free_port()
        config_path = self.directory / "config.yaml"
        config_path.write_text(
            yaml.safe_dump(
                kueue_configuration(
                    self.webhook_port, cert_dir, self.metrics_port, self.health_port, self.options
                )
            )
        )
        api = api_client(self.cluster.admin_kubeconfig)
        try:
            self._install_crds(api)
            create_if_absent(
                client.CoreV1Api(api).create_namespace,
                client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)),
            )
            self.process = self._spawn(config_path, metrics_dir)
            self.process.wait_until(self._ready, _START_TIMEOUT, "ready Kueue")
            self._install_webhooks(api)
        finally:
            api.close()  # type: ignore[no-untyped-call]
        return self.process

    # -- pieces ------------------------------------------------------------------------------

    def _install_crds(self, api: client.ApiClient) -> None:
        extensions = client.ApiextensionsV1Api(api)
        names = []
        for path in sorted((manifests_dir() / "crds").glob("*.yaml")):
            body = yaml.safe_load(path.read_text())
            names.append(body["metadata"]["name"])
            create_if_absent(extensions.create_custom_resource_definition, body)

        def established() -> bool:
            for name in names:
                crd = extensions.read_custom_resource_definition(name)
                conditions = (crd.status and crd.status.conditions) or []
                if not any(c.type == "Established" and c.status == "True" for c in conditions):
                    return False
            return True

        poll_until(established, 60, "Kueue CRDs established")

    def _install_webhooks(self, api: client.ApiClient) -> None:
        assert self.cluster.ca is not None
        ca_bundle = base64.b64encode(self.cluster.ca.pair.cert.read_bytes()).decode()
        manifest = [d for d in yaml.safe_load_all((manifests_dir() / "webhook.yaml").read_text()) if d]
        registration = client.AdmissionregistrationV1Api(api)
        for configuration in loopback_webhooks(manifest, self.webhook_port, ca_bundle):
            if configuration["kind"] == "MutatingWebhookConfiguration":
                create_if_absent(registration.create_mutating_webhook_configuration, configuration)
            else:
                create_if_absent(registration.create_validating_webhook_configuration, configuration)

    def _spawn(self, config_path: Path, metrics_dir: Path) -> ManagedProcess:
        """The controller in a private mount namespace whose /etc/kueue is a tmpfs with the metrics
        certificate in the one place v0.17 reads it."""
        if not os.path.isdir(_METRICS_CERT_DIR):
            if os.geteuid() != 0:
                raise RuntimeError(
                    f"Kueue v0.17 reads its metrics certificate from {_METRICS_CERT_DIR}/metrics/certs; "
                    f"create the empty folder {_METRICS_CERT_DIR} once as root"
                )
            os.makedirs(_METRICS_CERT_DIR, exist_ok=True)
        kueue = binary("kueue")
        script = (
            f"mount -t tmpfs -o size=1m,mode=0755 tmpfs {_METRICS_CERT_DIR}"
            f" && mkdir -p {_METRICS_CERT_DIR}/metrics/certs"
            f' && cp "$1"/tls.crt "$1"/tls.key {_METRICS_CERT_DIR}/metrics/certs/'
            ' && shift && exec "$@"'
        )
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare.insert(1, "--map-root-user")
        argv: list[str | Path] = [
            *unshare,
            "sh",
            "-c",
            script,
            "kueue-wrapper",
            metrics_dir,
            kueue,
            f"--config={config_path}",
            f"--kubeconfig={self.cluster.admin_kubeconfig}",
        ]
        process = ManagedProcess("kueue", argv, self.cluster.log_dir)
        self.cluster.processes.append(process)
        return process

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=5) as r:
            if r.status != 200:
                return False
        context = (
            ssl.create_default_context(cafile=str(self.cluster.ca.pair.cert)) if self.cluster.ca else None
        )
        with (
            socket.create_connection(("127.0.0.1", self.webhook_port), timeout=5) as raw,
            (context or ssl.create_default_context()).wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return True

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines) if self.process else "(not started)"
