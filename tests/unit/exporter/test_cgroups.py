"""A process's pod and container from its /proc/<pid>/cgroup, in every layout the kubelet and
containerd make: cgroupfs and systemd drivers, cgroup v1 (a line per hierarchy) and v2, full paths
and paths seen from inside a cgroup namespace."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.exporter import cgroups

UID = "0e5b2b4a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
CID = "4f" * 32


@pytest.mark.parametrize(
    "text",
    [
        # cgroupfs driver, cgroup v1 (the test bed's nodes: cgroupRoot /<node>, burstable pod).
        f"12:pids:/node-a/kubepods/burstable/pod{UID}/{CID}\n"
        f"4:memory:/node-a/kubepods/burstable/pod{UID}/{CID}\n"
        f"1:name=systemd:/node-a/kubepods/burstable/pod{UID}/{CID}\n",
        # cgroupfs driver, guaranteed pod (no QoS level), cgroup v2.
        f"0::/kubepods/pod{UID}/{CID}\n",
        # systemd driver, cgroup v2.
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
        # systemd driver, guaranteed pod, seen from a cgroup namespace.
        f"0::/../../kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
        # A process that made a child cgroup of its container's.
        f"0::/kubepods/besteffort/pod{UID}/{CID}/worker\n",
    ],
    ids=["cgroupfs-v1", "cgroupfs-v2-guaranteed", "systemd-v2", "systemd-cgroupns", "nested"],
)
def test_the_pod_uid_and_container_id_are_read_from_every_layout(text: str) -> None:
    assert cgroups.parse(text) == (UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-0.slice/session-1.scope\n",
        "4:memory:/process_api/d7aa6ac3d06ca2382160a7c8a55e13fc\n0::/\n",
        f"0::/kubepods/burstable/pod{UID}\n",  # the pod's own cgroup: no container
        f"0::/kubepods/burstable/pod{UID}/not-a-container-id\n",
        f"4:memory:/kubepods/pod{UID}/{CID}\n3:pids:/kubepods/pod{UID}/{'5e' * 32}\n",  # two answers
        "",
        "garbage without colons\n",
    ],
    ids=[
        "host-session",
        "other-container-runtime",
        "pod-only",
        "bad-id",
        "two-containers",
        "empty",
        "garbage",
    ],
)
def test_a_process_in_no_single_pod_container_has_no_owner(text: str) -> None:
    assert cgroups.parse(text) is None


def test_a_process_is_read_from_its_proc_entry_and_a_gone_one_has_no_owner(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    assert cgroups.container_of(tmp_path, 42) == (UID, CID)
    assert cgroups.container_of(tmp_path, 43) is None


def test_an_oversized_cgroup_file_is_read_only_up_to_the_bound(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(
        "x" * (cgroups.MAX_BYTES * 4) + f"\n0::/kubepods/pod{UID}/{CID}\n"
    )
    assert cgroups.container_of(tmp_path, 42) is None
