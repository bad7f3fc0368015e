"""What a real node takes from the machine is found and given back correctly, checked without root and
without touching the machine: mount tables and shim sockets are read from and written to temporary
folders, and the steps that would change the host (ip, cgroups, kills) are replaced by recorders."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from testbed import node_host, node_runtime
from testbed.commands import CommandError
from testbed.node import NodeFactory, RealNode
from testbed.node_host import NodeBridge, mounts_under, remove_shim_sockets, shim_socket
from testbed.node_runtime import NodeRuntime, release_host_resources, sweep_stale_nodes

DEAD_PID = 2**31 - 1  # above any pid_max: no process has it


def mountinfo_line(mount_id: int, point: str) -> str:
    return f"{mount_id} 1 0:{mount_id} / {point} rw,relatime shared:1 - tmpfs tmpfs rw"


# -- mount tables ---------------------------------------------------------------------------------


def test_mounts_under_decodes_octal_escapes_and_lists_deepest_first(tmp_path: Path) -> None:
    """The kernel writes a space, tab, newline and backslash in a mount point as octal escapes; they
    are decoded (other characters, non-ASCII ones included, are kept as they are). Only the folder and
    what is below it count (not a sibling sharing its prefix), deepest first."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "\n".join(
            [
                mountinfo_line(1, "/"),
                mountinfo_line(2, "/n/node"),
                mountinfo_line(3, "/n/node/kubelet/pods/a\\040b/volumes"),
                mountinfo_line(4, "/n/node/back\\134slash/tab\\011x"),
                mountinfo_line(5, "/n/node/ünïcode"),
                mountinfo_line(6, "/n/node-2/kubelet"),
                mountinfo_line(7, "/n/node/kubelet"),
            ]
        )
        + "\n"
    )
    points = mounts_under(Path("/n/node/"), mountinfo)
    assert set(points) == {
        Path("/n/node"),
        Path("/n/node/kubelet/pods/a b/volumes"),
        Path("/n/node/back\\slash/tab\tx"),
        Path("/n/node/ünïcode"),
        Path("/n/node/kubelet"),
    }
    depths = [len(p.parts) for p in points]
    assert depths == sorted(depths, reverse=True)
    assert points[-1] == Path("/n/node")


# -- shim sockets ---------------------------------------------------------------------------------


def test_shim_socket_is_named_like_containerd_names_it() -> None:
    """SHA-256 of "<containerd socket>/<namespace>/<task id>" (and ".../debug" for the debug socket),
    in /run/containerd/s (vectors from `printf %s ... | sha256sum`)."""
    socket = Path("/run/n/containerd.sock")
    assert shim_socket(socket, "k8s.io", "abc") == Path(
        "/run/containerd/s/acb76cbf075888ef4355c59af3f4ce18b25adc5677284be1c9876ba96318aab1"
    )
    assert shim_socket(socket, "k8s.io", "abc", debug=True).name == (
        "74617badeb64606368c8b48015976655b41d80e0cf5e1bdbe8e8dcda53ca2aa2"
    )


def test_remove_shim_sockets_removes_exactly_the_sockets_of_the_nodes_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each task folder of the node's task state (<namespace>/<id>) stands for a shim socket and its
    debug socket; both go, whatever belongs to other containerds stays."""
    sockets = tmp_path / "s"
    sockets.mkdir()
    monkeypatch.setattr(node_host, "SHIM_SOCKET_DIR", sockets)
    containerd_socket = tmp_path / "node" / "containerd.sock"
    tasks = tmp_path / "node" / "tasks"
    for task in ("k8s.io/one", "k8s.io/two", "other/three"):
        (tasks / task).mkdir(parents=True)
    mine = [
        shim_socket(containerd_socket, namespace, task, debug=debug)
        for namespace, task in (("k8s.io", "one"), ("k8s.io", "two"), ("other", "three"))
        for debug in (False, True)
    ]
    others = [shim_socket(tmp_path / "another.sock", "k8s.io", "one"), sockets / "unrelated"]
    for path in [*mine, *others]:
        path.touch()
    assert all(path.parent == sockets for path in mine)

    remove_shim_sockets(containerd_socket, tasks)

    assert sorted(sockets.iterdir()) == sorted(others)


# -- the bridge -----------------------------------------------------------------------------------


class FakeIp:
    """Stands in for `ip`: fails the commands it is told to fail, records the rest."""

    def __init__(self, failures: dict[tuple[str, ...], str]) -> None:
        self.failures = failures
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str) -> str:
        self.calls.append(args)
        if args in self.failures:
            raise CommandError(2, ["ip", *args], "", self.failures[args])
        return ""


def test_claim_bridge_skips_taken_names_and_deletes_a_bridge_it_could_not_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name that exists ("File exists") is skipped; when the address of the new bridge cannot be
    set, the bridge is deleted again and the error (with ip's message) is raised."""
    ip = FakeIp(
        {
            ("link", "add", "tessera1", "type", "bridge"): "RTNETLINK answers: File exists",
            ("addr", "add", "10.244.2.1/24", "dev", "tessera2"): "Error: something else",
        }
    )
    deleted: list[str] = []
    monkeypatch.setattr(node_host, "_ip", ip)
    monkeypatch.setattr(node_host, "delete_bridge", deleted.append)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(CommandError, match="something else"):
        node_host.claim_bridge()
    assert ip.calls[-1] == ("addr", "add", "10.244.2.1/24", "dev", "tessera2")
    assert deleted == ["tessera2"]


