"""The one way Tessera serves HTTP: what each path answers, a bounded thread server, TLS from files
that are reloaded when they change."""

from __future__ import annotations

import gzip
import http.client
import select
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from tessera import serving
from tessera.serving import Endpoints, HttpServer, Metrics, TlsFiles, registry_metrics
from testbed.pki import CertificateAuthority, KeyPair
from testbed.polling import poll_until
from testbed.process import connection_from


def get(port: int, path: str, method: str = "GET", **headers: str) -> tuple[int, bytes, dict[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, headers=headers)
    response = connection.getresponse()
    return response.status, response.read(), dict(response.getheaders())


def test_checks_answer_ok_or_why_not_and_unserved_paths_are_404() -> None:
    endpoints = Endpoints(healthz=lambda: (True, "unused"), readyz=lambda: (False, "the cache is empty"))
    assert (endpoints.answer("/healthz").status, endpoints.answer("/healthz").body) == (200, b"ok\n")
    assert (endpoints.answer("/readyz").status, endpoints.answer("/readyz").body) == (
        503,
        b"the cache is empty\n",
    )
    missing = endpoints.answer("/metrics")
    assert missing.status == 404 and b"GET /healthz, /readyz" in missing.body


def test_metrics_are_prometheus_text_compressed_when_the_scraper_accepts_gzip() -> None:
    registry = CollectorRegistry()
    Counter("tessera_test_things", "Things.", registry=registry).inc(3)
    endpoints = Endpoints(metrics=registry_metrics(registry))
    plain = endpoints.answer("/metrics")
    assert plain.status == 200 and b"tessera_test_things_total 3.0" in plain.body
    assert plain.encoding is None
    packed = endpoints.answer("/metrics", accept_encoding="gzip, deflate")
    assert packed.encoding == "gzip" and gzip.decompress(packed.body) == plain.body


@pytest.fixture
def server() -> Iterator[HttpServer]:
    endpoints = Endpoints(
        healthz=lambda: (True, ""),
        readyz=lambda: (False, "not yet"),
        metrics=Metrics(lambda: b"x 1\n", "text/plain; version=0.0.4"),
    )
    running = HttpServer("test", "127.0.0.1", 0, endpoints)
    running.start()
    yield running
    running.stop()


def test_the_server_answers_the_endpoints_and_nothing_else(server: HttpServer) -> None:
    assert get(server.port, "/healthz")[:2] == (200, b"ok\n")
    assert get(server.port, "/readyz?verbose")[:2] == (503, b"not yet\n")
    status, body, headers = get(server.port, "/metrics")
    assert (status, body, headers["Content-Type"]) == (200, b"x 1\n", "text/plain; version=0.0.4")
    assert get(server.port, "/metrics", **{"Accept-Encoding": "gzip"})[2]["Content-Encoding"] == "gzip"
    assert get(server.port, "/")[0] == 404
    assert get(server.port, "/healthz", method="POST")[0] == 404


def test_stopping_twice_is_harmless_and_frees_the_port(server: HttpServer) -> None:
    port = server.port
    server.stop()
    server.stop()
    with pytest.raises(ConnectionError):
        get(port, "/healthz")


def answered(connection: socket.socket) -> bytes:
    connection.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
    return connection.recv(1024)


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpServer]:
    """A server of 4 slots, at most 3 from one address."""
    monkeypatch.setattr(serving, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(serving, "MAX_PER_PEER", 3)
    running = HttpServer("test", "127.0.0.1", 0, Endpoints(healthz=lambda: (True, "")))
    running.start()
    yield running
    running.stop()


def test_an_address_past_its_share_is_closed_at_once_and_others_are_still_served(small: HttpServer) -> None:
    held = [connection_from("127.0.0.2", small.port) for _ in range(3)]
    extra = connection_from("127.0.0.2", small.port)
    assert extra.recv(1) == b""  # closed without a request being read
    assert answered(connection_from("127.0.0.1", small.port)).startswith(b"HTTP/1.0 200")
    for connection in held:  # the address's own share is served
        assert answered(connection).startswith(b"HTTP/1.0 200")


def test_when_every_slot_is_taken_a_newcomer_takes_the_oldest_of_the_largest_holder(
    small: HttpServer,
) -> None:
    crowd = [connection_from("127.0.0.2", small.port) for _ in range(3)]
    other = connection_from("127.0.0.3", small.port)
    poll_until(lambda: len(small._server._slots) == 4, 30, "every slot taken")  # type: ignore[union-attr]
    assert answered(connection_from("127.0.0.1", small.port)).startswith(b"HTTP/1.0 200")
    assert crowd[0].recv(1) == b""  # the oldest of the address holding the most gave up its slot
    assert answered(crowd[1]).startswith(b"HTTP/1.0 200")
    assert answered(other).startswith(b"HTTP/1.0 200")


def test_a_client_that_sends_nothing_is_closed_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "REQUEST_TIMEOUT", 0.2)
    running = HttpServer("test", "127.0.0.1", 0, Endpoints(healthz=lambda: (True, "")))
    running.start()
    try:
        silent = socket.create_connection(("127.0.0.1", running.port), timeout=30)
        assert silent.recv(1) == b""
        silent.close()
        assert get(running.port, "/healthz")[0] == 200
    finally:
        running.stop()


