"""Two ``tessera-webhook`` processes sharing their certificate through one Secret (webhook.tls.source
secret, the chart's default), reached by the real API server through a loopback balancer as it would
reach two pods through their Service: both serve the Secret's certificate, a rotation forced by a
short lifetime keeps every call trusted by the caBundle, and one replica stopped (as a deleted pod
is, by SIGTERM) refuses no pod.

"Refused" here is what failurePolicy Fail makes of a webhook the API server cannot call or does not
trust: the create fails with ``failed calling webhook``. Every pod is a dry-run GPU pod the webhook
converts, so each create is one real call through the balancer.
"""

from __future__ import annotations

import base64
import datetime
import signal
import socket
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import raw_json
from tessera.webhook.client_ca import ClientCaSecret
from testbed.balancer import Balancer
from testbed.cluster import LocalCluster
from testbed.dra_objects import shareable_gpu_slice
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.process import free_port
from testbed.webhook_command import loopback_webhook_command
from tests.integration.test_webhook_daemon import status_of
from tests.integration.webhook_bed import (
    configuration,
    remove_account,
    webhook_api_client,
    webhook_kubeconfig,
)

pytestmark = pytest.mark.integration

NAMESPACE = "tessera"
LIFETIME = 40.0
"""Seconds each certificate lives: rotation starts at half of it, so one runs within the test."""
SETTLE = 3.0
CHECK_INTERVAL = 0.5


class Replicas:
    """Two replicas behind a balancer; each serves HTTPS, metrics and probes on ports of its own. The
    certificate lives ``lifetime`` seconds (rotating within a test by default)."""

    def __init__(
        self, cluster: LocalCluster, kube: client.ApiClient, folder: Path, lifetime: float = LIFETIME
    ) -> None:
        self.kube = kube
        self.name = unique_name("tessera-webhook")
        self.secret = f"{self.name}-shared-tls"
        self.ports = [free_port(), free_port()]
        self.metrics_ports = [free_port(), free_port()]
        self.probe_ports = [free_port(), free_port()]
        self.balancer = Balancer(self.ports).start()
        body = configuration(self.name, f"https://127.0.0.1:{self.balancer.port}/mutate", NAMESPACE)
        client.AdmissionregistrationV1Api(kube).create_mutating_webhook_configuration(
            client.V1MutatingWebhookConfiguration.model_validate(body)
        )
        kubeconfig = webhook_kubeconfig(kube, cluster, self.name, folder / "kubeconfig", secret=self.secret)
        assert cluster.webhook_client_ca is not None
        self.logs = [folder / f"webhook-{index}.log" for index in range(2)]
        self.processes = [
            subprocess.Popen(
                loopback_webhook_command(
                    kubeconfig,
                    port,
                    metrics_port,
                    self.name,
                    cluster.webhook_client_ca.pair.cert,
                    f"--tls-secret={self.secret}",
                    f"--namespace={NAMESPACE}",
                    f"--certificate-lifetime={lifetime}",
                    "--renew-fraction=0.5",
                    f"--rotation-settle={SETTLE}",
                    f"--certificate-check-interval={CHECK_INTERVAL}",
                    f"--probe-port={probe_port}",
                ),
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
            )
            for port, metrics_port, probe_port, log in zip(
                self.ports, self.metrics_ports, self.probe_ports, self.logs, strict=True
            )
        ]

    def served(self, port: int) -> x509.Certificate:
        """The certificate the process on ``port`` presents (no client certificate: TLS 1.3 lets the
        client finish its side of the handshake, and the server's refusal comes after)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der)

    def stored(self) -> dict[str, bytes]:
        body = raw_json(
            client.CoreV1Api(self.kube).read_namespaced_secret(self.secret, NAMESPACE, _preload_content=False)
        )
        return {key: base64.b64decode(value) for key, value in body["data"].items()}

    def bundle(self) -> list[x509.Certificate]:
        body = raw_json(
            client.AdmissionregistrationV1Api(self.kube).read_mutating_webhook_configuration(
                self.name, _preload_content=False
            )
        )
        pem = base64.b64decode(body["webhooks"][0]["clientConfig"].get("caBundle") or "")
        return x509.load_pem_x509_certificates(pem) if pem else []

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        self.balancer.stop()
        client.AdmissionregistrationV1Api(self.kube).delete_mutating_webhook_configuration(self.name)
        with_suppressed_404(
            lambda: client.CoreV1Api(self.kube).delete_namespaced_secret(self.secret, NAMESPACE)
        )
        remove_account(self.kube, self.name)


def with_suppressed_404(call: Callable[[], object]) -> None:
    try:
        call()
    except ApiException as error:
        if error.status != 404:
            raise


@pytest.fixture
def published_gpu(kube: client.ApiClient) -> Iterator[None]:
    """One GPU in a ResourceSlice, so the webhook converts GPU pods rather than deny them."""
    name = unique_name("replicas-gpu")
    resource = client.ResourceV1Api(kube)
    resource.create_resource_slice(shareable_gpu_slice(name, name))
    yield
    resource.delete_resource_slice(name)


@pytest.fixture
def replicas(
    cluster: LocalCluster, kube: client.ApiClient, tmp_path: Path, published_gpu: None
) -> Iterator[Replicas]:
    made = Replicas(cluster, kube, tmp_path)
    try:
        poll_until(
            lambda: all(status_of(port, "/readyz") == 200 for port in made.probe_ports),
            60,
            "both replicas ready",
        )
        yield made
    finally:
        made.stop()
    for log in made.logs:
        assert "Traceback" not in log.read_text(), log.read_text()


GPU_POD = {
    "metadata": {"name": "gpu"},
    "spec": {
        "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpumem": "2000"}}}]
    },
}


def admitted(kube: client.ApiClient, namespace: str) -> str | None:
    """None when the webhook converted a dry-run GPU pod; else the API server's refusal."""
    try:
        answer = raw_json(
            client.CoreV1Api(kube).create_namespaced_pod(
                namespace, client.V1Pod.model_validate(GPU_POD), dry_run="All", _preload_content=False
            )
        )
    except ApiException as error:
        return str(error.body)
    return None if answer["spec"].get("resourceClaims") else f"not converted: {answer['spec']}"


