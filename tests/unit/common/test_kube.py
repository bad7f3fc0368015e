"""Client set-up says which credentials it looked for when it finds none, merges KUBECONFIG lists, and
bounds every call: an API server that accepts a connection and never answers fails the call (or the
watch, which then lists again) instead of hanging it."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client import ApiException
from urllib3.exceptions import NewConnectionError, ProtocolError

from tessera import watching
from tessera.kube import BoundedApiClient, api_client, when_reachable
from testbed.polling import poll_until

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster: {{server: "https://127.0.0.1:{port}"}}
users:
- name: {name}
  user: {{token: t}}
contexts:
- name: {name}
  context: {{cluster: {name}, user: {name}}}
{current}
"""


def test_no_credentials_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="pass a kubeconfig, set KUBECONFIG, or run in a pod"):
        api_client()


def test_kubeconfig_list_is_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As with kubectl, KUBECONFIG=a:b merges both files; the current context may come from either."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text(KUBECONFIG.format(name="a", port=1111, current=""))
    second.write_text(KUBECONFIG.format(name="b", port=2222, current="current-context: a"))
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    assert api_client().configuration.host == "https://127.0.0.1:1111"


class SilentApiServer:
    """An HTTP server on loopback that answers a list of namespaces with an empty list and then, for
    every call ``hang`` names, sends nothing at all (a half-open connection as the client sees it)."""

    def __init__(self, hang: Callable[[str], bool]) -> None:
        self.requests: list[str] = []
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append(self.path)
                if hang(self.path):
                    owner.release.wait(30)
                    return
                body = json.dumps({"metadata": {"resourceVersion": "7"}, "items": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            KUBECONFIG.format(
                name="silent", port=self.server.server_port, current="current-context: silent"
            ).replace("https://", "http://")
        )
        return path

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


StartServer = Callable[[Callable[[str], bool]], SilentApiServer]
"""Starts a SilentApiServer that hangs on the request paths the predicate names."""


@pytest.fixture
def silent_for() -> Iterator[StartServer]:
    servers: list[SilentApiServer] = []

    def start(hang: Callable[[str], bool]) -> SilentApiServer:
        servers.append(SilentApiServer(hang))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.mark.timeout(60)
def test_a_call_the_api_server_never_answers_fails_instead_of_hanging(
    tmp_path: Path, silent_for: StartServer
) -> None:
    server = silent_for(lambda path: True)
    core = client.CoreV1Api(api_client(server.kubeconfig(tmp_path / "kubeconfig"), timeout=(1.0, 0.5)))
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.list_namespace()
    assert server.requests, "the call reached the server"


def test_a_call_that_names_its_own_timeout_keeps_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    silent_for: StartServer,
) -> None:
    server = silent_for(lambda path: False)
    api = api_client(server.kubeconfig(tmp_path / "kubeconfig"), timeout=(1.0, 2.0))
    seen: list[Any] = []
    request: Callable[..., Any] = api.rest_client.request

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("_request_timeout"))
        return request(*args, **kwargs)

    monkeypatch.setattr(api.rest_client, "request", recording)
    core = client.CoreV1Api(api)
    core.list_namespace()
    core.list_namespace(_request_timeout=(3.0, 90.0))
    assert seen == [(1.0, 2.0), (3.0, 90.0)]


@pytest.mark.timeout(60)
def test_a_watch_that_goes_silent_is_dropped_and_the_list_taken_again(
    tmp_path: Path, silent_for: StartServer
) -> None:
    """The server accepted the watch and then fell silent (no event, no close): after the client's
    watch idle bound (a daemon's --api-watch-idle-timeout) the loop gives the connection up and lists
    again, so the cache is rebuilt, not frozen. The watch asked the server to end it sooner."""
    server = silent_for(lambda path: "watch=true" in path)
    core = client.CoreV1Api(api_client(server.kubeconfig(tmp_path / "kubeconfig"), watch_idle_timeout=2.0))
    synced = threading.Semaphore(0)
    stop = threading.Event()

    def handle(kind: str, obj: Any) -> None:
        if kind == "SYNCED":
            synced.release()

    watcher = threading.Thread(
        target=watching.watch_forever,
        args=(core.list_namespace, handle, stop, "namespaces"),
        kwargs={"max_backoff": 0.5},
        daemon=True,
    )
    watcher.start()
    try:
        assert synced.acquire(timeout=30), "the first list"
        assert synced.acquire(timeout=30), "listed again after the silent watch"
        watches = [path for path in server.requests if "watch=true" in path]
        assert any("resourceVersion=7" in path for path in watches)
        assert all("timeoutSeconds=1&" in path + "&" for path in watches), watches
    finally:
        stop.set()
        server.release.set()
        watcher.join(10)


