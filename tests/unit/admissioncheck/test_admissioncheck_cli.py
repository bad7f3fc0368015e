"""The command's flags read their environment variables, and /metrics says what was decided."""

from __future__ import annotations

import pytest

from tessera.admissioncheck.cli import metrics_text, parser
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


class FakeController:
    def __init__(self) -> None:
        self.stats = Stats()


def test_metrics_count_decisions_by_state() -> None:
    controller = FakeController()
    for state in ("Ready", "Ready", "Pending"):
        controller.stats.record(state, 0.002)
    text = metrics_text(controller)  # type: ignore[arg-type]
    assert 'tessera_admission_check_decisions_total{state="ready"} 2' in text
    assert 'tessera_admission_check_decisions_total{state="pending"} 1' in text
    assert 'tessera_admission_check_decision_seconds{quantile="0.5"} 0.002000' in text
