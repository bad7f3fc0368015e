"""Tessera's node daemon on a test-bed node, over simulated GPUs, under the chart's RBAC.

What the DaemonSet will do on a real cluster, done with processes: the daemon (``tessera-driver``)
and, beside it, the metrics exporter (``tessera-exporter``, the chart's second DaemonSet) run
with the simulated driver's environment, authenticated as a service account that holds only the
ClusterRole rules the chart installs (``charts/tessera/files/kubeletplugin-rules.yaml``; the exporter
its own, ``exporter-rules.yaml``), pointed at
the node's kubelet root and CDI folder. Prepared containers get the simulated libraries and the
node's simulator state through the daemon's own CDI edits (``--driver-source own``), exactly as a node
without NVIDIA's toolkit gets the real ones. Works for real nodes (kubelet, containerd) and for
kubelet-less fake Node objects (the tests then call the DRA socket themselves).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from simgpu.config import GiB, NodeSpec, library_dir, make_gpus, process_env, write_config
from simgpu.node import Node
from tessera.driver.config import DriverConfig
from tessera.driver.health import dra_socket_answers
from tessera.kube import api_client, create_if_absent, raw_json
from tessera.names import DEVICE_CLASS, DRIVER_NAME, MIG_DEVICE_CLASS
from testbed.accounts import service_account_token, token_kubeconfig
from testbed.cluster import LocalCluster
from testbed.process import ManagedProcess, free_port

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
CHART_FILES = REPO / "charts" / "tessera" / "files"
RULES_FILE = CHART_FILES / "kubeletplugin-rules.yaml"
EXPORTER_RULES_FILE = CHART_FILES / "exporter-rules.yaml"
NAMESPACE = "tessera-system"
ACCOUNT = "tessera-driver"
EXPORTER_ACCOUNT = "tessera-exporter"


def driver_kubeconfig(
    cluster: LocalCluster,
    node_name: str,
    path: Path,
    rules_file: Path = RULES_FILE,
    account: str = ACCOUNT,
) -> Path:
    """A kubeconfig for the daemon's service account (or, with ``rules_file`` and ``account``, the
    exporter's), bound to the chart's ClusterRole rules only, as the chart gives each its own.

    The token is bound to the Node, so it carries the node's name as a DaemonSet pod's token does:
    the API server then lets it write claim status only for claims allocated on that node."""
    token = service_account_token(
        api_client(cluster.admin_kubeconfig),
        NAMESPACE,
        account,
        yaml.safe_load(rules_file.read_text()),
        bound_to={"apiVersion": "v1", "kind": "Node", "name": node_name},
    )
    return token_kubeconfig(cluster, token, account, path)


def ensure_device_class(kube: client.ApiClient) -> None:
    """The DeviceClass the chart installs: every device of Tessera's driver."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER_NAME}'"}}]},
    }
    create_if_absent(
        client.ResourceV1Api(kube).create_device_class, client.V1DeviceClass.model_validate(body)
    )


def ensure_mig_device_class(kube: client.ApiClient) -> bool:
    """The DeviceClass the chart installs for MIG instances (charts/tessera/templates/deviceclass.yaml);
    whether this call made it."""
    expression = f"device.driver == '{DRIVER_NAME}' && device.attributes['{DRIVER_NAME}'].type == 'mig'"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": MIG_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }
    return create_if_absent(
        client.ResourceV1Api(kube).create_device_class, client.V1DeviceClass.model_validate(body)
    )


