"""Running the pinned, Go-built kubectl against a test-bed cluster."""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
from collections.abc import Iterator
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


@contextlib.contextmanager
def port_forward(
    kubeconfig: Path, namespace: str, target: str, port: int, timeout: float = 60
) -> Iterator[int]:
    """``kubectl port-forward`` of ``target`` (service/name, pod/name) ``port`` to a free local port,
    as a user reaches a ClusterIP service; yields the local port, stops kubectl afterwards. kubectl's
    output is read all along (a line per connection), so it never blocks on a full pipe."""
    argv = kubectl_argv(
        kubeconfig, "port-forward", "-n", namespace, "--address=127.0.0.1", target, f":{port}"
    )
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said: list[str] = []
    local: list[int] = []
    started = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            said.append(line)
            forwarding = _FORWARDING.match(line)
            if forwarding and not local:
                local.append(int(forwarding.group(1)))
                started.set()
        started.set()  # kubectl exited

    threading.Thread(target=read, name="port-forward", daemon=True).start()
    try:
        if not started.wait(timeout) or not local:
            raise RuntimeError(f"kubectl port-forward {target} did not start: {''.join(said)}")
        yield local[0]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> \d+")
