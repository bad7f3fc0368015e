"""The shipped alert rules and dashboard: they parse, and every metric they query is one the exporter
really produces (names taken from a real collection, not from a list kept by hand).

``promtool check rules`` runs on the same file in tests/integration/test_metrics_exporter.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.exporter.collector import FAMILIES
from tessera.exporter.containers import ContainerRef
from tessera.quantity import GiB
from tessera.shim import format as shim_format
from tests.unit.driver.driver_samples import gpu
from tests.unit.exporter.test_exporter import Bed, sample, write_claim

FILES = Path(__file__).resolve().parents[3] / "charts" / "tessera" / "files"
RULES = FILES / "alert-rules.yaml"
DASHBOARD = FILES / "grafana-dashboard.json"

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, keywords,
    label names in grouping clauses, or anything inside matchers, ranges and strings."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in _KEYWORDS:
            continue
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent or suffix of a number
        names.add(match.group())
    return names


@pytest.fixture
def exported(tmp_path: Path) -> set[str]:
    """Every sample name one scrape of a node with a prepared, running claim produces."""
    bed = Bed(tmp_path, [gpu(0)])
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(bed.gpus[0].uuid, 8 * GiB, 30)])
    ref = ContainerRef("ns", "p1", "main")
    bed.pods[("ns", "c1")] = [ref]
    bed.fake_process(100, ref)
    bed.samples[bed.gpus[0].uuid] = sample(processes={100: 30}, compute_memory={100: GiB})
    return {name for name, _ in bed.scrape()}


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_metric_names_are_found_in_promql_without_functions_labels_or_keywords() -> None:
    expr = 'histogram_quantile(0.99, sum by (node, le) (rate(a_bucket{n=~"$n"}[5m]))) / b > 1e3 and on(x) c'
    assert metric_names(expr) == {"a_bucket", "b", "c"}


def test_the_rules_raise_the_three_alerts_the_issue_asks_for_and_name_only_exported_metrics(
    exported: set[str],
) -> None:
    by_name = {rule["alert"]: rule for rule in rules()}
    assert {"TesseraContainerGpuMemoryNearLimit", "TesseraGpuAllocatedButIdle", "TesseraGpuUnhealthy"} <= set(
        by_name
    )
    assert by_name["TesseraGpuAllocatedButIdle"]["for"] == "30m"
    assert "tessera_gpu_memory_unaccounted_bytes" in by_name["TesseraGpuMemoryUnaccounted"]["expr"]
    assert "0.9" in by_name["TesseraContainerGpuMemoryNearLimit"]["expr"]
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exported, (rule["alert"], names - exported)
        assert rule["annotations"]["summary"] and rule["labels"]["severity"]


def test_every_dashboard_query_names_only_exported_metrics(exported: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    assert len(queries) >= 10
    used: set[str] = set()
    for query in queries:
        names = metric_names(re.sub(r"label_values\(([a-z_]+), [a-z_]+\)", r"\1", query))
        assert names, query
        assert names <= exported, (query, names - exported)
        used |= names
    # The dashboard shows every per-container and per-GPU family.
    assert set(FAMILIES) <= used