def test_claim_bridge_raises_on_any_failure_other_than_a_taken_name(monkeypatch: pytest.MonkeyPatch) -> None:
    ip = FakeIp({("link", "add", "tessera1", "type", "bridge"): "RTNETLINK answers: Operation not permitted"})
    monkeypatch.setattr(node_host, "_ip", ip)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(CommandError, match="Operation not permitted"):
        node_host.claim_bridge()
    assert len(ip.calls) == 1


def test_claim_bridge_without_root_says_so_before_running_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    ip = FakeIp({})
    monkeypatch.setattr(node_host, "_ip", ip)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PermissionError, match="root"):
        node_host.claim_bridge()
    assert ip.calls == []


# -- giving back and sweeping ---------------------------------------------------------------------


@pytest.fixture
def host_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[object, ...]]]:
    """Replaces every node_host step release_host_resources takes with a recorder."""
    calls: list[tuple[str, tuple[object, ...]]] = []

    def recorder(name: str) -> Callable[..., None]:
        def record(*args: object) -> None:
            calls.append((name, args))

        return record

    for name in (
        "kill_processes_mentioning",
        "remove_shim_sockets",
        "remove_cgroup_tree",
        "unmount_all_under",
        "delete_bridge",
        "remove_container_log_links",
    ):
        monkeypatch.setattr(node_host, name, recorder(name))
    return calls


def test_release_host_resources_runs_every_step_and_raises_the_first_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_steps: list[tuple[str, tuple[object, ...]]]
) -> None:
    """A failing step (here: removing the cgroup) neither stops the bridge from being deleted nor the
    folder from being removed; its error is raised once everything was tried."""
    folder = tmp_path / "node"
    (folder / "logs").mkdir(parents=True)

    def failing(name: str) -> None:
        raise OSError(f"cannot remove {name}")

    monkeypatch.setattr(node_host, "remove_cgroup_tree", failing)
    with pytest.raises(OSError, match="cannot remove tessera-node"):
        release_host_resources(folder, "tessera9", "tessera-node")
    assert ("delete_bridge", ("tessera9",)) in host_steps
    assert [name for name, _ in host_steps] == [
        "kill_processes_mentioning",
        "remove_shim_sockets",
        "unmount_all_under",
        "delete_bridge",
        "remove_container_log_links",
    ]
    assert not folder.exists()


def write_node(base: Path, name: str, **info: object) -> Path:
    folder = base / name
    folder.mkdir(parents=True)
    fields = {"name": name, "bridge": None, "cgroup_root": f"tessera-{name}", **info}
    (folder / "node.json").write_text(json.dumps(fields))
    return folder


