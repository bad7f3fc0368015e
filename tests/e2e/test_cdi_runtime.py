"""A node's containerd applies CDI specs from the node's CDI directory to containers that name a CDI
device: the step between a DRA driver's NodePrepareResources and the workload."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tessera.files import write_atomically
from testbed.commands import CommandError
from testbed.images import TOOLS_IMAGE
from testbed.node_runtime import NodeRuntime
from testbed.polling import poll_until

pytestmark = pytest.mark.e2e

CDI_KIND = "probe.tessera.dev/test"


def write_cdi_spec(directory: Path, device: str, env: str, host_file: Path) -> None:
    """A CDI spec with one device that adds an environment variable, a read-only bind mount and a
    device node. Written under a temporary name first: containerd watches the folder and must never
    read half a file."""
    spec = {
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": [
            {
                "name": device,
                "containerEdits": {
                    "env": [env],
                    "mounts": [
                        {
                            "hostPath": str(host_file),
                            "containerPath": "/cdi/probe.txt",
                            "options": ["ro", "bind"],
                        }
                    ],
                    "deviceNodes": [{"path": "/dev/tessera-probe", "hostPath": "/dev/null"}],
                },
            }
        ],
    }
    write_atomically(directory / f"probe.tessera.dev-{device}.json", json.dumps(spec))


def run_to_exit(runtime: NodeRuntime, work: Path, cdi_device: str, script: str) -> str:
    """Run `script` in a fresh pod sandbox through the CRI, with the CDI device listed in the
    container's CDI_devices, and return the container's output once it has exited 0."""
    pod_config = work / "pod.json"
    pod_config.write_text(
        json.dumps(
            {
                "metadata": {"name": "cdi-probe", "namespace": "e2e", "uid": str(uuid.uuid4()), "attempt": 0},
                "log_directory": str(work / "logs"),
                # Inside the runtime's own cgroup tree, which the test bed removes with the runtime.
                "linux": {"cgroup_parent": f"/{runtime.cgroup_root}/cdi-probe"},
            }
        )
    )
    container_config = work / "container.json"
    container_config.write_text(
        json.dumps(
            {
                "metadata": {"name": "probe"},
                "image": {"image": TOOLS_IMAGE},
                "command": ["/bin/sh", "-c", script],
                "log_path": "probe.log",
                "CDI_devices": [{"name": cdi_device}],
                "linux": {},
            }
        )
    )
    sandbox = runtime.crictl("runp", str(pod_config)).strip()
    try:
        container = runtime.crictl("create", sandbox, str(container_config), str(pod_config)).strip()
        runtime.crictl("start", container)

        def exited() -> dict[str, object] | None:
            status: dict[str, object] = json.loads(runtime.crictl("inspect", container))["status"]
            return status if status["state"] == "CONTAINER_EXITED" else None

        status = poll_until(exited, 120, "the probe container to exit")
        output = runtime.crictl("logs", container)
        assert status["exitCode"] == 0, output
        return output
    finally:
        runtime.crictl("rmp", "--force", sandbox)


def test_cdi_device_edits_reach_the_container(node_runtime: NodeRuntime, tmp_path: Path) -> None:
    """A container created through the CRI with a CDI device name gets that device's edits, as seen
    from inside the container: the spec's environment variable, its bind mount (with the host file's
    content, mounted read-only) and its device node (a character device at the spec's path)."""
    token = uuid.uuid4().hex
    device = f"dev-{token[:8]}"
    host_file = tmp_path / "probe.txt"
    host_file.write_text(f"content-{token}\n")
    write_cdi_spec(node_runtime.paths.cdi_dir, device, f"TESSERA_CDI_PROBE={token}", host_file)

    script = (
        'echo "env=$TESSERA_CDI_PROBE"; '
        'echo "file=$(cat /cdi/probe.txt)"; '
        "grep ' /cdi/probe.txt ' /proc/mounts | grep -q '[ ,]ro[ ,]' && echo mount=ro; "
        "test -c /dev/tessera-probe && echo devnode=char"
    )
    out = run_to_exit(node_runtime, tmp_path, f"{CDI_KIND}={device}", script).split()
    assert out == [f"env={token}", f"file=content-{token}", "mount=ro", "devnode=char"]


def test_unknown_cdi_device_fails_container_creation(node_runtime: NodeRuntime, tmp_path: Path) -> None:
    """Naming a CDI device that no spec defines makes container creation fail (the runtime does not
    start a container without the device it was asked for)."""
    with pytest.raises(CommandError) as failure:
        run_to_exit(node_runtime, tmp_path, f"{CDI_KIND}=absent-{uuid.uuid4().hex[:8]}", "true")
    assert "unresolvable CDI devices" in failure.value.stderr
