"""``tessera-webview``: flags, the page reader, and the waitress server that serves the page.

waitress, not Tessera's own HTTP server (tessera/serving.py): the page is rendered by a WSGI
framework, and waitress is the well-kept WSGI server that bounds what a client can hold (a
connection limit, an idle timeout, header and body sizes), which is what a page reachable by
``kubectl port-forward`` or through an authenticating proxy needs.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from kubernetes import client
from waitress import create_server
from waitress.server import BaseWSGIServer

from tessera import command
from tessera.kubectl import snapshot
from tessera.settings import setting
from tessera.webview import usage_history
from tessera.webview.app import CachedPage, create_app
from tessera.webview.page import Page, UsageHistory, build

log = logging.getLogger("tessera.webview")

CONNECTION_LIMIT = 64
"""Connections served at once; past it waitress stops accepting until one closes."""
IDLE_SECONDS = 30
"""An idle connection is closed after this (waitress's channel timeout)."""
HEADER_LIMIT = 16 * 1024
BODY_LIMIT = 1024
"""The page takes no input: a request with a body is refused."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tessera-webview",
        description="A read-only web page of the cluster's GPUs, their shares and the GPU pods that "
        "wait, with why. Reach it through `kubectl port-forward` or an authenticating proxy.",
    )
    setting(
        p, "--kubeconfig", "KUBECONFIG", None, "kubeconfig file (default: the pod's service account)", Path
    )
    setting(
        p, "--listen-address", "TESSERA_WEBVIEW_LISTEN_ADDRESS", "0.0.0.0", "address to serve the page on"
    )
    setting(p, "--port", "TESSERA_WEBVIEW_PORT", 8080, "port of the page and of /healthz", int)
    setting(
        p,
        "--prometheus-url",
        "TESSERA_WEBVIEW_PROMETHEUS_URL",
        "",
        "Prometheus that scrapes the exporters, for each share's memory in use over the last hour "
        "(its http:// or https:// base URL; empty: no usage history)",
    )
    setting(
        p,
        "--refresh",
        "TESSERA_WEBVIEW_REFRESH",
        5.0,
        "seconds a page read is reused for every browser asking, so reloads cost the API server nothing",
        float,
    )
    command.log_flags(p, "TESSERA_WEBVIEW_")
    command.api_flags(p, "TESSERA_WEBVIEW_")
    return p


def read_page(api: client.ApiClient, prometheus_url: str) -> Page:
    """One snapshot of the cluster's GPUs, the claims and templates, and the pods no node is chosen
    for (only those can wait for a share), judged as ``kubectl tessera why`` judges them."""
    found = snapshot.read(api, None, frozenset({"slices", "templates"}))
    found.pods = snapshot.listed(
        "pods",
        client.CoreV1Api(api).list_pod_for_all_namespaces,
        found.missing,
        field_selector="spec.nodeName=",
    )
    history: UsageHistory = {}
    note = ""
    if prometheus_url:
        try:
            history = usage_history.read(prometheus_url)
        except usage_history.UsageUnavailable as unavailable:
            note = f"No usage history: {unavailable}"
    else:
        note = "No usage history: no Prometheus is configured (--prometheus-url)."
    return build(found, history, datetime.datetime.now(datetime.UTC), note)


class WebView(command.Stoppable):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.fatal: str | None = None
        self._args = args
        self._api = command.api_client_from(args, args.kubeconfig)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.effective_port)

    def start(self) -> None:
        page = CachedPage(lambda: read_page(self._api, self._args.prometheus_url), self._args.refresh)
        self._server = create_server(
            create_app(page),
            host=self._args.listen_address,
            port=self._args.port,
            threads=4,
            connection_limit=CONNECTION_LIMIT,
            channel_timeout=IDLE_SECONDS,
            cleanup_interval=IDLE_SECONDS // 3,
            max_request_header_size=HEADER_LIMIT,
            max_request_body_size=BODY_LIMIT,
            ident="tessera-webview",
            clear_untrusted_proxy_headers=True,
        )
        self._thread = threading.Thread(target=self._serve, name="webview", daemon=True)
        self._thread.start()
        log.info("serving the web view on %s:%d", self._args.listen_address, self.port)

    def _serve(self) -> None:
        assert self._server is not None
        try:
            self._server.run()
        except Exception as error:
            log.exception("the web view's server failed")
            self.fatal = f"server: {error}"
            self._stop.set()

    def stop(self) -> None:
        """Stop accepting, finish the requests under way, close every connection."""
        self._stop.set()
        if self._server is not None:
            self._server.close()
            self._server.task_dispatcher.shutdown()
            for channel in list(self._server._map.values()):
                channel.close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._api.close()  # type: ignore[no-untyped-call]


def webview(args: argparse.Namespace) -> WebView:
    if not 0 <= args.port <= 65535:
        raise command.UsageError(f"the port must be 0-65535, not {args.port}")
    if not 0 <= args.refresh <= 300:
        raise command.UsageError(f"the refresh must be 0-300 seconds, not {args.refresh:g}")
    if args.prometheus_url and not args.prometheus_url.startswith(("http://", "https://")):
        raise command.UsageError(
            f"the Prometheus URL must start with http:// or https://, not {args.prometheus_url!r}"
        )
    return WebView(args)


def main(argv: Sequence[str] | None = None) -> int:
    return command.main(parser(), webview, log, argv)


if __name__ == "__main__":
    sys.exit(main())
