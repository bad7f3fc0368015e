"""Each share's GPU memory in use over the last hour, from the Prometheus that scrapes the exporters.

One range query per page (``tessera_container_gpu_memory_used_bytes``, summed per pod), bounded in
time and in size: Prometheus is another service, and a slow or huge answer must cost the page only
its usage lines, never the page. The curves are drawn on the server as SVG polylines, so the page
needs no script.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from tessera.webview.page import Point, UsageHistory

QUERY = "sum by (namespace, pod) (tessera_container_gpu_memory_used_bytes)"
WINDOW_SECONDS = 3600
STEP_SECONDS = 60
TIMEOUT_SECONDS = 5.0
ANSWER_LIMIT = 8 * 1024 * 1024
"""Bytes of Prometheus's answer read at most: an hour of one series per share at one point a
minute is about 4 KiB, so this is thousands of shares."""


class UsageUnavailable(Exception):
    """Prometheus could not be asked, or its answer could not be read: one sentence why."""


def read(base_url: str, now: float | None = None) -> UsageHistory:
    """(namespace, pod) -> [(time, bytes in use)] over the last hour; UsageUnavailable on failure."""
    end = time.time() if now is None else now
    query = urllib.parse.urlencode(
        {"query": QUERY, "start": end - WINDOW_SECONDS, "end": end, "step": STEP_SECONDS}
    )
    url = f"{base_url.rstrip('/')}/api/v1/query_range?{query}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as answer:
            body = answer.read(ANSWER_LIMIT + 1)
    except (OSError, urllib.error.URLError) as error:
        raise UsageUnavailable(f"Prometheus at {base_url} did not answer: {error}") from None
    if len(body) > ANSWER_LIMIT:
        raise UsageUnavailable(f"Prometheus's answer is over {ANSWER_LIMIT} bytes; usage left out")
    return parse(body)


def parse(body: bytes) -> UsageHistory:
    """A query_range answer as usage history; UsageUnavailable for anything else."""
    try:
        data = json.loads(body)
        if data.get("status") != "success" or data["data"]["resultType"] != "matrix":
            raise UsageUnavailable(f"Prometheus refused the query: {str(data.get('error'))[:200]}")
        history: dict[tuple[str, str], list[Point]] = {}
        for series in data["data"]["result"]:
            labels = series["metric"]
            key = (str(labels.get("namespace", "")), str(labels.get("pod", "")))
            points = [(float(at), float(value)) for at, value in series["values"]]
            # Prometheus writes NaN and ±Inf as strings; they draw no point.
            history[key] = [(at, value) for at, value in points if math.isfinite(at) and math.isfinite(value)]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise UsageUnavailable(f"Prometheus's answer could not be read: {error!r}"[:300]) from None
    return history


def polyline(points: Sequence[Point], limit: float, width: int = 120, height: int = 24) -> str:
    """SVG polyline points for ``points`` over the hour before the last point, scaled so that
    ``limit`` (the share's memory) is the top edge; values over it are drawn at the top."""
    if not points or limit <= 0:
        return ""
    end = points[-1][0]
    start = end - WINDOW_SECONDS
    out = []
    for at, value in points:
        x = (at - start) / WINDOW_SECONDS * width
        y = height - min(max(value, 0.0), limit) / limit * height
        out.append(f"{max(0.0, x):.1f},{y:.1f}")
    return " ".join(out)