def test_both_replicas_serve_the_secrets_certificate_through_a_rotation_and_one_stopping(
    replicas: Replicas, kube: client.ApiClient, namespace: str
) -> None:
    def calling() -> bool:
        refusal = admitted(kube, namespace)
        assert refusal is None, refusal
        return True

    poll_until(calling, 60, "the apiserver calling the replicas")
    stored = replicas.stored()
    first = x509.load_pem_x509_certificate(stored["tls.crt"])
    assert replicas.served(replicas.ports[0]) == replicas.served(replicas.ports[1])
    [first_ca] = x509.load_pem_x509_certificates(stored["ca.crt"])
    first.verify_directly_issued_by(first_ca)

    # Pods created in a loop while the Secret rotates: through ADD_CA, SWITCH and DROP_CA.
    refusals: list[str] = []
    seen_bundles: set[int] = set()

    def rotated() -> bool:
        refusal = admitted(kube, namespace)
        if refusal is not None:
            refusals.append(refusal)
        seen_bundles.add(len(replicas.bundle()))
        now = replicas.stored()
        served = x509.load_pem_x509_certificate(now["tls.crt"])
        return served != first and len(x509.load_pem_x509_certificates(now["ca.crt"])) == 1

    poll_until(rotated, 120, "a rotation to a new CA, the old one dropped")
    assert refusals == []
    assert seen_bundles >= {1, 2}  # the bundle held both CAs on the way
    second = x509.load_pem_x509_certificate(replicas.stored()["tls.crt"])
    # The replica that dropped the old CA from the Secret writes the caBundle just after (a bundle
    # that still holds both trusts as much as the Secret): wait for it rather than race it.
    [new_ca] = poll_until(
        lambda: bundle if len(bundle := replicas.bundle()) == 1 else None, 30, "the caBundle down to one CA"
    )
    assert new_ca != first_ca
    second.verify_directly_issued_by(new_ca)
    poll_until(
        lambda: {replicas.served(port) for port in replicas.ports} == {second}, 30, "both serving the new one"
    )
    assert all(count > 0 for count in replicas.balancer.forwarded.values()), replicas.balancer.forwarded

    # One replica stopped as a deleted pod is, pods still created in a loop.
    stopped = replicas.processes[0]
    stopped.send_signal(signal.SIGTERM)
    before = dict(replicas.balancer.forwarded)
    for _ in range(40):
        refusal = admitted(kube, namespace)
        assert refusal is None, refusal
    assert stopped.wait(30) == 0
    assert replicas.balancer.forwarded[replicas.ports[1]] > before[replicas.ports[1]]


def test_the_client_ca_secret_is_made_once_and_every_replica_trusts_its_ca(
    cluster: LocalCluster, kube: client.ApiClient, tmp_path: Path
) -> None:
    """webhook.clientAuth without a CA: the first replica makes the Secret under the chart's rules,
    the next finds it and makes none, so every replica trusts the same CA."""
    name = unique_name("tessera-webhook")
    secret = f"{name}-apiserver-client"
    api = webhook_api_client(kube, cluster, name, secret=secret)
    lifetime = datetime.timedelta(days=1)
    try:
        replicas = [
            ClientCaSecret(
                api, NAMESPACE, secret, "kube-apiserver-webhook-client", lifetime, tmp_path / f"{i}/ca.crt"
            )
            for i in range(2)
        ]
        for replica in replicas:
            replica.sync()
        made = {
            key: base64.b64decode(value)
            for key, value in raw_json(
                client.CoreV1Api(kube).read_namespaced_secret(secret, NAMESPACE, _preload_content=False)
            )["data"].items()
        }
        assert set(made) == {"ca.crt", "tls.crt", "tls.key"}
        assert [r.file.read_bytes() for r in replicas] == [made["ca.crt"], made["ca.crt"]]
        x509.load_pem_x509_certificate(made["tls.crt"]).verify_directly_issued_by(
            x509.load_pem_x509_certificate(made["ca.crt"])
        )
    finally:
        with_suppressed_404(lambda: client.CoreV1Api(kube).delete_namespaced_secret(secret, NAMESPACE))
        remove_account(kube, name)
