"""Running a short command whose failure is an error: the one place the test bed does so, so every such
failure says which command it was, how it ended and what it printed on its standard error."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence


class CommandError(subprocess.CalledProcessError):
    """A command exited non-zero. A CalledProcessError (callers may catch either), whose message
    carries the command's standard error instead of only its exit status."""

    def __str__(self) -> str:
        command = " ".join(self.cmd) if isinstance(self.cmd, list) else str(self.cmd)
        stderr = (self.stderr or "").strip() or "(nothing on stderr)"
        return f"`{command}` exited with status {self.returncode}: {stderr}"


def run_checked(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run argv to completion and return its standard output; raise CommandError if it exits
    non-zero (subprocess.TimeoutExpired if it runs past `timeout` seconds)."""
    command = [os.fspath(a) for a in argv]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env) if env is not None else None,
        check=False,
    )
    if result.returncode != 0:
        raise CommandError(result.returncode, command, result.stdout, result.stderr)
    return result.stdout
