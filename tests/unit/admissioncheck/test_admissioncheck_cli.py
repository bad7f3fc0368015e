"""The command's flags read their environment variables, and /metrics says what was decided."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tessera.admissioncheck.cli import DecisionMetrics, parser
from tessera.admissioncheck.controller import Stats


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