def test_sweep_cleans_nodes_of_dead_owners_and_leaves_live_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Swept: a node whose owner PID is gone, and one whose PID now belongs to a newer process
    (another start time); each with what its node.json records (no bridge if it had none yet).
    Left alone: a live owner's node, a fresh folder without node.json (being created right now).
    Removed: a folder without node.json that is minutes old (its creator was killed)."""
    released: list[tuple[Path, str | None, str]] = []
    monkeypatch.setattr(
        node_runtime, "release_host_resources", lambda *args: released.append(cast(Any, args))
    )
    me, my_start = os.getpid(), node_runtime._process_start_time(os.getpid())
    write_node(tmp_path, "live", owner_pid=me, owner_start=my_start, bridge="tessera1")
    dead = write_node(tmp_path, "dead", owner_pid=DEAD_PID, owner_start="1", bridge="tessera2")
    reused = write_node(tmp_path, "reused", owner_pid=me, owner_start="0")
    (tmp_path / "fresh").mkdir()
    old = tmp_path / "old"
    old.mkdir()
    long_ago = time.time() - 3600
    os.utime(old, (long_ago, long_ago))

    assert sweep_stale_nodes(tmp_path) == ["dead", "reused"]
    assert released == [(dead, "tessera2", "tessera-dead"), (reused, None, "tessera-reused")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dead", "fresh", "live", "reused"]


def test_sweep_cleans_every_stale_node_even_if_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempted: list[str] = []

    def release(folder: Path, bridge: str | None, cgroup_root: str) -> None:
        attempted.append(folder.name)
        if folder.name == "a":
            raise OSError("busy")

    monkeypatch.setattr(node_runtime, "release_host_resources", release)
    for name in ("a", "b"):
        write_node(tmp_path, name, owner_pid=DEAD_PID, owner_start="1")
    with pytest.raises(OSError, match="busy"):
        sweep_stale_nodes(tmp_path)
    assert attempted == ["a", "b"]


# -- a runtime's start and stop -------------------------------------------------------------------


def test_a_runtime_never_touches_the_folder_of_another_node_with_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_steps: list[tuple[str, tuple[object, ...]]]
) -> None:
    monkeypatch.setenv("TESSERA_NODE_ROOT", str(tmp_path))
    other = tmp_path / "twin"
    other.mkdir()
    (other / "node.json").write_text("{}")
    runtime = NodeRuntime("twin", [])
    with pytest.raises(FileExistsError, match="unique"):
        runtime.start()
    runtime.stop()
    assert host_steps == []
    assert (other / "node.json").read_text() == "{}"


def test_a_failed_start_gives_back_what_it_took_once_and_records_the_bridge_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_steps: list[tuple[str, tuple[object, ...]]]
) -> None:
    """The bridge is in node.json before the next thing is taken; a start that fails after it gives
    back the bridge, and a second stop() (as NodeFactory.stop_all does) gives back nothing again."""
    monkeypatch.setenv("TESSERA_NODE_ROOT", str(tmp_path))
    recorded: list[object] = []

    def failing_cgroup_root(name: str) -> None:
        recorded.append(json.loads((tmp_path / "n1" / "node.json").read_text())["bridge"])
        raise OSError("no cgroups here")

    monkeypatch.setattr(node_host, "claim_bridge", lambda: NodeBridge(7))
    monkeypatch.setattr(node_host, "create_cgroup_root", failing_cgroup_root)
    runtime = NodeRuntime("n1", [])
    with pytest.raises(OSError, match="no cgroups here"):
        runtime.start()
    assert recorded == ["tessera7"]
    assert [args for name, args in host_steps if name == "delete_bridge"] == [("tessera7",)]
    assert not (tmp_path / "n1").exists()
    calls = len(host_steps)
    runtime.stop()
    assert len(host_steps) == calls
    assert runtime.bridge is None


class FakeNode:
    def __init__(self, name: str, stopped: list[str], error: Exception | None = None) -> None:
        self.name = name
        self.stopped = stopped
        self.error = error

    def stop(self) -> None:
        self.stopped.append(self.name)
        if self.error:
            raise self.error


def test_stop_all_stops_every_node_and_runtime_and_raises_the_first_error() -> None:
    """A node whose stop fails (say, the API server is gone) does not keep the others running."""
    stopped: list[str] = []
    factory = NodeFactory(cast(Any, None))
    factory.nodes = cast(
        list[RealNode],
        [FakeNode("n1", stopped), FakeNode("n2", stopped, RuntimeError("first")), FakeNode("n3", stopped)],
    )
    factory.runtimes = cast(list[NodeRuntime], [FakeNode("r1", stopped, RuntimeError("second"))])
    with pytest.raises(RuntimeError, match="first"):
        factory.stop_all()
    assert stopped == ["n3", "n2", "n1", "r1"]
    assert (factory.nodes, factory.runtimes) == ([], [])


# -- kernel limits --------------------------------------------------------------------------------


def test_inotify_instances_are_raised_for_the_nodes_and_a_higher_setting_is_kept(tmp_path: Path) -> None:
    """A dozen nodes exhaust the kernel's default 128 inotify instances; the bed raises it, and
    never lowers what an administrator set higher."""
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    node_host.raise_inotify_instances(1024, limit)
    assert limit.read_text().strip() == "1024"
    limit.write_text("4096\n")
    node_host.raise_inotify_instances(1024, limit)
    assert limit.read_text().strip() == "4096"
