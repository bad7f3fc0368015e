"""The exporter's own text rendering says exactly what prometheus_client's would, and its server
speaks HTTP the way Prometheus expects (gzip when asked, /metrics only)."""

from __future__ import annotations

import gzip
import re
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from tessera.exporter import exposition
from tessera.exporter.collector import _HELP, CONTAINER_LABELS, GPU_LABELS
from tessera.exporter.server import MetricsServer

# Label values a pod or GPU name could hold that need escaping in the text format.
AWKWARD = ["plain", 'quote"d', "back\\slash", "new\nline", "ünïcode", ""]


class Gauges(Collector):
    def collect(self) -> Iterator[Metric]:
        help_text = 'Help with a "quote",\\ and\na newline.'
        family = GaugeMetricFamily("tessera_test_ratio", help_text, labels=["a", "b"])
        for i, value in enumerate(AWKWARD):
            family.add_metric([value, str(i)], i / 3)
        family.add_metric(["inf", "x"], float("inf"))
        yield family
        yield GaugeMetricFamily("tessera_test_unlabelled", "No labels.", value=7)


def registry_with_every_kind() -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(Gauges())
    Counter("tessera_test_events", "Events.", ["source"], registry=registry).labels("x").inc(3)
    Histogram("tessera_test_seconds", "Seconds.", registry=registry).observe(0.2)
    return registry


def samples(text: str) -> list[tuple[str, frozenset[tuple[str, str]], float]]:
    return sorted(
        (s.name, frozenset(s.labels.items()), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    )


def test_rendering_parses_to_exactly_what_prometheus_clients_own_text_gives() -> None:
    registry = registry_with_every_kind()
    ours = exposition.render(registry).decode()
    theirs = generate_latest(registry).decode()
    assert samples(ours) == samples(theirs)
    helps = {f.name: f.documentation for f in text_string_to_metric_families(ours)}
    assert helps["tessera_test_ratio"] == 'Help with a "quote",\\ and\na newline.'


def test_families_come_out_in_the_order_prometheus_clients_own_text_gives() -> None:
    registry = registry_with_every_kind()
    ours = re.findall(r"^# TYPE (\S+)", exposition.render(registry).decode(), flags=re.MULTILINE)
    theirs = re.findall(r"^# TYPE (\S+)", generate_latest(registry).decode(), flags=re.MULTILINE)
    assert ours == theirs
    assert ours[:2] == ["tessera_test_ratio", "tessera_test_unlabelled"]


def test_the_exporters_metric_and_label_names_need_no_escaping() -> None:
    """The fast path writes gauge label names as they are: they must be plain identifiers."""
    identifier = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
    for name in (*CONTAINER_LABELS, *GPU_LABELS, *_HELP):
        assert identifier.fullmatch(name), name


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    running = MetricsServer("127.0.0.1", 0, registry_with_every_kind())
    running.start()
    yield running
    running.stop()


def test_metrics_are_gzip_compressed_when_the_scraper_accepts_it_and_plain_otherwise(
    server: MetricsServer,
) -> None:
    url = f"http://127.0.0.1:{server.port}/metrics"
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert response.headers["Content-Type"] == exposition.CONTENT_TYPE
        compressed = gzip.decompress(response.read()).decode()
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Encoding"] is None
        plain = response.read().decode()
    assert samples(compressed) == samples(plain)
    assert ("tessera_test_unlabelled", frozenset(), 7.0) in samples(plain)


def test_any_other_path_is_not_found(server: MetricsServer) -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=10)
    assert raised.value.code == 404


def test_stopping_twice_is_harmless_and_frees_the_port(server: MetricsServer) -> None:
    port = server.port
    server.stop()
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
