"""List, then watch from the list's resourceVersion, forever, with backoff: the one watch loop.

The driver's claim cache and slice publisher (and later the exporter and the admission check) all
need "tell me about every change, and start over cleanly when the watch breaks"; getting the
resourceVersion, 410 Gone and reconnect backoff right once is the point of this module.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client import ApiException
from kubernetes.watch.watch import iter_resp_lines

from tessera.kube import CONNECT_TIMEOUT, WATCH_IDLE_TIMEOUT

log = logging.getLogger(__name__)

_WATCH_SECONDS = 30
"""Server-side watch timeout at most: a watch is renewed (from the last resourceVersion) this often,
or within half the client's idle bound when that is shorter."""


def _watch_bounds(list_call: Callable[..., Any]) -> tuple[int, float]:
    """(server-side watch timeout, seconds the watch may go without a byte) for ``list_call``, a
    client's list method: the idle bound is its client's (``BoundedApiClient.watch_idle_timeout``,
    a daemon's --api-watch-idle-timeout), and the server ends a watch within half of it, so a
    healthy idle watch ends at the server's word before the client takes it for dead."""
    api = getattr(getattr(list_call, "__self__", None), "api_client", None)
    idle = float(getattr(api, "watch_idle_timeout", WATCH_IDLE_TIMEOUT))
    return max(1, min(_WATCH_SECONDS, int(idle / 2))), idle


class Reachability:
    """Whether each of a process's watches got its list from the API server the last time it tried,
    for a readiness probe: one that works must not hide another that fails (the server gone, a
    partition, a permission removed). Loops report by name; ``problem`` names the first failing."""

    _ERROR_CHARS = 200

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[str, str] = {}

    def reached(self, what: str) -> None:
        with self._lock:
            self._failures.pop(what, None)

    def failed(self, what: str, error: BaseException) -> None:
        with self._lock:
            self._failures[what] = str(error)[: self._ERROR_CHARS]

    def problem(self) -> str | None:
        """A sentence for the probe while some loop cannot reach the API server, else None."""
        with self._lock:
            if not self._failures:
                return None
            what, error = sorted(self._failures.items())[0]
        return f"the watch of {what} is failing: {error}"


Handler = Callable[[str, Mapping[str, Any]], None]
"""Called with ("ADDED" | "MODIFIED" | "DELETED" | "SYNCED", object as JSON). "SYNCED" follows
every fresh list, with an object {"items": [...]} holding the complete list."""


def watch_forever(
    list_call: Callable[..., Any],
    handler: Handler,
    stop: threading.Event,
    what: str,
    max_backoff: float = 30.0,
    reachability: Reachability | None = None,
    **selectors: str,
) -> None:
    """Run until ``stop`` is set: list ``list_call`` (a kubernetes client list method), hand the
    list to ``handler``, then watch from its resourceVersion; relist on any error, waiting
    0.5 s, 1 s, 2 s... up to ``max_backoff`` between failures. Each list's outcome goes to
    ``reachability`` under ``what``."""
    backoff = 0.5
    server_timeout, idle_timeout = _watch_bounds(list_call)
    while not stop.is_set():
        try:
            response = list_call(_preload_content=False, **selectors)
            listed = json.loads(response.data)
            if reachability is not None:
                reachability.reached(what)
            handler("SYNCED", {"items": listed.get("items") or []})
            version = listed["metadata"]["resourceVersion"]
            backoff = 0.5
            while not stop.is_set():
                response = list_call(
                    watch=True,
                    resource_version=version,
                    timeout_seconds=server_timeout,
                    allow_watch_bookmarks=True,
                    _preload_content=False,
                    _request_timeout=(CONNECT_TIMEOUT, idle_timeout),
                    **selectors,
                )
                try:
                    for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                        if stop.is_set():
                            return
                        if not line:
                            continue
                        event = json.loads(line)
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":  # 410 Gone and friends: relist
                            raise ApiException(status=obj.get("code", 500), reason=obj.get("message"))
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        if kind != "BOOKMARK":
                            handler(kind, obj)
                finally:
                    response.close()
        except Exception as error:  # every failure: relist after a pause
            if stop.is_set():
                return
            if reachability is not None:
                reachability.failed(what, error)
            log.warning("watch of %s failed (%s); relisting in %.1fs", what, error, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, max_backoff)


class WatchThread:
    """``watch_forever`` in a daemon thread of its own, for a cache that starts and stops with its
    owner (the webhook's slice cache and template store): the thread, its stop event and the
    bounded join on stop are written once here."""

    def __init__(
        self, list_call: Callable[..., Any], handler: Handler, what: str, name: str, **selectors: str
    ) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=watch_forever,
            args=(list_call, handler, self._stop, what),
            kwargs=selectors,
            name=name,
            daemon=True,
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the watch and wait up to ``timeout`` seconds for its thread; safe before start."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=timeout)
