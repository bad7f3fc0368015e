"""The local cluster cleans up after itself: on a normal stop, on a failed start, and when run by
hand as `tessera-cluster up` and stopped with SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from tessera.kube import api_client
from tessera.testbed.cluster import LocalCluster

pytestmark = pytest.mark.integration


def test_a_failed_start_stops_what_was_started_and_removes_the_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a later component cannot start, the earlier ones are not left running."""

    def scheduler_fails(self: LocalCluster) -> None:
        raise RuntimeError("scheduler failed to start")

    monkeypatch.setattr(LocalCluster, "_start_scheduler", scheduler_fails)
    cluster = LocalCluster()
    with pytest.raises(RuntimeError, match="scheduler failed to start"):
        cluster.start()
    assert cluster.processes == []
    assert not cluster.state_dir.exists()


def test_stop_removes_every_process_and_the_state_folder() -> None:
    with LocalCluster() as cluster:
        pids = [p.pid for p in cluster.processes]
        assert len(pids) == 4
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), f"pid {pid} still runs"
    assert not cluster.state_dir.exists()


def test_cluster_command_serves_until_sigterm_then_cleans_up(tmp_path: Path) -> None:
    """`tessera-cluster up` prints a usable KUBECONFIG, and SIGTERM stops every component."""
    state = tmp_path / "state"
    command = subprocess.Popen(
        [sys.executable, "-m", "tessera.testbed.cli", "up", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert command.stdout is not None
        line = command.stdout.readline().strip()
        assert line.startswith("export KUBECONFIG="), line
        kubeconfig = Path(line.removeprefix("export KUBECONFIG="))
        namespaces = client.CoreV1Api(api_client(kubeconfig)).list_namespace()
        assert "kube-system" in [n.metadata.name for n in namespaces.items if n.metadata]
        children = _children_of(command.pid)
        assert len(children) == 4, children
    finally:
        command.send_signal(signal.SIGTERM)
        assert command.wait(30) == 0
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)
    # A state folder given on the command line belongs to the caller and is kept (logs to read).
    assert (state / "logs" / "kube-apiserver.log").exists()


def _children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
