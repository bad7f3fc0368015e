"""``tessera-exporter``'s command line: refusals that say what to fix, and the prepared claims read
from the daemon's checkpoint without ever writing it (its help is tested with the daemon's, in
test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.driver import checkpoint
from tessera.driver.checkpoint import Checkpoint, ClaimRecord, PreparedDevice
from tessera.exporter import cli as exporter_cli


def test_environment_variables_configure_the_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("TESSERA_STATE_DIR", "/s")
    monkeypatch.setenv("TESSERA_METRICS_PORT", "9100")
    args = exporter_cli.parser().parse_args([])
    assert (args.node_name, args.state_dir, args.metrics_port) == ("gpu-7", "/s", 9100)


def test_the_bypass_loop_stops_by_default_with_a_512mi_tolerance_and_a_2_second_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = exporter_cli.parser().parse_args([])
    assert (args.bypass_action, args.bypass_tolerance, args.bypass_bound, args.bypass_period) == (
        "stop",
        512 * 1024 * 1024,
        2.0,
        0.25,
    )
    monkeypatch.setenv("TESSERA_BYPASS_ACTION", "report")
    monkeypatch.setenv("TESSERA_BYPASS_TOLERANCE", "64Mi")
    args = exporter_cli.parser().parse_args(["--bypass-bound=1.5"])
    assert (args.bypass_action, args.bypass_tolerance, args.bypass_bound) == ("report", 64 * 1024 * 1024, 1.5)


def test_a_bypass_action_other_than_stop_or_report_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        exporter_cli.parser().parse_args(["--bypass-action=ignore"])
    assert "argument --bypass-action: invalid choice: 'ignore'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the node name is required (--node-name or NODE_NAME)"),
        (["--node-name=n", "--metrics-port=0"], "the metrics port must be 1-65535, not 0"),
        (["--node-name=n", "--health-port=70000"], "the health port must be 0-65535, not 70000"),
        (["--node-name=n", "--bypass-bound=11"], "the bypass bound must be 0-10 seconds, not 11.0"),
        (
            ["--node-name=n", "--bypass-period=1"],
            "the bypass period must be more than 0 and less than 1 second, not 1.0",
        ),
        (["--node-name=n", "--nvml-timeout=0"], "the NVML timeout must be more than 0 seconds, not 0.0"),
        (
            ["--node-name=n", "--nvml-timeout=5", "--nvml-restart-after=2"],
            "--nvml-restart-after (2 s) must be at least --nvml-timeout (5 s)",
        ),
    ],
)
def test_bad_settings_stop_it_with_one_sentence(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert exporter_cli.main(argv) == 2
    assert capsys.readouterr().err == f"tessera-exporter: {message}\n"


def test_shares_come_from_the_daemons_checkpoint_read_as_it_is(tmp_path: Path) -> None:
    args = exporter_cli.parser().parse_args(["--node-name=n", f"--state-dir={tmp_path}"])
    exporter = exporter_cli.Exporter(args, kube=None)  # type: ignore[arg-type]
    assert exporter._records() == {}  # no checkpoint yet: nothing prepared
    record = ClaimRecord(
        "u1", "ns", "c1", "PrepareCompleted", (PreparedDevice(("gpu",), "n", "gpu-0", ("x",), "s1"),)
    )
    checkpoint.save(tmp_path / "checkpoint.json", Checkpoint("boot", {"u1": record}))
    assert exporter._records() == {"u1": record}
    (tmp_path / "checkpoint.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        exporter._records()  # the collector counts it; the file is not moved aside
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]
