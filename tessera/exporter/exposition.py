"""The Prometheus text format (version 0.0.4) of a registry, written fast where the volume is.

A node's scrape is a few hundred gauge samples with seven labels each (one per container and GPU).
prometheus_client renders every label name through its UTF-8 name checks, character by character
for OpenMetrics, which made rendering three fifths of a scrape's CPU. Gauge families are written
here directly: their label names are the exporter's own fixed identifiers (a unit test holds them
to Prometheus's rule), so only label values and help texts need escaping. Every other family type
(the daemon's counters and histogram: a handful of samples) is written by prometheus_client
itself. The text format is the one every Prometheus accepts; OpenMetrics adds nothing to gauges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_format_value: Callable[[float], str] = floatToGoString  # prometheus_client's, unannotated


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Families(Collector):
    """Already collected families, for prometheus_client's renderer."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _gauge(family: Metric, out: list[str]) -> None:
    out.append(f"# HELP {family.name} {_escape_help(family.documentation)}\n")
    out.append(f"# TYPE {family.name} gauge\n")
    for sample in family.samples:
        if sample.labels:
            labels = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sample.labels.items())
            out.append(f"{sample.name}{{{labels}}} {_format_value(sample.value)}\n")
        else:
            out.append(f"{sample.name} {_format_value(sample.value)}\n")


def render(registry: Collector) -> bytes:
    """One scrape of ``registry`` in the text format, families in the order they are collected."""
    out: list[str] = []
    others: list[Metric] = []
    for family in registry.collect():
        if family.type == "gauge" and all(s.timestamp is None for s in family.samples):
            if others:
                out.append(generate_latest(_Families(others)).decode())
                others = []
            _gauge(family, out)
        else:
            others.append(family)
    if others:
        out.append(generate_latest(_Families(others)).decode())
    return "".join(out).encode()
