"""The HTTPS server with real sockets and TLS: routes, content types, dry-run, failures, metrics,
readiness, a shutdown that answers the review in flight, and what it does with hostile callers:
no client certificate or a wrong one, huge or unannounced bodies, slow connections by the hundred,
malformed reviews. Every server here requires the API server's client certificate, as installed."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client import ApiException
from urllib3.exceptions import ProtocolError

from tessera.gpu_request import Refusal
from tessera.webhook import server as server_module
from tessera.webhook.authentication import DEFAULT_CLIENT_NAME, ClientPolicy
from tessera.webhook.fleet import Fleet
from tessera.webhook.server import MAX_BODY, WORKERS, WebhookApp, WebhookServer
from tessera.webhook.tls import SelfManagedCertificates
from testbed.pki import CertificateAuthority, KeyPair
from testbed.polling import poll_until
from testbed.process import connection_from
from tests.unit.webhook.webhook_samples import FLEET, container, pod, request
from tests.webhook_clients import answer_of, client_context, handshake_refused, tls_socket


class FakeTemplates:
    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []
        self.failure: Exception | None = None
        self.refusal: Refusal | None = None
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.waiting: list[dict[str, Any]] = []
        """Every call so far, appended on entry (before the gate)."""

    def ensure(self, template: dict[str, Any]) -> bool:
        self.waiting.append(template)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        if self.failure is not None:
            raise self.failure
        if self.refusal is not None:
            raise self.refusal
        self.made.append(template)
        return True


class Running:
    """A server that requires a client certificate of ``DEFAULT_CLIENT_NAME`` from ``client_ca``;
    ``https()`` connects with one, ``https(None)`` with none."""

    def __init__(self, folder: Path) -> None:
        self.client_ca = CertificateAuthority(folder / "client-ca", common_name="apiserver-client-ca")
        self.apiserver = self.client_ca.issue("apiserver", common_name=DEFAULT_CLIENT_NAME, client=True)
        self.certificates = SelfManagedCertificates([], ["127.0.0.1"], client_ca=self.client_ca.pair.cert)
        self.templates = FakeTemplates()
        self.is_ready = False
        self.fleet = FLEET
        self.app = WebhookApp(lambda: self.fleet, self.templates, ready=lambda: self.is_ready)
        self.server = WebhookServer(
            self.app,
            self.certificates,
            "127.0.0.1",
            0,
            metrics_port=0,
            clients=ClientPolicy(frozenset({DEFAULT_CLIENT_NAME})),
            probe_port=0,
        )
        self.server.start()

    def https(self, client: KeyPair | str | None = "apiserver") -> http.client.HTTPSConnection:
        pair = self.apiserver if client == "apiserver" else client
        assert not isinstance(pair, str)
        return http.client.HTTPSConnection(
            "127.0.0.1", self.server.port, context=client_context(self.certificates, pair), timeout=30
        )

    def post(
        self, body: Any, content_type: str = "application/json", client: KeyPair | str | None = "apiserver"
    ) -> tuple[int, bytes]:
        connection = self.https(client)
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

    def get_plain(self, path: str, port: int | None = None) -> tuple[int, str]:
        """GET on the metrics port, or on ``port``."""
        port = port if port is not None else self.server.metrics_port
        assert port is not None
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    server = Running(tmp_path)
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


def test_a_template_write_that_got_no_answer_denies_the_pod_with_a_sentence_not_an_internal_error(
    running: Running,
) -> None:
    running.templates.failure = ProtocolError("Connection aborted.", ConnectionResetError(104, "reset"))
    response = running.review(GPU_POD)["response"]
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 500,
        "message": "could not create the pod's ResourceClaimTemplate: the API server did not answer"
        " (ProtocolError); create the pod again.",
    }


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
    assert running.get_plain("/healthz") == (200, "ok\n")
    assert running.get_plain("/readyz")[0] == 503
    running.is_ready = True
    assert running.get_plain("/readyz") == (200, "ok\n")
    assert running.get_plain("/readyz", running.server.probe_port) == (200, "ok\n")
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


def test_metrics_count_connections_not_requests(running: Running) -> None:
    """Three reviews on one kept-alive connection and one on a second: two connections, so the
    counter tells a client that reuses its connections from one that pays a handshake per review."""
    body = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request(GPU_POD)}
    ).encode()
    kept = running.https()
    for _ in range(3):
        kept.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        assert kept.getresponse().read()
    assert running.post(body)[0] == 200
    assert "tessera_webhook_connections_total 2.0" in running.get_plain("/metrics")[1]


def test_the_probe_port_answers_the_probes_alone(running: Running) -> None:
    probes = running.server.probe_port
    assert running.get_plain("/healthz", probes) == (200, "ok\n")
    assert running.get_plain("/readyz", probes) == (503, "slice cache not synced, or shutting down\n")
    assert running.get_plain("/metrics", probes)[0] == 404


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


def test_stop_answers_the_review_in_flight_before_returning(tmp_path: Path) -> None:
    running = Running(tmp_path)
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


def test_a_draining_server_is_not_ready_but_answers_new_and_kept_alive_connections_with_close(
    running: Running,
) -> None:
    """SIGTERM's first phase: the pod must leave its Service's endpoints (readiness fails) while it
    still answers whoever comes - on a kept-alive connection or a new one - each answer telling the
    client to close that connection, so none is closed under a POST the client is sending."""
    running.is_ready = True
    kept = running.https()
    kept.request("GET", "/healthz")
    assert kept.getresponse().read() == b"ok\n"  # kept alive, now idle
    drainer = threading.Thread(target=running.server.drain, args=(3600.0,), daemon=True)
    drainer.start()
    poll_until(lambda: running.get_plain("/readyz")[0] == 503, 30, "not ready while draining")
    body = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request(GPU_POD)}
    )
    for connection in (kept, running.https()):
        connection.request("POST", "/mutate", body.encode(), {"Content-Type": "application/json"})
        answer = connection.getresponse()
        assert answer.status == 200
        assert json.loads(answer.read())["response"]["allowed"] is True
        assert answer.getheader("Connection") == "close"
    assert running.get_plain("/healthz") == (200, "ok\n")


class Drain:
    """``server.drain(...)`` in a thread, keeping what it returned."""

    def __init__(self, running: Running, seconds: float, quiet: float, longest: float) -> None:
        self.last: list[float | None] = []
        self.thread = threading.Thread(
            target=lambda: self.last.append(running.server.drain(seconds, quiet, longest)), daemon=True
        )
        self.thread.start()


def test_the_drain_outlasts_its_delay_while_the_api_server_keeps_calling_and_ends_once_it_stops(
    running: Running,
) -> None:
    """The endpoint's removal reaches the API server late on a loaded cluster: as long as reviews
    keep coming the replica keeps serving them, and it stops once they have stopped for the quiet
    period, saying when the last one came."""
    drain = Drain(running, seconds=0.2, quiet=1.0, longest=60.0)
    kept = running.https()
    for _ in range(30):  # 3 s of reviews, fifteen times the delay
        assert drain.thread.is_alive()
        kept.request("POST", "/mutate", review_body(GPU_POD), {"Content-Type": "application/json"})
        answer = kept.getresponse()
        assert answer.status == 200 and answer.getheader("Connection") == "close"
        answer.read()
        kept = running.https()
        threading.Event().wait(0.1)
    drain.thread.join(30)
    assert not drain.thread.is_alive()
    [last] = drain.last
    assert last is not None and last > 0.2  # the last review came well after the delay, and was served


def test_the_drain_ends_at_its_longest_however_much_still_calls(running: Running) -> None:
    drain = Drain(running, seconds=0.1, quiet=60.0, longest=0.5)
    served = 0
    while drain.thread.is_alive() and served < 600:
        assert running.review(GPU_POD)["response"]["allowed"] is True
        served += 1
    assert not drain.thread.is_alive(), "still draining after 600 reviews"
    assert drain.last != [None]


def test_a_drain_no_request_reaches_ends_after_its_delay_and_says_so(running: Running) -> None:
    drain = Drain(running, seconds=0.2, quiet=60.0, longest=60.0)
    drain.thread.join(30)
    assert not drain.thread.is_alive() and drain.last == [None]


def test_an_empty_fleet_denies_gpu_pods_and_leaves_others_alone(running: Running) -> None:
    running.fleet = Fleet()
    assert "no gpu.tessera.dev GPU is published" in running.review(GPU_POD)["response"]["status"]["message"]
    assert "patch" not in running.review(pod(container("main")))["response"]


def test_stop_closes_idle_kept_alive_connections_instead_of_waiting_out_their_timeout(tmp_path: Path) -> None:
    """The idle timeout (180 s) outlasts the 60 s join below: stop returns only because it closes the
    idle connection itself, and the client sees it closed."""
    running = Running(tmp_path)
    connection = running.https()
    connection.request("GET", "/healthz")
    assert connection.getresponse().read() == b"ok\n"  # kept alive, now idle
    stopper = threading.Thread(target=running.server.stop)
    stopper.start()
    stopper.join(60)
    assert not stopper.is_alive()
    with pytest.raises((ConnectionError, http.client.HTTPException, ssl.SSLError, OSError)):
        connection.request("GET", "/healthz")
        connection.getresponse()


# ---------------------------------------------------------------------------------------------------
# Hostile callers


def review_body(obj: dict[str, Any], **changes: Any) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {**request(obj), **changes},
        }
    ).encode()


def connect(running: Running, client: KeyPair | None = None) -> ssl.SSLSocket:
    return tls_socket(running.server.port, client_context(running.certificates, client))


def test_a_forged_review_without_a_client_certificate_fails_the_handshake_and_creates_nothing(
    running: Running,
) -> None:
    assert handshake_refused(running.server.port, client_context(running.certificates, None))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        running.post(review_body(GPU_POD), client=None)
    assert running.templates.made == []


def test_a_certificate_of_another_name_gets_403_and_creates_nothing(running: Running, tmp_path: Path) -> None:
    tenant = running.client_ca.issue("tenant", common_name="system:anonymous", client=True)
    assert running.post(review_body(GPU_POD), client=tenant) == (
        403,
        b'client certificate "system:anonymous" is not allowed to post reviews '
        b"(allowed: kube-apiserver-webhook-client).",
    )
    assert running.templates.made == []


def test_a_certificate_from_another_ca_fails_the_handshake(running: Running, tmp_path: Path) -> None:
    other = CertificateAuthority(tmp_path / "other-ca")
    impostor = other.issue("impostor", common_name=DEFAULT_CLIENT_NAME, client=True)
    assert handshake_refused(running.server.port, client_context(running.certificates, impostor))
    assert running.templates.made == []


@pytest.mark.parametrize("value", ["1e1000000", "1e5000", "1e4299", "Infinity", "-Infinity", "NaN"])
def test_hostile_quantities_are_denied_with_a_short_sentence(running: Running, value: str) -> None:
    response = running.review(pod(container("main", {"nvidia.com/gpumem": value})))["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"].startswith(
        'container "main": nvidia.com/gpumem is refused: quantity "'
    )
    assert len(response["status"]["message"]) < 160
    assert running.templates.made == []


def test_a_body_past_the_limit_gets_413_without_being_read(running: Running) -> None:
    connection = connect(running, running.apiserver)
    size = 10 * 1024 * 1024
    head = f"POST /mutate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    connection.sendall(head.encode())
    answer = answer_of(connection)  # not one byte of the 10 MB sent: answered on the head alone
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert answer.endswith(f"the request body is larger than {MAX_BODY // 2**20} MiB.".encode())


@pytest.mark.parametrize(
    ("head", "status", "sentence"),
    [
        ("POST /mutate HTTP/1.1\r\nHost: x\r\n\r\n", 411, b"the request has no Content-Length."),
        (
            "POST /mutate HTTP/1.1\r\nContent-Length: ten\r\n\r\n",
            400,
            b"the request's Content-Length is not a number.",
        ),
        (
            "POST /mutate HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            400,
            b"the request's Content-Length is not a number.",
        ),
        (
            "POST /mutate HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            400,
            b"the request has two different Content-Length headers.",
        ),
        (
            "POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            411,
            b"a chunked body is not accepted; send Content-Length.",
        ),
        ("GARBAGE\r\n\r\n", 400, b"the request line is not HTTP/1.x."),
        (
            "GET /healthz HTTP/1.1\r\n" + "X-Pad: " + "a" * 20_000 + "\r\n\r\n",
            431,
            b"the request's head is larger than 16 KiB.",
        ),
    ],
)
def test_requests_without_a_usable_length_are_refused_with_a_sentence(
    running: Running, head: str, status: int, sentence: bytes
) -> None:
    connection = connect(running, running.apiserver)
    connection.sendall(head.encode())
    answer = answer_of(connection)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()) and answer.endswith(sentence)


def test_a_request_that_stalls_gets_408_and_is_closed(running: Running) -> None:
    connection = connect(running, running.apiserver)
    connection.sendall(b"POST /mutate HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")  # and nothing more
    answer = answer_of(connection)
    assert answer.startswith(b"HTTP/1.1 408 ") and answer.endswith(b"the request did not arrive in time.")


def test_two_hundred_slow_connections_do_not_keep_a_real_review_from_being_answered(running: Running) -> None:
    slow = [connect(running, running.apiserver) for _ in range(200)]
    for index, connection in enumerate(slow):
        # Half stall in the head, half in the body; none ever finishes.
        connection.sendall(
            b"POST /mutate HTTP/1.1\r\n"
            if index % 2
            else b"POST /mutate HTTP/1.1\r\nContent-Length: 9\r\n\r\n{"
        )
    answer = running.review(GPU_POD)  # sent while all 200 are open and stalled
    assert answer["response"]["allowed"] is True and answer["response"]["patchType"] == "JSONPatch"
    for connection in slow:
        assert answer_of(connection).startswith(b"HTTP/1.1 408 ")
    assert running.review(GPU_POD)["response"]["allowed"] is True


def test_connections_that_never_start_their_handshake_are_closed(running: Running) -> None:
    silent = [socket.create_connection(("127.0.0.1", running.server.port), timeout=30) for _ in range(50)]
    assert running.review(GPU_POD)["response"]["allowed"] is True
    for connection in silent:
        assert connection.recv(1) == b""  # closed by the server, nothing sent


@pytest.fixture
def crowded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    """A server with 8 unverified slots, at most 4 from one address."""
    monkeypatch.setattr(server_module, "MAX_UNVERIFIED", 8)
    monkeypatch.setattr(server_module, "MAX_PER_PEER", 4)
    server = Running(tmp_path)
    yield server
    server.server.stop()


def test_connections_without_a_certificate_never_keep_the_api_server_out(crowded: Running) -> None:
    """Two tenant addresses hold every unverified slot with connections that never start their
    handshake, and a third keeps opening more: the API server's new connection still gets in, takes
    a slot from the address holding the most, and its review is answered."""
    port = crowded.server.port
    held = [connection_from("127.0.0.2", port) for _ in range(4)] + [
        connection_from("127.0.0.3", port) for _ in range(4)
    ]
    poll_until(lambda: len(crowded.server.unverified) == 8, 30, "every unverified slot held")
    refused = connection_from("127.0.0.2", port)  # past its address's share
    assert refused.recv(1) == b""
    assert crowded.review(GPU_POD)["response"]["allowed"] is True
    assert held[0].recv(1) == b""  # the oldest of the largest holder gave its slot up
    for connection in held:
        connection.close()


def test_the_api_servers_kept_alive_connections_take_no_unverified_slot(crowded: Running) -> None:
    kept = [crowded.https() for _ in range(12)]  # more than every unverified slot
    for connection in kept:
        connection.request("GET", "/healthz")
        assert connection.getresponse().read() == b"ok\n"
    assert (len(crowded.server.verified), len(crowded.server.unverified)) == (12, 0)
    for connection in kept:  # still open, and still answered
        connection.request("GET", "/readyz")
        assert connection.getresponse().status == 503


def test_without_authentication_an_idle_connection_is_closed_after_the_short_idle_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where authentication is off anyone's connection may be anyone's: it may sit idle only
    UNVERIFIED_IDLE_TIMEOUT, not the API server's 180 s."""
    monkeypatch.setattr(server_module, "UNVERIFIED_IDLE_TIMEOUT", 0.3)
    certificates = SelfManagedCertificates([], ["127.0.0.1"])
    app = WebhookApp(lambda: FLEET, FakeTemplates())
    open_server = WebhookServer(app, certificates, "127.0.0.1", 0, clients=None)
    open_server.start()
    try:
        connection = tls_socket(open_server.port, client_context(certificates, None))
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert connection.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert answer_of(connection) == b""  # then idle: closed by the server, nothing more sent
    finally:
        open_server.stop()


