"""The web view's routes: the page, its style sheet, and the probes.

The page is read at most once per ``refresh`` seconds however many browsers ask (one snapshot of
the API, one Prometheus query), under a lock, so reloading cannot turn the view into load on the
API server. Every answer carries headers that forbid scripts, frames and outside resources: the page
has no script, and a value that escaped escaping still could not run one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from flask import Flask, Response, render_template
from kubernetes.client import ApiException
from urllib3.exceptions import HTTPError

from tessera.kubectl.text import size
from tessera.webview.page import Page
from tessera.webview.usage_history import polyline

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'none'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class CachedPage:
    """The last page read, kept ``refresh`` seconds; concurrent requests wait for one read."""

    def __init__(self, read: Callable[[], Page], refresh: float, clock: Callable[[], float] = time.monotonic):
        self._read = read
        self._refresh = refresh
        self._clock = clock
        self._lock = threading.Lock()
        self._page: Page | None = None
        self._read_at = 0.0

    def get(self) -> Page:
        with self._lock:
            now = self._clock()
            if self._page is None or now - self._read_at >= self._refresh:
                self._page = self._read()
                self._read_at = now
            return self._page


def percent(value: int) -> str:
    return f"{value} %"


def create_app(page: CachedPage) -> Flask:
    app = Flask(__name__)

    @app.get("/")
    def index() -> str | Response:
        try:
            shown = page.get()
        except (ApiException, HTTPError, OSError) as error:
            reason = (
                f"{error.status} {error.reason}" if isinstance(error, ApiException) else type(error).__name__
            )
            return Response(
                f"The API server could not be read ({reason}); try again.\n", 503, mimetype="text/plain"
            )
        return render_template("index.html", page=shown, size=size, percent=percent, polyline=polyline)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.after_request
    def secure(response: Response) -> Response:
        response.headers.update(SECURITY_HEADERS)
        return response

    return app
