"""The HTTPS server with real sockets and TLS: routes, content types, dry-run, failures, metrics,
readiness and a shutdown that answers the review in flight."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiException

from tessera.webhook.fleet import Fleet
from tessera.webhook.server import WebhookApp, WebhookServer
from tessera.webhook.tls import SelfManagedCertificates
from tests.unit.webhook.webhook_samples import FLEET, container, pod, request


class FakeTemplates:
    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []
        self.failure: ApiException | None = None
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def ensure(self, template: dict[str, Any]) -> bool:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        if self.failure is not None:
            raise self.failure
        self.made.append(template)
        return True


class Running:
    def __init__(self) -> None:
        self.certificates = SelfManagedCertificates([], ["127.0.0.1"])
        self.templates = FakeTemplates()
        self.is_ready = False
        self.fleet = FLEET
        self.app = WebhookApp(lambda: self.fleet, self.templates, ready=lambda: self.is_ready)
        self.server = WebhookServer(self.app, self.certificates, "127.0.0.1", 0, metrics_port=0)
        self.server.start()
        self.client_context = ssl.create_default_context(cadata=self.certificates.ca_bundle().decode())

    def https(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.server.port, context=self.client_context, timeout=30
        )

    def post(self, body: Any, content_type: str = "application/json") -> tuple[int, bytes]:
        connection = self.https()
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        connection.request("POST", "/mutate", raw, {"Content-Type": content_type})
        response = connection.getresponse()
        return response.status, response.read()

    def review(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        status, body = self.post(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": request(obj, dry_run=dry_run),
            }
        )
        assert status == 200, body
        answer: dict[str, Any] = json.loads(body)
        return answer

    def get_plain(self, path: str) -> tuple[int, str]:
        assert self.server.metrics_port is not None
        connection = http.client.HTTPConnection("127.0.0.1", self.server.metrics_port, timeout=30)
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()


@pytest.fixture
def running() -> Iterator[Running]:
    server = Running()
    yield server
    server.server.stop()


GPU_POD = pod(container("main", {"nvidia.com/gpumem": 8000, "nvidia.com/gpucores": 30}))


def test_a_gpu_pod_is_answered_with_a_patch_after_its_template_is_made(running: Running) -> None:
    answer = running.review(GPU_POD)
    assert answer["response"]["allowed"] is True and answer["response"]["patchType"] == "JSONPatch"
    assert [t["metadata"]["namespace"] for t in running.templates.made] == ["team"]


def test_dry_run_gets_the_same_patch_and_creates_nothing(running: Running) -> None:
    answer = running.review(GPU_POD, dry_run=True)
    assert answer["response"]["patchType"] == "JSONPatch"
    assert running.templates.made == []


def test_a_failed_template_write_denies_the_pod_with_the_reason(running: Running) -> None:
    running.templates.failure = ApiException(status=403, reason="Forbidden")
    response = running.review(GPU_POD)["response"]
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 500,
        "message": "could not create the pod's ResourceClaimTemplate: 403 Forbidden.",
    }


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"{}", "text/plain", 415),
        (b"not json", "application/json", 400),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "x"}}', "application/json", 400),
        (b'{"apiVersion": "admission.k8s.io/v1", "request": {}}', "application/json", 400),
    ],
)
def test_bodies_that_are_not_v1_reviews_are_refused_at_the_http_level(
    running: Running, body: bytes, content_type: str, status: int
) -> None:
    assert running.post(body, content_type)[0] == status


def test_readiness_waits_for_the_slice_cache_and_health_does_not(running: Running) -> None:
    assert running.get_plain("/healthz") == (200, "ok")
    assert running.get_plain("/readyz")[0] == 503
    running.is_ready = True
    assert running.get_plain("/readyz") == (200, "ok")
    connection = running.https()
    connection.request("GET", "/readyz")
    assert connection.getresponse().status == 200


def test_metrics_count_reviews_by_outcome(running: Running) -> None:
    running.review(GPU_POD)
    running.review(pod(container("main", {"cpu": "1"})))
    running.review(pod(container("main", {"nvidia.com/gpucores": 500})))
    status, text = running.get_plain("/metrics")
    assert status == 200
    for outcome in ("converted", "untouched", "denied"):
        assert f'tessera_webhook_reviews_total{{outcome="{outcome}"}} 1.0' in text
    assert 'tessera_webhook_reviews_total{outcome="error"} 0.0' in text
    assert "tessera_webhook_review_seconds_count 3.0" in text
    assert "tessera_webhook_template_writes_total 1.0" in text
    assert "tessera_webhook_gpu_memory_sizes 2.0" in text


def test_the_plain_port_does_not_serve_mutate(running: Running) -> None:
    assert running.server.metrics_port is not None
    connection = http.client.HTTPConnection("127.0.0.1", running.server.metrics_port, timeout=30)
    connection.request("POST", "/mutate", b"{}", {"Content-Type": "application/json"})
    assert connection.getresponse().status == 404


def test_one_connection_carries_many_reviews(running: Running) -> None:
    connection = running.https()
    body = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request(GPU_POD)}
    )
    for _ in range(3):
        connection.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["response"]["allowed"]


def test_stop_answers_the_review_in_flight_before_returning() -> None:
    running = Running()
    running.templates.gate = threading.Event()
    answers: list[dict[str, Any]] = []
    poster = threading.Thread(target=lambda: answers.append(running.review(GPU_POD)))
    poster.start()
    assert running.templates.entered.wait(30)
    stopper = threading.Thread(target=running.server.stop)
    stopper.start()
    running.templates.gate.set()
    stopper.join(60)
    poster.join(60)
    assert not stopper.is_alive()
    assert answers[0]["response"]["allowed"] is True


def test_an_empty_fleet_denies_gpu_pods_and_leaves_others_alone(running: Running) -> None:
    running.fleet = Fleet()
    assert "no gpu.tessera.dev GPU is published" in running.review(GPU_POD)["response"]["status"]["message"]
    assert "patch" not in running.review(pod(container("main")))["response"]


def test_stop_closes_idle_kept_alive_connections_instead_of_waiting_out_their_timeout() -> None:
    """The idle timeout (180 s) outlasts the 60 s join below: stop returns only because it closes the
    idle connection itself, and the client sees it closed."""
    running = Running()
    connection = running.https()
    connection.request("GET", "/healthz")
    assert connection.getresponse().read() == b"ok"  # kept alive, now idle
    stopper = threading.Thread(target=running.server.stop)
    stopper.start()
    stopper.join(60)
    assert not stopper.is_alive()
    with pytest.raises((ConnectionError, http.client.HTTPException, ssl.SSLError, OSError)):
        connection.request("GET", "/healthz")
        connection.getresponse()