@pytest.mark.parametrize(
    ("changes", "sentence"),
    [
        (
            {"namespace": "kube-system"},
            'the review\'s namespace "kube-system" is not its pod\'s namespace "team".',
        ),
        ({"namespace": None}, "the review of a Pod CREATE has no namespace."),
        ({"uid": ""}, "the review's request has no uid of 1 to 128 characters."),
        ({"uid": "u" * 129}, "the review's request has no uid of 1 to 128 characters."),
        ({"kind": "Pod"}, "the review's request.kind is not a JSON object."),
        ({"dryRun": "yes"}, "the review's request.dryRun is not a boolean."),
        ({"object": []}, "the review's request.object is not a JSON object."),
        (
            {"object": {"metadata": {"namespace": "team"}, "spec": {"containers": {}}}},
            "the review's pod spec.containers is not a JSON array.",
        ),
        (
            {"object": {"metadata": {"namespace": "team"}, "spec": {"containers": ["c"]}}},
            "the review's pod spec.containers entry is not a JSON object.",
        ),
        (
            {
                "object": {
                    "metadata": {"namespace": "team"},
                    "spec": {"containers": [{"resources": {"limits": []}}]},
                }
            },
            "the review's pod spec.containers entry's resources.limits is not a JSON object.",
        ),
        (
            {
                "object": {
                    "metadata": {"namespace": "team"},
                    "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpumem": [1]}}}]},
                }
            },
            'the review\'s quantity "nvidia.com/gpumem" is not a string or number.',
        ),
        (
            {"object": {"metadata": {"namespace": "team", "annotations": {"nvidia.com/use-gputype": 1}}}},
            'the review\'s pod annotation "nvidia.com/use-gputype" is not a string.',
        ),
        ({"object": {"metadata": "team"}}, "the review's pod metadata is not a JSON object."),
        (
            {"object": {"metadata": {"namespace": "team"}, "spec": {"securityContext": []}}},
            "the review's pod spec securityContext is not a JSON object.",
        ),
        (
            {"object": {"metadata": {"namespace": "team"}, "spec": {"os": "linux"}}},
            "the review's pod spec.os is not a JSON object.",
        ),
        (
            {
                "object": {
                    "metadata": {"namespace": "team"},
                    "spec": {"containers": [{"securityContext": {"seccompProfile": {"type": 1}}}]},
                }
            },
            "the review's pod spec.containers entry's securityContext.seccompProfile.type is not a string.",
        ),
    ],
)
def test_malformed_reviews_get_400_with_a_sentence_and_create_nothing(
    running: Running, changes: dict[str, Any], sentence: str
) -> None:
    status, body = running.post(review_body(GPU_POD, **changes))
    assert (status, body.decode()) == (400, sentence)
    assert running.templates.made == []


