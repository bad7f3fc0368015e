"""The local cluster cleans up after itself: on a normal stop, on a failed start, and when run by
hand as `tessera-cluster up` and stopped with SIGTERM."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from tessera.kube import api_client
from testbed import cluster as cluster_module
from testbed.cluster import LocalCluster
from testbed.polling import Fatal
from testbed.process import ManagedProcess
from testbed.process import free_port as real_free_port

pytestmark = pytest.mark.integration


def test_a_failed_start_stops_what_was_started_and_removes_the_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a later component cannot start - here kube-scheduler, because another process listens
    on the port it is given - the start fails with that component's own complaint and its log,
    and the earlier ones (etcd, API server, controller manager) are not left running, nor is the
    state folder.

    The failure is real: this test holds a listening socket on a port and has free_port hand
    that port to the scheduler (only to it, so the three components before it start as usual),
    and kube-scheduler itself fails to bind and exits."""
    spawned: list[int] = []
    spawn = LocalCluster._spawn

    def recording_spawn(self: LocalCluster, name: str, *argv: str | Path) -> ManagedProcess:
        process = spawn(self, name, *argv)
        spawned.append(process.pid)
        return process

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as occupier:
        occupier.bind(("127.0.0.1", 0))
        occupier.listen()
        taken: int = occupier.getsockname()[1]

        def free_port() -> int:
            return taken if sys._getframe(1).f_code.co_name == "_start_scheduler" else real_free_port()

        monkeypatch.setattr(cluster_module, "free_port", free_port)
        monkeypatch.setattr(LocalCluster, "_spawn", recording_spawn)
        cluster = LocalCluster()
        with pytest.raises(
            Fatal, match=r"kube-scheduler exited with status \d+ before healthy scheduler"
        ) as failure:
            cluster.start()
    assert f"127.0.0.1:{taken}" in str(failure.value)
    assert "address already in use" in str(failure.value)
    assert len(spawned) == 4  # etcd, API server, controller manager, and the scheduler that failed
    assert all(_gone(pid) for pid in spawned)
    assert not cluster.state_dir.exists()


def test_stop_removes_every_process_and_the_state_folder() -> None:
    with LocalCluster() as cluster:
        pids = [p.pid for p in cluster.processes]
        assert len(pids) == 4
    assert all(_gone(pid) for pid in pids)
    assert not cluster.state_dir.exists()


def test_cluster_command_serves_until_sigterm_then_cleans_up(tmp_path: Path) -> None:
    """`tessera-cluster up` prints a usable KUBECONFIG, and SIGTERM stops every component."""
    state = tmp_path / "state"
    stderr = tmp_path / "stderr.log"
    with stderr.open("w") as errors:
        command = subprocess.Popen(
            [sys.executable, "-m", "testbed.cli", "up", "--state-dir", str(state)],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    children: list[int] = []
    try:
        line = _first_line(command, timeout=120, stderr=stderr)
        assert line.startswith("export KUBECONFIG="), line
        kubeconfig = Path(line.removeprefix("export KUBECONFIG="))
        namespaces = client.CoreV1Api(api_client(kubeconfig)).list_namespace()
        assert "kube-system" in [n.metadata.name for n in namespaces.items if n.metadata]
        children = _children_of(command.pid)
        assert len(children) == 4, children
    finally:
        command.send_signal(signal.SIGTERM)
        # Four components, each given up to 10 s to stop before it is killed.
        assert command.wait(60) == 0, stderr.read_text()
    assert all(_gone(pid) for pid in children)
    # A state folder given on the command line belongs to the caller and is kept (logs to read).
    assert (state / "logs" / "kube-apiserver.log").exists()


def _first_line(command: subprocess.Popen[str], timeout: float, stderr: Path) -> str:
    """The command's first line of output, or a failure that shows what it wrote to stderr."""
    assert command.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if command.poll() is not None:
            pytest.fail(f"tessera-cluster exited with {command.returncode}:\n{stderr.read_text()}")
        ready, _, _ = select.select([command.stdout], [], [], 1.0)
        if ready:
            return command.stdout.readline().strip()
    pytest.fail(f"tessera-cluster printed nothing in {timeout:.0f}s:\n{stderr.read_text()}")


def _children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
