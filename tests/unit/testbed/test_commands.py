"""A failing command's error says which command it was, how it ended and what it printed on stderr."""

from __future__ import annotations

import subprocess

import pytest

from testbed.commands import CommandError, run_checked


def test_run_checked_returns_standard_output() -> None:
    assert run_checked(["sh", "-c", "echo out; echo err >&2"]) == "out\n"


def test_a_failure_carries_the_command_status_and_stderr() -> None:
    with pytest.raises(CommandError) as failure:
        run_checked(["sh", "-c", "echo partial; echo 'it broke' >&2; exit 3"])
    error = failure.value
    assert isinstance(error, subprocess.CalledProcessError)
    assert (error.returncode, error.stdout, error.stderr) == (3, "partial\n", "it broke\n")
    assert str(error) == "`sh -c echo partial; echo 'it broke' >&2; exit 3` exited with status 3: it broke"