def test_deeply_nested_json_is_a_400_not_a_crash(running: Running) -> None:
    status, body = running.post(b"[" * 100_000 + b"]" * 100_000)
    assert (status, body) == (400, b"the body is not JSON.")


def test_a_template_tessera_did_not_write_denies_the_pod_with_its_sentence(running: Running) -> None:
    running.templates.refusal = Refusal("ResourceClaimTemplate team/tessera-x already exists (test).")
    response = running.review(GPU_POD)["response"]
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 403,
        "message": "ResourceClaimTemplate team/tessera-x already exists (test).",
    }


def test_refusals_are_counted_by_status(running: Running) -> None:
    tenant = running.client_ca.issue("tenant", common_name="system:anonymous", client=True)
    assert running.post(review_body(GPU_POD), client=tenant)[0] == 403
    running.post(b"not json")
    text = running.get_plain("/metrics")[1]
    assert 'tessera_webhook_requests_refused_total{status="403"} 1.0' in text
    assert 'tessera_webhook_reviews_total{outcome="malformed"} 1.0' in text


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.sampled_from(["1e5000", "8000", "Infinity"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
PLACES = [
    ("object",),
    ("object", "metadata"),
    ("object", "metadata", "annotations"),
    ("object", "spec"),
    ("object", "spec", "containers"),
    ("object", "spec", "containers", 0),
    ("object", "spec", "containers", 0, "resources"),
    ("object", "spec", "containers", 0, "resources", "limits"),
    ("object", "spec", "containers", 0, "resources", "limits", "nvidia.com/gpumem"),
    ("object", "spec", "containers", 0, "resources", "claims"),
    ("object", "spec", "resourceClaims"),
    ("object", "spec", "initContainers"),
    ("kind",),
    ("namespace",),
    ("uid",),
]


@settings(max_examples=300, deadline=None)
@given(place=st.sampled_from(PLACES), value=JSON)
def test_no_shape_of_review_reaches_the_internal_error(place: tuple[Any, ...], value: Any) -> None:
    """Any JSON at any place the webhook reads: a 400 with a sentence, or a decision; never the 500
    kept for the webhook's own faults."""
    app = WebhookApp(lambda: FLEET, FakeTemplates())
    body = request(pod(container("main", {"nvidia.com/gpumem": 8000}), annotations={"a": "b"}))
    target: Any = body
    for key in place[:-1]:
        target = target[key]
    target[place[-1]] = value
    status, answer = app.review(json.dumps({"apiVersion": "admission.k8s.io/v1", "request": body}).encode())
    assert status in (200, 400)
    if status == 400:
        assert answer.decode().endswith(".") and len(answer) < 200
    else:
        response = json.loads(answer)["response"]
        assert response.get("status", {}).get("code") != 500, response
    assert app.metrics.registry.get_sample_value("tessera_webhook_reviews_total", {"outcome": "error"}) == 0


def test_probes_are_answered_while_every_worker_is_busy_with_a_review(running: Running) -> None:
    running.templates.gate = threading.Event()
    posters = [threading.Thread(target=running.review, args=(GPU_POD,)) for _ in range(WORKERS + 2)]
    for poster in posters:
        poster.start()
    poll_until(lambda: len(running.templates.waiting) == WORKERS, 30, "every worker held in a review")
    try:
        assert running.get_plain("/healthz") == (200, "ok\n")
        assert len(running.templates.waiting) == WORKERS  # the two extra reviews still queue
    finally:
        running.templates.gate.set()
        for poster in posters:
            poster.join(60)


def test_a_refused_upload_is_cut_off_while_its_client_keeps_sending(running: Running) -> None:
    """Refused from its head (a certificate of another name), a 10 MB review's client keeps writing:
    the server resets the connection rather than wait on the client's TLS close (30 s by default,
    while the client's writes stall). Its writes fail with a reset, not the 10 s timeout of a
    stalled send."""
    connection = connect(running, running.client_ca.issue("tenant", common_name="tenant", client=True))
    connection.settimeout(10)
    connection.sendall(
        b"POST /mutate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 10485760\r\n\r\n"
    )
    chunk = b"x" * 65536
    with pytest.raises((ConnectionError, ssl.SSLError)):
        for _ in range(10485760 // len(chunk) * 4):
            connection.sendall(chunk)
