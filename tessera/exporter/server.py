"""``/metrics`` on port 31995 (``--metrics-port``): tessera/serving.py's server with the exporter's renderer.

Each scrape runs the collectors on a thread of its own, so a slow scrape never holds up another. It
answers in the Prometheus text format written by tessera/exporter/exposition.py (which says why not
OpenMetrics), gzip-compressed when the scraper accepts it, as Prometheus does by default. Bound to
``--metrics-address`` (all addresses by default, so Prometheus in the cluster can reach every node; a
node address or loopback where that is too wide).
"""

from __future__ import annotations

from prometheus_client.registry import Collector

from tessera.exporter import exposition
from tessera.serving import Endpoints, HttpServer, Metrics


class MetricsServer(HttpServer):
    """``/metrics`` of ``registry``; any other path is 404."""

    def __init__(self, address: str, port: int, registry: Collector) -> None:
        metrics = Metrics(lambda: exposition.render(registry), exposition.CONTENT_TYPE)
        super().__init__("metrics", address, port, Endpoints(metrics=metrics))
