"""Which pod and container a process runs in, from its cgroup: what the kernel says, not the process.

The exporter must tie the processes NVML lists to containers without trusting anything the
container controls (its environment, files in its root). A process's cgroup is set by the runtime
before the container starts and cannot be changed from inside without write access to the cgroup
tree, which containers do not get; ``/proc/<pid>/cgroup`` is readable by anyone. Its path ends in
the pod's UID and the runtime's container ID, in either of the kubelet's cgroup drivers, for
cgroup v1 (a line per hierarchy) and v2 (one ``0::`` line):

    cgroupfs  .../kubepods/burstable/pod<uid>/<container id>
    systemd   .../kubepods-burstable-pod<uid with _>.slice/cri-containerd-<container id>.scope

A path inside a cgroup namespace (``/../..``) still ends so. The container ID is the one the kubelet
reports in the pod's status (``containerd://<id>``), which the pod index maps to the container.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_BYTES = 65536
"""More than any real /proc/<pid>/cgroup (a line per hierarchy, each a path under 4 KiB)."""

_POD = re.compile(
    r"(?:^|-)pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$"
)
_CONTAINER = re.compile(r"^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")
"""A runtime's 64-hex container ID, bare (cgroupfs) or as a systemd scope (cri-containerd-,
crio-, docker-)."""


def parse(text: str) -> tuple[str, str] | None:
    """(pod UID, container ID) that the cgroup lines ``text`` place a process in; None for a
    process outside any pod's container, or for lines that name more than one."""
    found: set[tuple[str, str]] = set()
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        components = parts[2].split("/")
        for i, component in enumerate(components[:-1]):
            pod = _POD.search(component)
            container = _CONTAINER.match(components[i + 1]) if pod else None
            if pod and container:
                found.add((pod.group(1).replace("_", "-"), container.group(1)))
                break
    return found.pop() if len(found) == 1 else None


def container_of(proc: Path, pid: int) -> tuple[str, str] | None:
    """(pod UID, container ID) of host process ``pid``, or None if it is in no pod's container or
    has exited (its /proc entry gone)."""
    try:
        with open(proc / str(pid) / "cgroup", "rb") as f:
            data = f.read(MAX_BYTES)
    except OSError:
        return None
    return parse(data.decode("utf-8", errors="replace"))
