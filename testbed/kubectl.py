"""Running the pinned, Go-built kubectl against a test-bed cluster."""

from __future__ import annotations

from pathlib import Path

from testbed.binaries import binary
from testbed.commands import run_checked


def kubectl_argv(kubeconfig: Path, *args: str) -> list[str]:
    """The command line of kubectl against the cluster of `kubeconfig`, for callers that run it
    themselves (to look at a failing exit status, for example)."""
    return [str(binary("kubectl")), f"--kubeconfig={kubeconfig}", *args]


def kubectl(kubeconfig: Path, *args: str, timeout: float = 60) -> str:
    """Run kubectl and return its output; a failure raises CommandError with kubectl's message."""
    return run_checked(kubectl_argv(kubeconfig, *args), timeout=timeout)
