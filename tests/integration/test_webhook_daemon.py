"""The ``tessera-webhook`` command as it runs in its pod: under the chart's RBAC, with a self-made CA
it writes into the configuration's caBundle, ready once its slice cache is synced, converting pods
the apiserver sends it, and leaving on SIGTERM with exit status 0."""

from __future__ import annotations

import base64
import contextlib
import http.client
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import api_client, raw_json
from testbed.cluster import LocalCluster
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.process import free_port
from testbed.webhook_command import loopback_webhook_command
from tests.integration.webhook_bed import (
    CONFIGURATION_FILE,
    configuration,
    remove_account,
    webhook_kubeconfig,
)

pytestmark = pytest.mark.integration


def status_of(port: int, path: str) -> int | None:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", path)
        return connection.getresponse().status
    except OSError:
        return None


@contextlib.contextmanager
def webhook_process(argv: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The command running with its output in ``log_path``; killed if still running afterwards. Once
    the block has passed, its log must hold no traceback."""
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert "Traceback" not in log_path.read_text()


def test_the_command_keeps_the_ca_bundle_converts_pods_and_exits_cleanly_on_sigterm(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    assert yaml.safe_load(CONFIGURATION_FILE.read_text())["webhooks"][0]["failurePolicy"] == "Fail"
    name = unique_name("tessera-webhook")
    port, metrics_port = free_port(), free_port()
    registration = client.AdmissionregistrationV1Api(kube)
    body = configuration(name, f"https://127.0.0.1:{port}/mutate", "tessera")
    registration.create_mutating_webhook_configuration(
        client.V1MutatingWebhookConfiguration.model_validate(body)
    )
    assert cluster.webhook_client_ca is not None
    command = loopback_webhook_command(
        webhook_kubeconfig(kube, cluster, name, tmp_path / "kubeconfig"),
        port,
        metrics_port,
        name,
        cluster.webhook_client_ca.pair.cert,
    )
    try:
        with webhook_process(command, tmp_path / "webhook.log") as process:
            poll_until(lambda: status_of(metrics_port, "/readyz") == 200, 60, "the webhook ready")
            assert status_of(metrics_port, "/healthz") == 200

            def bundle() -> str | None:
                read = raw_json(
                    registration.read_mutating_webhook_configuration(name, _preload_content=False)
                )
                value: str | None = read["webhooks"][0]["clientConfig"].get("caBundle")
                return value

            assert b"BEGIN CERTIFICATE" in base64.b64decode(poll_until(bundle, 60, "the caBundle written"))
            pod = {
                "metadata": {"name": "gpu"},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "x",
                            "resources": {"limits": {"nvidia.com/gpucores": "500"}},
                        }
                    ]
                },
            }

            def refused_by_webhook() -> str | None:
                try:
                    client.CoreV1Api(kube).create_namespaced_pod(
                        namespace, client.V1Pod.model_validate(pod), dry_run="All"
                    )
                except ApiException as error:
                    return str(error.body) if "nvidia.com/gpucores is 500" in str(error.body) else None
                return None

            message = poll_until(refused_by_webhook, 60, "the apiserver calling the command")
            assert (
                'container \\"main\\": nvidia.com/gpucores is 500; it must be between 1 and 100.' in message
            )
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0
    finally:
        registration.delete_mutating_webhook_configuration(name)
        remove_account(kube, name)


def test_a_command_started_while_the_api_server_is_away_waits_for_it_and_serves_once_it_is_back(
    tmp_path: Path,
) -> None:
    """The chart's way: the serving certificate in a Secret the replicas share. Started with the API
    server stopped (a replica restarted during an outage), the command waits for the server, saying
    so, instead of exiting into the kubelet's restart back-off (which kept both replicas down after
    the server came back, and GPU pods were refused: issue 37); once the server answers, the same
    process reads or makes its certificate and becomes ready."""
    with LocalCluster() as own:
        assert own.webhook_client_ca is not None
        kube = api_client(own.admin_kubeconfig)
        namespace = "tessera"
        client.CoreV1Api(kube).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
        )
        name = unique_name("tessera-webhook")
        port, metrics_port = free_port(), free_port()
        body = configuration(name, f"https://127.0.0.1:{port}/mutate", "tessera")
        client.AdmissionregistrationV1Api(kube).create_mutating_webhook_configuration(
            client.V1MutatingWebhookConfiguration.model_validate(body)
        )
        own.stop_api_server()
        command = loopback_webhook_command(
            own.admin_kubeconfig,
            port,
            metrics_port,
            name,
            own.webhook_client_ca.pair.cert,
            f"--namespace={namespace}",
            f"--tls-secret={name}-tls",
        )
        log_path = tmp_path / "webhook.log"
        try:
            with webhook_process(command, log_path) as process:
                poll_until(
                    lambda: "the API server does not answer" in log_path.read_text(), 60, "the wait said"
                )
                assert process.poll() is None, log_path.read_text()
                own.resume_api_server()
                poll_until(lambda: status_of(metrics_port, "/readyz") == 200, 120, "the same process ready")
                assert process.poll() is None
                process.send_signal(signal.SIGTERM)
                assert process.wait(60) == 0
        finally:
            kube.close()  # type: ignore[no-untyped-call]
