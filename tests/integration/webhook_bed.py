"""The webhook as the integration, e2e and benchmark code run it: in this process on 127.0.0.1, with
a self-made CA, registered with the real apiserver from the chart's configuration file."""

from __future__ import annotations

import contextlib
import copy
import datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import ApiException

from tessera.testbed.names import unique_name
from tessera.testbed.polling import poll_until
from tessera.webhook.server import WebhookApp, WebhookServer
from tessera.webhook.slices import SliceCache
from tessera.webhook.templates import TemplateStore
from tessera.webhook.tls import SelfManagedCertificates, keep_ca_bundle

CONFIGURATION_FILE = Path(__file__).resolve().parents[2] / "charts/tessera/files/webhook-configuration.yaml"


def configuration(name: str, url: str, release_namespace: str) -> dict[str, Any]:
    """The chart's configuration with its name, a URL client config and the release namespace set."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(CONFIGURATION_FILE.read_text()))
    body["metadata"]["name"] = name
    for webhook in body["webhooks"]:
        webhook["clientConfig"] = {"url": url}
        for expression in webhook["namespaceSelector"]["matchExpressions"]:
            expression["values"] = ["kube-system", release_namespace]
    return body


class RunningWebhook:
    """Server, slice cache and template store, plus the registered configuration; ``stop`` undoes all."""

    def __init__(
        self,
        kube: client.ApiClient,
        release_namespace: str = "tessera",
        ca_lifetime: datetime.timedelta = datetime.timedelta(days=365),
        serving_lifetime: datetime.timedelta = datetime.timedelta(days=30),
    ) -> None:
        self.kube = kube
        self.cache = SliceCache(kube)
        self.cache.start()
        self.certificates = SelfManagedCertificates([], ["127.0.0.1"], ca_lifetime, serving_lifetime)
        self.app = WebhookApp(lambda: self.cache.fleet, TemplateStore(kube), ready=self.cache.synced.is_set)
        self.server = WebhookServer(self.app, self.certificates, "127.0.0.1", 0, metrics_port=0)
        self.server.start()
        self.name = unique_name("tessera-webhook")
        self.url = f"https://127.0.0.1:{self.server.port}/mutate"
        registration = client.AdmissionregistrationV1Api(kube)
        registration.create_mutating_webhook_configuration(
            client.V1MutatingWebhookConfiguration.model_validate(
                configuration(self.name, self.url, release_namespace)
            )
        )
        keep_ca_bundle(kube, self.name, self.certificates.ca_bundle())
        poll_until(self.cache.synced.is_set, 30, "slice cache synced")

    def reviews(self, outcome: str) -> float:
        value = self.app.metrics.registry.get_sample_value(
            "tessera_webhook_reviews_total", {"outcome": outcome}
        )
        return value or 0.0

    def wait_effective(self, namespace: str) -> None:
        """Wait until the apiserver calls us: its webhook configuration is loaded asynchronously."""
        core = client.CoreV1Api(self.kube)
        probe = {
            "metadata": {"name": "probe"},
            "spec": {
                "containers": [
                    {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpucores": "101"}}}
                ]
            },
        }

        def denied() -> bool:
            try:
                core.create_namespaced_pod(namespace, client.V1Pod.model_validate(probe), dry_run="All")
            except ApiException as error:
                return "nvidia.com/gpucores is 101" in str(error.body)
            return False

        poll_until(denied, 60, "the apiserver calling the webhook")

    def stop(self) -> None:
        with contextlib.suppress(ApiException):
            client.AdmissionregistrationV1Api(self.kube).delete_mutating_webhook_configuration(self.name)
        self.server.stop()
        self.cache.stop()
