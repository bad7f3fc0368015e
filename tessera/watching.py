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

from kubernetes import watch
from kubernetes.client import ApiException

log = logging.getLogger(__name__)

Handler = Callable[[str, Mapping[str, Any]], None]
"""Called with ("ADDED" | "MODIFIED" | "DELETED" | "SYNCED", object as JSON). "SYNCED" follows
every fresh list, with an object {"items": [...]} holding the complete list."""


def watch_forever(
    list_call: Callable[..., Any],
    handler: Handler,
    stop: threading.Event,
    what: str,
    max_backoff: float = 30.0,
    **selectors: str,
) -> None:
    """Run until ``stop`` is set: list ``list_call`` (a kubernetes client list method), hand the
    list to ``handler``, then watch from its resourceVersion; relist on any error, waiting
    0.5 s, 1 s, 2 s... up to ``max_backoff`` between failures."""
    backoff = 0.5
    while not stop.is_set():
        try:
            response = list_call(_preload_content=False, **selectors)
            listed = json.loads(response.data)
            handler("SYNCED", {"items": listed.get("items") or []})
            version = listed["metadata"]["resourceVersion"]
            backoff = 0.5
            while not stop.is_set():
                watcher = watch.Watch()  # type: ignore[no-untyped-call]
                for event in watcher.stream(  # type: ignore[no-untyped-call]
                    list_call,
                    resource_version=version,
                    timeout_seconds=60,
                    allow_watch_bookmarks=True,
                    deserialize=False,  # plain JSON: the typed models cost far more than we use
                    **selectors,
                ):
                    if stop.is_set():
                        watcher.stop()  # type: ignore[no-untyped-call]
                        break
                    kind = event["type"]
                    obj = event["object"]
                    if kind == "ERROR":
                        raise ApiException(
                            status=obj.get("code", 500), reason=obj.get("message", "watch error")
                        )
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if kind != "BOOKMARK":
                        handler(kind, obj)
        except Exception as error:  # every failure: relist after a pause
            if stop.is_set():
                return
            log.warning("watch of %s failed (%s); relisting in %.1fs", what, error, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, max_backoff)
