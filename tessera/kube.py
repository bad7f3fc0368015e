"""Kubernetes client set-up shared by every Tessera component and the tests.

One place decides how a client is built (an explicit kubeconfig, else $KUBECONFIG, else the
in-cluster service account), so the driver, the webhook and the tests cannot drift apart; and how
long any call may wait. The client library waits forever by default: one half-open connection to the
API server (a node partitioned, a load balancer that drops instead of refusing) would hang the call
that uses it, and with it a prepare worker until the kubelet's deadline or a watch for good. Every
call made through :func:`api_client` has a connect and a read bound unless it names its own.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client import ApiException
from urllib3.exceptions import HTTPError

T = TypeVar("T")

CONNECT_TIMEOUT = 5.0
"""Seconds to open a connection to the API server: a reachable one answers in milliseconds."""

READ_TIMEOUT = 30.0
"""Seconds a call may wait for the API server's answer, by default (every daemon's --api-timeout).
The server's own limit on a request is 60 s (--request-timeout), but nothing Tessera asks takes more
than a few seconds when the server is well; past this the call fails and its caller's backoff takes
over."""

WATCH_IDLE_TIMEOUT = 60.0
"""Seconds a watch may go without a byte before its connection is taken for dead, by default (every
daemon's --api-watch-idle-timeout): half-open (the API server gone without a FIN, a dropped route),
which nothing but this notices. The watch asks the server to end it within half of this
(tessera/watching.py), so a healthy idle watch never reaches it."""

RETRIES = 1
"""Times the connection pool retries a call that failed to connect or lost its connection: once, for
a pooled keep-alive connection the server closed meanwhile. Not more: every caller has its own loop
with back-off, and the library's default of three retries made each failure of an absent API server
cost four timeouts and four log lines."""

Timeout = tuple[float, float]
"""(connect, read) seconds, as the client's ``_request_timeout`` takes them."""


class _CompactJsonBodies:
    """The client's connection pool, sending JSON bodies in canonical form - no spaces after
    separators, keys sorted - as the API server itself re-encodes them.

    Why: the API server keeps an opaque configuration's ``parameters`` as the bytes it was sent, and
    the controller manager and the scheduler copy those bytes from a template into a claim and its
    allocation. A PATCH of such a claim's status re-encodes the allocation compactly, sees it
    "changed", and is refused ("status.allocation: field cannot be modified once set"), so the node
    daemon could not write why a claim with a ShareConfig failed to prepare. Bytes sent canonical
    compare equal."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def request(self, method: str, url: str, body: Any = None, headers: Any = None, **kwargs: Any) -> Any:
        content_type = (headers or {}).get("Content-Type")
        if isinstance(body, str) and body and content_type in (None, "application/json"):
            body = json.dumps(json.loads(body), separators=(",", ":"), sort_keys=True)
        return self._pool.request(method, url, body=body, headers=headers, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class BoundedApiClient(client.ApiClient):
    """An ApiClient whose calls wait at most ``timeout`` unless a call passes ``_request_timeout``
    (a watch does: it waits ``watch_idle_timeout`` for each byte), and whose JSON bodies are compact
    (:class:`_CompactJsonBodies`). The bounds travel with the client, so every loop that uses it
    keeps the bounds its daemon was configured with."""

    def __init__(
        self,
        configuration: client.Configuration,
        timeout: Timeout,
        watch_idle_timeout: float = WATCH_IDLE_TIMEOUT,
    ) -> None:
        super().__init__(configuration)
        self.timeout = timeout
        self.watch_idle_timeout = watch_idle_timeout
        self.rest_client.pool_manager = _CompactJsonBodies(self.rest_client.pool_manager)  # type: ignore[assignment]

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        return super().call_api(
            method, url, header_params, body, post_params, _request_timeout=_request_timeout or self.timeout
        )


def api_client(
    kubeconfig: Path | None = None,
    timeout: Timeout = (CONNECT_TIMEOUT, READ_TIMEOUT),
    context: str | None = None,
    watch_idle_timeout: float = WATCH_IDLE_TIMEOUT,
) -> BoundedApiClient:
    """An ApiClient for the given kubeconfig, $KUBECONFIG, or the pod's service account, in that order,
    whose calls wait at most ``timeout`` and whose watches at most ``watch_idle_timeout`` for a
    byte; ``context`` names a kubeconfig context other than the current one (kubectl's
    ``--context``).

    $KUBECONFIG may list several files (a:b), as kubectl allows; the client merges them."""
    configuration = client.Configuration()
    path = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG")
    if path:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration
        )
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        raise RuntimeError("no Kubernetes credentials: pass a kubeconfig, set KUBECONFIG, or run in a pod")
    configuration.retries = RETRIES
    return BoundedApiClient(configuration, timeout, watch_idle_timeout)


def raw_json(response: Any) -> dict[str, Any]:
    """The JSON body of a call made with ``_preload_content=False``.

    The driver reads claims and slices as plain JSON: the client's typed models cost milliseconds
    per object to build, which a prepare call answering within the kubelet's budget cannot spend."""
    body: dict[str, Any] = json.loads(response.data)
    return body


def create_if_absent(create: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Call a client ``create_*`` method; an object that already exists (409 AlreadyExists) is
    success, as for every idempotent writer here. Returns whether this call created it."""
    try:
        create(*args, **kwargs)
    except ApiException as error:
        if error.status != 409:
            raise
        return False
    return True


def unreachable(error: Exception) -> bool:
    """Whether ``error`` means the API server did not answer (no connection, a dropped one, a timeout)
    or answered that it cannot serve now (5xx), rather than refusing the request itself."""
    if isinstance(error, HTTPError):
        return True
    return isinstance(error, ApiException) and (not error.status or error.status >= 500)


def when_reachable(
    call: Callable[[], T],
    what: str,
    log: logging.Logger,
    longest_wait: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, tried again, 1 s later and then twice as long up to ``longest_wait``, for as long
    as the API server does not answer; any other failure is raised at once. For what a component
    cannot start without: exiting instead would hand the restart to the kubelet, whose back-off
    grows to five minutes and keeps the component down long after the API server is back."""
    delay = 1.0
    while True:
        try:
            return call()
        except (HTTPError, ApiException) as error:
            if not unreachable(error):
                raise
            log.warning("%s: the API server does not answer (%s); trying again in %.0f s", what, error, delay)
        sleep(delay)
        delay = min(delay * 2, longest_wait)
