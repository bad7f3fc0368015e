"""The command's flags read their environment variables (leader election on unless turned off, and
then in a namespace), and /metrics says what was decided."""

from __future__ import annotations

import http.client

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, generate_latest

from tessera.admissioncheck.cli import AdmissionCheck, DecisionMetrics, parser
from tessera.admissioncheck.controller import Stats
from tessera.command import UsageError
from testbed.process import free_port


def test_flags_fall_back_to_their_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_ADMISSION_CHECK_CONTROLLER_NAME", "example.com/other")
    monkeypatch.setenv("TESSERA_ADMISSION_CHECK_SEARCH_BUDGET", "500")
    args = parser().parse_args([])
    assert args.controller_name == "example.com/other" and args.search_budget == 500
    assert parser().parse_args(["--search-budget", "7"]).search_budget == 7


def test_help_names_each_variable() -> None:
    text = parser().format_help()
    for variable in ("CONTROLLER_NAME", "HEALTH_PORT", "SEARCH_BUDGET", "LOG_LEVEL"):
        assert f"TESSERA_ADMISSION_CHECK_{variable}" in text


def test_metrics_count_decisions_by_state() -> None:
    stats = Stats()
    registry = CollectorRegistry()
    registry.register(DecisionMetrics(lambda: stats))
    assert "decision_seconds" not in generate_latest(registry).decode()  # no decision yet: no times
    for state in ("Ready", "Ready", "Pending"):
        stats.record(state, 0.002)
    text = generate_latest(registry).decode()
    assert "# TYPE tessera_admission_check_decisions_total counter" in text
    assert 'tessera_admission_check_decisions_total{state="ready"} 2.0' in text
    assert 'tessera_admission_check_decisions_total{state="pending"} 1.0' in text
    assert 'tessera_admission_check_decisions_total{state="rejected"} 0.0' in text
    assert "# TYPE tessera_admission_check_decision_seconds summary" in text
    assert 'tessera_admission_check_decision_seconds{quantile="0.5"} 0.002' in text
    assert 'tessera_admission_check_decision_seconds{quantile="0.99"} 0.002' in text


def test_leader_election_is_on_by_default_in_the_pods_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "tessera-system")
    args = parser().parse_args([])
    assert args.leader_elect is True
    assert args.leader_election_namespace == "tessera-system"
    assert args.leader_election_id == "tessera-admission-check"
    monkeypatch.setenv("TESSERA_ADMISSION_CHECK_LEADER_ELECT", "false")
    monkeypatch.setenv("TESSERA_ADMISSION_CHECK_LEADER_ELECTION_ID", "mine")
    args = parser().parse_args([])
    assert args.leader_elect is False and args.leader_election_id == "mine"
    assert parser().parse_args(["--leader-elect"]).leader_elect is True


def test_leader_election_without_a_namespace_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(UsageError, match="--leader-election-namespace"):
        AdmissionCheck(parser().parse_args([]), client.ApiClient())
    alone = AdmissionCheck(parser().parse_args(["--no-leader-elect"]), client.ApiClient())
    assert alone.elector is None and not alone.deciding()


def test_the_lease_timings_are_settings_and_must_nest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retry period < renew deadline < lease duration, or no elector is made: a leader that could
    renew no faster than its standby takes over would let two replicas decide at once."""
    monkeypatch.setenv("POD_NAMESPACE", "tessera-system")
    monkeypatch.setenv("TESSERA_ADMISSION_CHECK_LEADER_ELECTION_LEASE_DURATION", "6")
    check = AdmissionCheck(
        parser().parse_args(["--leader-election-renew-deadline=4", "--leader-election-retry-period=1"]),
        client.ApiClient(),
    )
    assert check.elector is not None
    assert (check.elector.lease_duration, check.elector.renew_deadline, check.elector.retry_period) == (
        6,
        4,
        1,
    )
    monkeypatch.delenv("TESSERA_ADMISSION_CHECK_LEADER_ELECTION_LEASE_DURATION")
    defaults = AdmissionCheck(parser().parse_args([]), client.ApiClient()).elector
    assert defaults is not None
    assert (defaults.lease_duration, defaults.renew_deadline, defaults.retry_period) == (15, 10, 2)
    with pytest.raises(UsageError, match="retry period < renew deadline < lease duration"):
        AdmissionCheck(parser().parse_args(["--leader-election-renew-deadline=20"]), client.ApiClient())


def test_the_probe_port_answers_the_probes_alone_and_the_health_port_the_metrics_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kubelet probes a port no scraper shares (issue 37); /metrics stays on the health port."""
    health, probes = free_port(), free_port()
    args = [
        "--no-leader-elect",
        "--bind-address=127.0.0.1",
        f"--health-port={health}",
        f"--probe-port={probes}",
    ]
    check = AdmissionCheck(parser().parse_args(args), client.ApiClient())
    monkeypatch.setattr(check.inventory, "start", lambda: None)  # no API server here
    monkeypatch.setattr(check.inventory, "wait_synced", lambda timeout: False)
    monkeypatch.setattr(check.controller, "start", lambda: None)
    check.start()
    try:
        assert get(probes, "/healthz") == (503, "the decision loop or the leader election is not running\n")
        assert get(probes, "/readyz") == (503, "the caches have not had their first list yet\n")
        assert get(probes, "/metrics")[0] == 404
        assert get(health, "/metrics")[0] == 200
    finally:
        check.stop()


def get(port: int, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, response.read().decode()
