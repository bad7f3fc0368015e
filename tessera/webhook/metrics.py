"""The webhook's own Prometheus metrics: reviews by outcome, latency, templates created, connections
accepted, and the slice cache's view; every outcome series starts at zero so rates exist before the
first event."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

OUTCOMES = ("ignored", "untouched", "converted", "denied", "malformed", "error")


class WebhookMetrics:
    """One registry per server, so tests and benchmarks can run several servers in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reviews = Counter(
            "tessera_webhook_reviews",
            "Admission reviews answered, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in OUTCOMES:
            self.reviews.labels(outcome)
        self.latency = Histogram(
            "tessera_webhook_review_seconds",
            "Time from reading a review to sending its answer.",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.templates_created = Counter(
            "tessera_webhook_template_writes",
            "ResourceClaimTemplate create calls (AlreadyExists included).",
            registry=self.registry,
        )
        self.refused = Counter(
            "tessera_webhook_requests_refused",
            "Requests answered with a 4xx before a review was decided (403 a certificate of a name "
            "not allowed, 408 too slow, 411/413/431 over a limit, 400 malformed), by status.",
            ["status"],
            registry=self.registry,
        )
        self.connections = Counter(
            "tessera_webhook_connections",
            "Connections accepted on the admission port, each a TLS handshake (those closed at once "
            "over the connection limit included). Against reviews_total it shows whether the API "
            "server reuses its connections or pays a handshake per review.",
            registry=self.registry,
        )
        self.gpu_sizes = Gauge(
            "tessera_webhook_gpu_memory_sizes",
            "Distinct GPU memory sizes in the watched ResourceSlices.",
            registry=self.registry,
        )