def test_a_head_sent_a_line_at_a_time_is_cut_off_at_one_deadline_not_one_per_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each line comes well within the deadline of the one before: a timeout per read would wait
    forever; the request's one deadline closes the connection unanswered."""
    monkeypatch.setattr(serving, "REQUEST_TIMEOUT", 0.5)
    running = HttpServer("test", "127.0.0.1", 0, Endpoints(healthz=lambda: (True, "")))
    running.start()
    try:
        slow = socket.create_connection(("127.0.0.1", running.port), timeout=30)
        slow.sendall(b"GET /healthz HTTP/1.0\r\n")
        closed = False
        for line in range(100):  # 10 s of header lines, one every 0.1 s
            try:
                slow.sendall(f"X-Line-{line}: 1\r\n".encode())
            except ConnectionError:
                closed = True
                break
            readable, _, _ = select.select([slow], [], [], 0.1)
            if readable:
                assert slow.recv(1024) == b""  # closed, never answered
                closed = True
                break
        assert closed, "the connection outlived ten seconds of header lines"
        assert get(running.port, "/healthz")[0] == 200
    finally:
        running.stop()


def _mount(folder: Path, pair: KeyPair) -> None:
    folder.mkdir(exist_ok=True)
    shutil.copy(pair.cert, folder / "tls.crt")
    shutil.copy(pair.key, folder / "tls.key")


def _serving_certificate(port: int, ca: CertificateAuthority) -> bytes:
    context = ssl.create_default_context(cafile=ca.pair.cert)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert tls.recv(1024).startswith(b"HTTP/1.0 200")
        certificate = tls.getpeercert(binary_form=True)
        assert certificate is not None
        return certificate


def test_tls_from_files_serves_a_reloaded_certificate_to_new_connections(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    first = ca.issue("first", common_name="first", ip_addresses=("127.0.0.1",), server=True)
    second = ca.issue("second", common_name="second", ip_addresses=("127.0.0.1",), server=True)
    mounted = tmp_path / "mounted"
    _mount(mounted, first)
    files = TlsFiles(mounted)
    running = HttpServer("test", "127.0.0.1", 0, Endpoints(healthz=lambda: (True, "")), tls=files)
    running.start()
    try:
        served = _serving_certificate(running.port, ca)
        assert files.refresh() is False  # unchanged files: nothing to do
        _mount(mounted, second)
        assert files.refresh() is True
        assert _serving_certificate(running.port, ca) != served
    finally:
        running.stop()


def test_a_missing_certificate_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no certificate"):
        TlsFiles(tmp_path)