class DriverNode:
    """The daemon for one node and that node's simulated GPUs."""

    def __init__(
        self,
        cluster: LocalCluster,
        node_name: str,
        kubelet_root: Path | None = None,
        cdi_dir: Path | None = None,
        gpus: int = 4,
        memory_bytes: int = 80 * GiB,
        health_interval: float = 1.0,
        cleanup_interval: float = 60.0,
        metrics_address: str = "127.0.0.1",
        metrics_port: int | None = None,
        exporter_args: Sequence[str] = (),
        daemon_args: Sequence[str] = (),
    ) -> None:
        self.cluster = cluster
        self.node_name = node_name
        # Short: the sockets under it must fit 108 bytes.
        self.work_dir = Path(tempfile.mkdtemp(prefix="tdrv-"))
        self.kubelet_root = kubelet_root or self.work_dir / "kubelet"
        self.cdi_dir = cdi_dir or self.work_dir / "cdi"
        self.state_dir = self.work_dir / "state"
        self.sim_dir = self.work_dir / "simgpu"
        self.sim_dir.mkdir()
        spec = NodeSpec(
            state_file=self.sim_dir / "state",
            gpus=make_gpus(gpus, node_name, memory_bytes=memory_bytes),
        )
        self.simgpu = Node(spec, write_config(spec, self.sim_dir / "simgpu.conf"))
        self.boot_id_file = self.work_dir / "boot_id"
        self.boot_id_file.write_text(f"{uuid.uuid4()}\n")
        self.kubeconfig = driver_kubeconfig(cluster, node_name, self.work_dir / "kubeconfig")
        self.exporter_kubeconfig = driver_kubeconfig(
            cluster, node_name, self.work_dir / "exporter.kubeconfig", EXPORTER_RULES_FILE, EXPORTER_ACCOUNT
        )
        self.health_interval = health_interval
        self.cleanup_interval = cleanup_interval
        self.health_port = 0
        self.exporter_health_port = 0
        self.metrics_address = metrics_address
        self.fixed_metrics_port = metrics_port
        """None: a free loopback port at each start (many test nodes share one host); a real node
        passes its own address and METRICS_PORT, as a DaemonSet on its host network would."""
        self.metrics_port = 0
        self.exporter_args = list(exporter_args)
        """More tessera-exporter flags (its bypass loop's action, tolerance and bound)."""
        self.daemon_args = list(daemon_args)
        """More tessera-driver flags (its API server bounds)."""
        self.process: ManagedProcess | None = None
        self.exporter: ManagedProcess | None = None
        self.starts = 0

    @property
    def dra_socket(self) -> Path:
        return DriverConfig(self.node_name, kubelet_root=self.kubelet_root).dra_socket

    @property
    def registration_socket(self) -> Path:
        return DriverConfig(self.node_name, kubelet_root=self.kubelet_root).registration_socket

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tessera.driver.cli",
            f"--node-name={self.node_name}",
            f"--kubeconfig={self.kubeconfig}",
            f"--kubelet-root={self.kubelet_root}",
            f"--cdi-dir={self.cdi_dir}",
            f"--state-dir={self.state_dir}",
            "--driver-source=own",
            f"--driver-library-dir={library_dir()}",
            f"--container-env=SIMGPU_CONFIG={self.simgpu.config}",
            f"--container-mount={self.sim_dir}",
            f"--boot-id-file={self.boot_id_file}",
            f"--health-interval={self.health_interval}",
            f"--cleanup-interval={self.cleanup_interval}",
            f"--health-port={self.health_port}",
            "--health-address=127.0.0.1",
            "--log-level=debug",
            *self.daemon_args,
        ]

    def exporter_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tessera.exporter.cli",
            f"--node-name={self.node_name}",
            f"--kubeconfig={self.exporter_kubeconfig}",
            f"--state-dir={self.state_dir}",
            f"--metrics-port={self.metrics_port}",
            f"--metrics-address={self.metrics_address}",
            f"--health-port={self.exporter_health_port}",
            "--health-address=127.0.0.1",
            "--log-level=debug",
            *self.exporter_args,
        ]

    def start(self, crash_point: str | None = None, extra_args: Sequence[str] = ()) -> None:
        """Start the daemon (again), with ``extra_args`` added to its command line, and the exporter
        anew. With ``crash_point``, the daemon kills itself at that step of its next prepare
        (testbed/crashing_driver.py)."""
        assert self.process is None or not self.process.running(), "already running"
        if self.exporter is not None:
            self.exporter.stop()
        self.starts += 1
        self.health_port = free_port()
        self.exporter_health_port = free_port()
        self.metrics_port = self.fixed_metrics_port or free_port()
        env = process_env(self.simgpu.config)
        env.pop("KUBECONFIG", None)
        argv = [*self.argv(), *extra_args]
        if crash_point:
            argv[1:3] = ["-m", "testbed.crashing_driver", crash_point]
        self.process = ManagedProcess(f"tessera-driver-{self.starts}", argv, self.work_dir, env=env)
        self.exporter = ManagedProcess(
            f"tessera-exporter-{self.starts}", self.exporter_argv(), self.work_dir, env=env
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        if self.exporter is not None:
            self.exporter.stop()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def reboot(self) -> None:
        """What a reboot changes for the daemon: a new boot ID (the caller restarts it)."""
        self.boot_id_file.write_text(f"{uuid.uuid4()}\n")

    def get(self, path: str) -> tuple[int, str]:
        """GET one of the daemon's health endpoints: (status, body)."""
        return _get(self.health_port, path)

    def exporter_get(self, path: str) -> tuple[int, str]:
        """GET one of the exporter's health endpoints (/healthz, /readyz): (status, body)."""
        return _get(self.exporter_health_port, path)

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_address}:{self.metrics_port}/metrics"

    def scrape(self) -> str:
        """One scrape of the exporter's /metrics, as Prometheus's text format."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            return str(r.read().decode())

    def ready(self) -> bool:
        """/readyz answers 200: registered with the kubelet and the slice published."""
        with contextlib.suppress(OSError):
            return self.get("/readyz")[0] == 200
        return False

    def wait_ready(self, timeout: float = 60) -> None:
        assert self.process is not None
        self.process.wait_until(self.ready, timeout, "registered and published")

    def wait_serving(self, timeout: float = 60) -> None:
        """Until this start's DRA socket answers a call (a slice in the API may be an older start's)."""
        assert self.process is not None
        self.process.wait_until(lambda: dra_socket_answers(self.dra_socket), timeout, "DRA socket answering")

    def wait_published(self, timeout: float = 60) -> dict[str, Any]:
        """The node's slice as the API holds it, once it is there."""
        assert self.process is not None
        resource = client.ResourceV1Api(api_client(self.cluster.admin_kubeconfig))
        found: dict[str, Any] = {}

        def published() -> bool:
            response = resource.list_resource_slice(
                field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
            )
            items = raw_json(response)["items"]
            if items:
                found.update(items[0])
            return bool(items)

        self.process.wait_until(published, timeout, "ResourceSlice published")
        return found

    def log_of_all_starts(self) -> str:
        """Every start's log, oldest first."""
        logs = sorted(self.work_dir.glob("tessera-driver-*.log"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        return "".join(p.read_text(errors="replace") for p in logs)

    def log_tails(self, lines: int = 80) -> dict[str, str]:
        tails = {}
        if self.process is not None:
            tails[f"tessera-driver on {self.node_name}"] = self.process.log_tail(lines)
        if self.exporter is not None:
            tails[f"tessera-exporter on {self.node_name}"] = self.exporter.log_tail(lines)
        return tails

    def cleanup(self) -> None:
        """Stop the daemon and remove its folder (the node's own folders are the node's)."""
        self.stop()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def _get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` on a loopback health port: (status, body)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@contextlib.contextmanager
def published_driver_node(
    cluster: LocalCluster, kube: client.ApiClient, node_name: str, gpus: int, extra_args: Sequence[str] = ()
) -> Iterator[DriverNode]:
    """The daemon on ``node_name`` (a kubelet-less node) with ``gpus`` simulated 80 GiB GPUs and
    ``extra_args`` on its command line, its slice published; cleaned up on exit. What most driver
    tests start from."""
    ensure_device_class(kube)
    node = DriverNode(cluster, node_name, gpus=gpus)
    node.start(extra_args=extra_args)
    try:
        node.wait_published()
        yield node
    finally:
        node.cleanup()
