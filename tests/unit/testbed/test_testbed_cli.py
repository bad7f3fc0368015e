"""`tessera-cluster up` refuses bad arguments before it starts anything, with a one-line reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed import cli


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_negative_node_count_is_refused() -> None:
    result = run_cli("up", "--nodes", "-1")
    assert result.returncode == 2
    assert "--nodes must be 0 or more, not -1" in result.stderr


def test_a_non_empty_state_folder_is_refused(tmp_path: Path) -> None:
    """Reusing a folder would mix a new CA with an old cluster's etcd data."""
    (tmp_path / "etcd").mkdir()
    result = run_cli("up", "--state-dir", str(tmp_path))
    assert result.returncode == 2
    assert f"--state-dir {tmp_path} is not empty" in result.stderr


def test_help_names_every_command() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("up", "build", "sweep"):
        assert command in result.stdout


def test_real_nodes_without_root_are_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked in-process, as the suite runs as root in CI: a non-root user gets the reason, not a
    bridge error from deep inside node start-up."""
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as exited:
        cli.main(["up", "--nodes", "1"])
    assert exited.value.code == 2
    assert "real nodes (--nodes) need root" in capsys.readouterr().err


def test_up_offers_kueue() -> None:
    result = run_cli("up", "--help")
    assert result.returncode == 0
    assert "--kueue" in result.stdout
