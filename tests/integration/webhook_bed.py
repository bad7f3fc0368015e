"""The webhook as the integration, e2e and benchmark code run it: in this process on 127.0.0.1, with
a self-made CA, registered with the real apiserver from the chart's configuration file, answering
only the API server's client certificate (the test bed's apiserver presents one, testbed/cluster.py)."""

from __future__ import annotations

import contextlib
import copy
import datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import ApiException

from tessera.webhook.admission import DEFAULT_POLICY, AdmissionPolicy
from tessera.webhook.authentication import DEFAULT_CLIENT_NAME, ClientPolicy
from tessera.webhook.server import WebhookApp, WebhookServer
from tessera.webhook.slices import SliceCache
from tessera.webhook.templates import TemplateStore
from tessera.webhook.tls import SelfManagedCertificates, keep_ca_bundle
from testbed.accounts import service_account_token, token_kubeconfig
from testbed.cluster import LocalCluster
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.webhook_effect import wait_until_webhook_answers

CHART_FILES = Path(__file__).resolve().parents[2] / "charts/tessera/files"
CONFIGURATION_FILE = CHART_FILES / "webhook-configuration.yaml"
RULES_FILE = CHART_FILES / "webhook-rules.yaml"
SECRET_RULES_FILE = CHART_FILES / "webhook-secret-rules.yaml"


def webhook_token(kube: client.ApiClient, configuration_name: str, secret: str | None = None) -> str:
    """A token of a service account bound to exactly the chart's webhook rules (with
    ``resourceNames`` set to this configuration's name), as the webhook's pod would have; with
    ``secret``, also the chart's rules on a Secret it keeps itself (granted cluster-wide here, where
    the chart grants them in the release namespace only)."""
    rules = yaml.safe_load(RULES_FILE.read_text())
    for rule in rules:
        if "resourceNames" in rule:
            rule["resourceNames"] = [configuration_name]
    if secret is not None:
        for rule in yaml.safe_load(SECRET_RULES_FILE.read_text()):
            if "resourceNames" in rule:
                rule["resourceNames"] = [secret]
            rules.append(rule)
    return service_account_token(kube, "tessera", configuration_name, rules, expiration_seconds=3600)


def webhook_api_client(
    kube: client.ApiClient, cluster: LocalCluster, configuration_name: str, secret: str | None = None
) -> client.ApiClient:
    """An API client with the webhook's least-privilege token (``webhook_token``)."""
    assert cluster.ca is not None
    configuration = client.Configuration()
    configuration.host = cluster.server
    configuration.ssl_ca_cert = str(cluster.ca.pair.cert)
    configuration.api_key = {"authorization": f"Bearer {webhook_token(kube, configuration_name, secret)}"}
    return client.ApiClient(configuration)


def webhook_kubeconfig(
    kube: client.ApiClient,
    cluster: LocalCluster,
    configuration_name: str,
    path: Path,
    secret: str | None = None,
) -> Path:
    """The same credentials as a kubeconfig file, for the ``tessera-webhook`` command."""
    return token_kubeconfig(cluster, webhook_token(kube, configuration_name, secret), "webhook", path)


def remove_account(kube: client.ApiClient, name: str) -> None:
    rbac = client.RbacAuthorizationV1Api(kube)
    with contextlib.suppress(ApiException):
        rbac.delete_cluster_role_binding(name)
    with contextlib.suppress(ApiException):
        rbac.delete_cluster_role(name)
    with contextlib.suppress(ApiException):
        client.CoreV1Api(kube).delete_namespaced_service_account(name, "tessera")


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
    """Server, slice cache and template store, plus the registered configuration; ``stop`` undoes all.
    ``policy`` is what the chart's webhook.highPriorityNamespaces and webhook.seccomp would give it
    (their defaults unless told)."""

    def __init__(
        self,
        kube: client.ApiClient,
        cluster: LocalCluster,
        release_namespace: str = "tessera",
        ca_lifetime: datetime.timedelta = datetime.timedelta(days=365),
        serving_lifetime: datetime.timedelta = datetime.timedelta(days=30),
        policy: AdmissionPolicy = DEFAULT_POLICY,
    ) -> None:
        self.kube = kube
        self.name = unique_name("tessera-webhook")
        self.api = webhook_api_client(kube, cluster, self.name)  # the webhook's own, least-privilege client
        self.cache = SliceCache(self.api)
        self.cache.start()
        assert cluster.webhook_client_ca is not None
        # Only the API server may post reviews: it presents the test bed's webhook client certificate.
        self.certificates = SelfManagedCertificates(
            [], ["127.0.0.1"], ca_lifetime, serving_lifetime, client_ca=cluster.webhook_client_ca.pair.cert
        )
        self.templates = TemplateStore(self.api)
        self.templates.start()
        self.app = WebhookApp(lambda: self.cache.fleet, self.templates, self.cache.synced.is_set, policy)
        self.server = WebhookServer(
            self.app,
            self.certificates,
            "127.0.0.1",
            0,
            metrics_port=0,
            clients=ClientPolicy(frozenset({DEFAULT_CLIENT_NAME})),
        )
        self.server.start()
        self.url = f"https://127.0.0.1:{self.server.port}/mutate"
        registration = client.AdmissionregistrationV1Api(kube)
        registration.create_mutating_webhook_configuration(
            client.V1MutatingWebhookConfiguration.model_validate(
                configuration(self.name, self.url, release_namespace)
            )
        )
        keep_ca_bundle(self.api, self.name, self.certificates.ca_bundle())
        poll_until(self.cache.synced.is_set, 30, "slice cache synced")

    def reviews(self, outcome: str) -> float:
        value = self.app.metrics.registry.get_sample_value(
            "tessera_webhook_reviews_total", {"outcome": outcome}
        )
        return value or 0.0

    def wait_effective(self, namespace: str) -> None:
        """Wait until the apiserver calls us: its webhook configuration is loaded asynchronously."""
        wait_until_webhook_answers(self.kube, namespace)

    def stop(self) -> None:
        with contextlib.suppress(ApiException):
            client.AdmissionregistrationV1Api(self.kube).delete_mutating_webhook_configuration(self.name)
        self.server.stop()
        self.templates.stop()
        self.cache.stop()
        remove_account(self.kube, self.name)
