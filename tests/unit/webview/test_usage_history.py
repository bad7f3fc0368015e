"""Reading Prometheus's range answer for the usage curves: whatever comes back costs the page its
curves at most, never the page (the query against a real Prometheus is in
tests/integration/test_metrics_exporter.py)."""

from __future__ import annotations

import json

import pytest

from tessera.webview.usage_history import WINDOW_SECONDS, UsageUnavailable, parse, polyline


def answer(values: list[list[object]], metric: dict[str, str] | None = None) -> bytes:
    series = {"metric": metric or {"namespace": "team", "pod": "train"}, "values": values}
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [series]}}).encode()


def test_each_pods_series_is_read_by_namespace_and_pod() -> None:
    assert parse(answer([[100, "5"], [160, "7"]])) == {("team", "train"): [(100.0, 5.0), (160.0, 7.0)]}


def test_nan_and_infinite_values_draw_no_point() -> None:
    assert parse(answer([[100, "NaN"], [160, "+Inf"], [220, "3"]])) == {("team", "train"): [(220.0, 3.0)]}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b'{"status": "error", "error": "bad query"}',
        json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode(),
        answer([["x", "1"]]),
        answer([[1]]),
        json.dumps(
            {"status": "success", "data": {"resultType": "matrix", "result": [{"values": []}]}}
        ).encode(),
    ],
)
def test_an_answer_that_is_not_a_range_answer_is_unavailable_with_a_sentence(body: bytes) -> None:
    with pytest.raises(UsageUnavailable):
        parse(body)


def test_a_curve_is_scaled_to_the_limit_and_values_over_it_stay_at_the_top() -> None:
    points = [(0.0, 0.0), (WINDOW_SECONDS / 2, 50.0), (float(WINDOW_SECONDS), 500.0)]
    assert polyline(points, limit=100.0) == "0.0,24.0 60.0,12.0 120.0,0.0"
    assert polyline([], limit=100.0) == "" and polyline(points, limit=0) == ""