@pytest.mark.timeout(60)
def test_a_watch_that_cannot_list_says_so_until_it_lists_again(
    tmp_path: Path, silent_for: StartServer
) -> None:
    """The readiness of a process is only as good as its watches: while one cannot get its list
    (nothing listens at the address), Reachability names it and the error; once it lists, nothing."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    away = tmp_path / "away"
    away.write_text(
        KUBECONFIG.format(name="away", port=port, current="current-context: away").replace(
            "https://", "http://"
        )
    )
    reachability = watching.Reachability()
    stop = threading.Event()
    failing = threading.Thread(
        target=watching.watch_forever,
        args=(client.CoreV1Api(api_client(away)).list_namespace, lambda kind, obj: None, stop, "namespaces"),
        kwargs={"max_backoff": 0.2, "reachability": reachability},
        daemon=True,
    )
    failing.start()
    try:
        poll_until(lambda: reachability.problem() is not None, 30, "the failed list reported")
        problem = reachability.problem()
        assert problem is not None and problem.startswith("the watch of namespaces is failing: ")
    finally:
        stop.set()
        failing.join(10)

    server = silent_for(lambda path: "watch=true" in path)
    stop = threading.Event()
    working = threading.Thread(
        target=watching.watch_forever,
        args=(
            client.CoreV1Api(api_client(server.kubeconfig(tmp_path / "here"))).list_namespace,
            lambda kind, obj: None,
            stop,
            "namespaces",
        ),
        kwargs={"reachability": reachability},
        daemon=True,
    )
    working.start()
    try:
        poll_until(lambda: reachability.problem() is None, 30, "the successful list reported")
    finally:
        stop.set()
        server.release.set()
        working.join(10)


def test_json_bodies_go_out_canonical_so_opaque_parameters_survive_a_status_patch() -> None:
    """The API server keeps an opaque configuration's bytes as sent and refuses a status PATCH of a
    claim whose stored bytes do not re-encode to themselves; bodies therefore leave with no spaces
    and sorted keys, while patch bodies of other types are left as the library wrote them."""
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:1"
    api = BoundedApiClient(configuration, (1.0, 1.0))
    sent: list[tuple[object, object]] = []

    class Recorder:
        def request(
            self, method: str, url: str, body: object = None, headers: object = None, **_: object
        ) -> None:
            sent.append((body, headers))
            raise RuntimeError("recorded")

    api.rest_client.pool_manager._pool = Recorder()  # type: ignore[attr-defined]
    claim = {
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [],
                "config": [{"opaque": {"driver": "d", "parameters": {"kind": "K", "enforcement": "off"}}}],
            }
        },
    }
    with pytest.raises(RuntimeError, match="recorded"):
        client.ResourceV1Api(api).create_namespaced_resource_claim(
            "ns", client.ResourceV1ResourceClaim.model_validate(claim)
        )
    body, _ = sent[-1]
    assert isinstance(body, str) and " " not in body
    assert '"parameters":{"enforcement":"off","kind":"K"}' in body
    with pytest.raises(RuntimeError, match="recorded"):
        client.CoreV1Api(api).patch_node("n", [{"op": "add", "path": "/metadata/labels/a", "value": "b"}])
    body, headers = sent[-1]
    assert body == '[{"op": "add", "path": "/metadata/labels/a", "value": "b"}]', (body, headers)


def test_a_call_the_api_server_does_not_answer_is_tried_again_with_a_growing_wait() -> None:
    """What a component cannot start without is waited for while the API server is away (no
    connection, or a 5xx), so that it starts as soon as the server is back."""
    answers: list[Exception | str] = [
        NewConnectionError(None, "connection refused"),  # type: ignore[arg-type]
        ApiException(status=503, reason="Service Unavailable"),
        ProtocolError("Connection aborted."),
        "certificate",
    ]
    slept: list[float] = []

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    got = when_reachable(call, "reading", logging.getLogger("test"), longest_wait=3.0, sleep=slept.append)
    assert got == "certificate"
    assert slept == [1.0, 2.0, 3.0]


def test_a_refusal_by_the_api_server_is_raised_at_once() -> None:
    def call() -> str:
        raise ApiException(status=403, reason="Forbidden")

    slept: list[float] = []
    with pytest.raises(ApiException):
        when_reachable(call, "reading", logging.getLogger("test"), sleep=slept.append)
    assert slept == []
