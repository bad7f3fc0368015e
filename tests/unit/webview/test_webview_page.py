"""The web view's page from one snapshot, rendered by the real Flask app: every GPU with its shares
as bars, the waiting pods with the plugin's reasons, usage curves when Prometheus has them; every
value from the cluster escaped and bounded; headers that forbid scripts; a page read shared by the
browsers asking within the refresh."""

from __future__ import annotations

import datetime
import html
import re
from typing import Any

import pytest
from flask.testing import FlaskClient

from tessera.kubectl.snapshot import Snapshot
from tessera.webview.app import SECURITY_HEADERS, CachedPage, create_app
from tessera.webview.page import MAX_WAITING, Page, UsageHistory, build
from tests.unit.kubectl.kubectl_samples import H100, NAMESPACE, gpu_slice, snapshot, used, waiting
from tests.unit.kubectl.test_kubectl_output import HOSTILE

NOW = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.UTC)


def unschedulable(pod: dict[str, Any], minutes_ago: int = 5) -> dict[str, Any]:
    since = (NOW - datetime.timedelta(minutes=minutes_ago)).isoformat()
    pod.setdefault("status", {})["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": since}
    ]
    return pod


def cluster(annotations: dict[str, str] | None = None, pod_name: str = "waiting") -> Snapshot:
    """Two GPUs on node-a, one holding two shares; one pod asking for an A100 that waits."""
    found = snapshot(
        [gpu_slice("node-a", [80, 80])],
        [
            used("node-a", 0, "20Gi", "c1", "30", pod="train"),
            used("node-a", 0, "10Gi", "c2", "20", pod="serve"),
        ],
    )
    template, pod = waiting(
        pod_name, {"nvidia.com/gpumem": "20480"}, annotations or {"nvidia.com/use-gputype": "a100"}
    )
    found.templates = [template]
    found.pods = [unschedulable(pod)]
    return found


def client_for(page: Page) -> FlaskClient:
    return create_app(CachedPage(lambda: page, refresh=5)).test_client()


def text_of(body: str) -> str:
    """The page's visible text, markup removed and entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def test_every_gpu_and_share_is_on_the_page_with_the_waiting_pod_and_its_reason() -> None:
    answer = client_for(build(cluster(), {}, NOW)).get("/")
    assert answer.status_code == 200
    body = answer.get_data(as_text=True)
    assert body.count('class="gpu"') == 2
    assert 'data-uuid="GPU-node-a-0"' in body and 'data-uuid="GPU-node-a-1"' in body
    assert body.count('class="share-row"') == 2
    shown = text_of(body)
    assert "30Gi of 80Gi allocated" in shown and "50 % of 100 % allocated" in shown
    assert "train" in shown and "serve" in shown and H100 in shown
    assert f"{NAMESPACE}/waiting" in shown and "waiting 5 min" in shown
    assert f"no GPU's product contains 'a100' (this cluster has: {H100})" in shown


def test_the_bars_are_as_wide_as_each_shares_part_of_the_gpu() -> None:
    body = client_for(build(cluster(), {}, NOW)).get("/").get_data(as_text=True)
    memory_bar = body[body.index('aria-label="memory allocated"') :]
    widths = re.findall(r'class="share s\d" x="([\d.]+)" y="0" width="([\d.]+)"', memory_bar)[:2]
    assert widths == [("0.0", "100.0"), ("100.0", "50.0")]  # 20 and 10 GiB of 80, on 400 pixels


def test_usage_history_draws_a_curve_per_share_scaled_to_its_limit() -> None:
    start = NOW.timestamp() - 3600
    history: UsageHistory = {
        (NAMESPACE, "train"): [(start, 0.0), (start + 1800, 10 * 2**30), (start + 3600, 20 * 2**30)]
    }
    body = client_for(build(cluster(), history, NOW)).get("/").get_data(as_text=True)
    assert body.count("<polyline") == 1
    assert 'points="0.0,24.0 60.0,12.0 120.0,0.0"' in body


def test_hostile_names_and_annotations_are_escaped_and_bounded() -> None:
    found = cluster(annotations={"nvidia.com/use-gputype": HOSTILE[:2000]})
    found.slices = [gpu_slice("node-a", [80, 80], product=HOSTILE)]
    body = client_for(build(found, {}, NOW)).get("/").get_data(as_text=True)
    assert "<script>" not in body, "markup from the cluster is escaped"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body, "and shown"
    assert "\x1b" not in body and "\u202e" not in body, "control and direction characters are escaped"
    assert "\\x1b]0;owned" in body
    assert "A" * 1024 not in body, "a 10 KiB value is cut"
    assert len(body) < 64 * 1024


def test_waiting_pods_are_bounded_oldest_first_and_the_rest_counted() -> None:
    found = cluster()
    template, pod = found.templates[0], found.pods[0]
    found.pods = []
    for index in range(MAX_WAITING + 3):
        copy = {**pod, "metadata": {**pod["metadata"], "name": f"p{index}", "uid": f"u{index}"}}
        found.pods.append(unschedulable(copy, minutes_ago=1000 - index))
    page = build(found, {}, NOW)
    assert len(page.waiting) == MAX_WAITING and page.waiting_untold == 3
    assert page.waiting[0].pod == "p0", "the longest waiting first"
    assert found.templates == [template]


def test_a_pod_whose_share_fits_is_not_listed_as_waiting_for_a_gpu() -> None:
    found = cluster(annotations={"nvidia.com/use-gputype": "h100"})
    assert build(found, {}, NOW).waiting == []


def test_every_answer_forbids_scripts_frames_and_outside_resources() -> None:
    web = client_for(build(cluster(), {}, NOW))
    for path in ("/", "/healthz", "/static/webview.css"):
        answer = web.get(path)
        assert answer.status_code == 200, path
        for header, value in SECURITY_HEADERS.items():
            assert answer.headers[header] == value, (path, header)
    assert "<script" not in web.get("/").get_data(as_text=True)


def test_the_page_is_read_once_per_refresh_however_many_ask() -> None:
    reads = []
    now = [0.0]

    def read() -> Page:
        reads.append(now[0])
        return build(cluster(), {}, NOW)

    cached = CachedPage(read, refresh=5, clock=lambda: now[0])
    web = create_app(cached).test_client()
    for _ in range(3):
        web.get("/")
    now[0] = 5.0
    web.get("/")
    assert reads == [0.0, 5.0]


@pytest.mark.parametrize("error", [OSError("connection refused"), TimeoutError("timed out")])
def test_an_api_server_that_cannot_be_read_gets_a_503_with_a_sentence(error: Exception) -> None:
    def read() -> Page:
        raise error

    answer = create_app(CachedPage(read, refresh=5)).test_client().get("/")
    assert answer.status_code == 503
    assert (
        answer.get_data(as_text=True)
        == f"The API server could not be read ({type(error).__name__}); try again.\n"
    )
