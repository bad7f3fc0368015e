"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, built from the Go module proxy (build-binaries.sh) and run from a temporary folder.

Ports are picked free at start, so two clusters on one machine do not collide; all state (certs,
etcd data, kubeconfig, logs) lives in one folder that stop() removes. DRA and its consumable-capacity
feature are on by default in the pinned Kubernetes (1.36 and later), so no feature gate is set;
tests/integration/test_control_plane.py checks each component really runs with them on.

Run it by hand with `tessera-cluster up` (prints the kubeconfig path; Ctrl-C stops and cleans up).
"""

from __future__ import annotations

import logging
import shutil
import ssl
import tempfile
import urllib.request
from pathlib import Path
from types import TracebackType

from tessera.webhook.authentication import DEFAULT_CLIENT_NAME
from testbed.binaries import binary, ensure_built
from testbed.kueue import Kueue, KueueOptions
from testbed.node_host import node_addresses
from testbed.pki import CertificateAuthority, KeyPair, write_service_account_keys
from testbed.process import ManagedProcess, free_port

log = logging.getLogger(__name__)

SERVICE_CIDR = "10.0.0.0/24"
_START_TIMEOUT = 120.0
# How long a pod refused by the scheduler waits before the scheduler tries it again unprompted.
_UNSCHEDULABLE_PODS_FLUSH_AFTER = "10s"


def write_kubeconfig(path: Path, server: str, ca: Path, client: KeyPair, user: str) -> Path:
    """A kubeconfig with file references (not embedded data), readable by kubectl and client-go."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: tessera
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    client-certificate: {client.cert}
    client-key: {client.key}
contexts:
- name: tessera
  context: {{cluster: tessera, user: {user}}}
current-context: tessera
"""
    )
    path.chmod(0o600)
    return path


def write_webhook_admission_config(folder: Path, client: KeyPair) -> Path:
    """The API server's admission configuration that makes it present ``client`` to every admission
    webhook (docs/install.md, "Authenticating the API server to the webhook"): a kubeconfig whose
    one user is named ``*``, the default match for any webhook host, since the test bed reaches
    webhooks both behind Services of varying names and at 127.0.0.1 URLs."""
    kubeconfig = folder / "webhook-client.kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: {client.cert}
    client-key: {client.key}
"""
    )
    kubeconfig.chmod(0o600)
    config = folder / "admission-config.yaml"
    plugins = "".join(
        f"""- name: {plugin}
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: {kubeconfig}
"""
        for plugin in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
    )
    config.write_text(
        f"apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{plugins}"
    )
    return config


class LocalCluster:
    """The control plane of one test cluster. Use as a context manager, or call start()/stop()."""

    def __init__(self, state_dir: Path | None = None, kueue: KueueOptions | bool = False) -> None:
        """state_dir: where certs, etcd data, kubeconfig and logs go. A folder given here is the
        caller's and is kept (its logs are worth reading); by default a new temporary folder is
        used and removed by stop(). kueue: also install and run Kueue (testbed/kueue.py), with
        these options when they are given."""
        self._owns_state_dir = state_dir is None
        self.state_dir = state_dir or Path(tempfile.mkdtemp(prefix="tessera-cluster-"))
        self.log_dir = self.state_dir / "logs"
        self.pki_dir = self.state_dir / "pki"
        self.processes: list[ManagedProcess] = []
        self.api_port = 0
        self.controller_manager_port = 0
        self.scheduler_port = 0
        self.ca: CertificateAuthority | None = None
        self.webhook_client_ca: CertificateAuthority | None = None
        """The CA of the client certificate the API server presents to admission webhooks: what a
        webhook of the test bed trusts (tessera-webhook --client-ca-file)."""
        self.webhook_client: KeyPair | None = None
        """That certificate and its key, for a benchmark that posts to a webhook as the API server."""
        self.admin_kubeconfig = self.state_dir / "admin.kubeconfig"
        self._kueue_options = kueue if isinstance(kueue, KueueOptions) else KueueOptions() if kueue else None
        self.kueue: Kueue | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def start(self) -> None:
        """Start etcd, the API server, the controller manager and the scheduler; wait until each is
        healthy. On any failure, stop what was started before raising."""
        try:
            ensure_built("etcd", "kubernetes", *(["kueue"] if self._kueue_options else []))
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._write_pki()
            self._start_etcd()
            self._start_apiserver()
            self._start_controller_manager()
            self._start_scheduler()
            if self._kueue_options is not None:
                self.kueue = Kueue(self, self._kueue_options)
                self.kueue.start()
        except BaseException:
            self.stop()
            raise
        log.info("cluster up at %s (state in %s)", self.server, self.state_dir)

    def stop(self) -> None:
        """Stop every component (newest first) and remove a temporary state folder. Every component
        is stopped even if stopping one fails; the first failure is raised at the end."""
        failures: list[BaseException] = []
        for process in reversed(self.processes):
            try:
                process.stop()
            except Exception as error:
                log.error("stopping %s failed: %s", process.name, error)
                failures.append(error)
        self.processes.clear()
        if self._owns_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if failures:
            raise failures[0]

    def stop_api_server(self) -> None:
        """Stop the API server alone, as an outage does; etcd and the other components keep running
        (they retry: neither elects a leader here, so neither exits when it cannot renew a lease)."""
        self._api_server_process().stop()

    def resume_api_server(self) -> None:
        """Start the API server stopped by stop_api_server again, same port, same state; wait until
        it is ready."""
        stopped = self._api_server_process()
        assert not stopped.running(), "the API server is running"
        self.processes.remove(stopped)
        resumed = self._spawn("kube-apiserver", *stopped.argv)
        resumed.wait_until(lambda: self._apiserver_ok("/readyz"), _START_TIMEOUT, "ready API server again")

    def _api_server_process(self) -> ManagedProcess:
        return next(p for p in self.processes if p.name == "kube-apiserver")

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        """The last lines of each component's log, for a failing test's report."""
        return {p.name: p.log_tail(lines) for p in self.processes}

    # -- components ------------------------------------------------------------------------

    def _write_pki(self) -> None:
        self.ca = CertificateAuthority(self.pki_dir)
        self._serving = self.ca.issue(
            "apiserver",
            common_name="kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            # Pods reach the API server at their node's address (see --bind-address).
            ip_addresses=("127.0.0.1", "10.0.0.1", *node_addresses()),
            server=True,
        )
        self._admin = self.ca.issue(
            "admin", common_name="tessera-admin", organizations=("system:masters",), client=True
        )
        self._front_proxy = self.ca.issue("front-proxy-client", common_name="front-proxy-client", client=True)
        self._service_account = write_service_account_keys(self.pki_dir)
        # A CA of its own, so a webhook trusting it trusts the API server's webhook client alone.
        self.webhook_client_ca = CertificateAuthority(
            self.pki_dir / "webhook-client", common_name="tessera-testbed-webhook-client-ca"
        )
        self.webhook_client = self.webhook_client_ca.issue(
            "apiserver-webhook-client", common_name=DEFAULT_CLIENT_NAME, client=True
        )
        self._admission_config = write_webhook_admission_config(self.pki_dir, self.webhook_client)

    def _start_etcd(self) -> None:
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn(
            "etcd",
            binary("etcd"),
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            # Tests write little and care about speed, not durability across power loss.
            "--unsafe-no-fsync",
        )
        etcd.wait_until(lambda: _http_ok(f"{self.etcd_url}/health"), _START_TIMEOUT, "healthy etcd")

    def _start_apiserver(self) -> None:
        assert self.ca is not None
        self.api_port = free_port()
        apiserver = self._spawn(
            "kube-apiserver",
            binary("kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            # Every address, not loopback alone: without kube-proxy, pods cannot reach the kubernetes
            # Service, so they are pointed at their node's address instead, their gateway on the
            # node's bridge (testbed/apiserver_access.py); the serving certificate names each.
            "--bind-address=0.0.0.0",
            "--advertise-address=127.0.0.1",
            # Call webhooks (and aggregated APIs) behind a Service at one of its endpoints' pod IPs,
            # not at its ClusterIP, which nothing routes without kube-proxy. buildServiceResolver in
            # cmd/kube-apiserver/app/server.go (v1.37.2) makes the one resolver the admission
            # webhooks use from this flag.
            "--enable-aggregator-routing",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={self._serving.cert}",
            f"--tls-private-key-file={self._serving.key}",
            f"--client-ca-file={self.ca.pair.cert}",
            # Front-proxy (request-header) authentication: the scheduler and controller manager read
            # this CA from kube-system/extension-apiserver-authentication for their own secure ports
            # and log an error every few seconds without it; aggregated API servers need it too.
            f"--requestheader-client-ca-file={self.ca.pair.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self._front_proxy.cert}",
            f"--proxy-client-key-file={self._front_proxy.key}",
            # Lets the API server reach kubelets (logs, exec) as a cluster admin.
            f"--kubelet-client-certificate={self._admin.cert}",
            f"--kubelet-client-key={self._admin.key}",
            # Reach kubelets at their InternalIP: the default order prefers the Hostname address, and
            # the names of the test bed's nodes resolve nowhere.
            "--kubelet-preferred-address-types=InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self._service_account.cert}",
            f"--service-account-signing-key-file={self._service_account.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # Present a client certificate to admission webhooks: the Tessera webhook answers no one else.
            f"--admission-control-config-file={self._admission_config}",
            "--allow-privileged=true",
            # No kube-proxy or Service network on loopback: do not publish apiserver endpoints.
            "--endpoint-reconciler-type=none",
        )
        write_kubeconfig(self.admin_kubeconfig, self.server, self.ca.pair.cert, self._admin, "admin")
        apiserver.wait_until(lambda: self._apiserver_ok("/readyz"), _START_TIMEOUT, "ready API server")

    def _start_controller_manager(self) -> None:
        assert self.ca is not None
        port = free_port()
        kcm = self._spawn(
            "kube-controller-manager",
            binary("kube-controller-manager"),
            *self._secure_component_flags(port),
            f"--service-account-private-key-file={self._service_account.key}",
            f"--root-ca-file={self.ca.pair.cert}",
            "--use-service-account-credentials=false",
            # Node objects of the tests have no kubelet behind them; the node-lifecycle controller
            # would taint them not-ready and evict their pods.
            "--controllers=*,-node-lifecycle-controller",
        )
        kcm.wait_until(lambda: _https_ok(port, "/healthz"), _START_TIMEOUT, "healthy controller manager")
        self.controller_manager_port = port

    def _start_scheduler(self) -> None:
        port = free_port()
        scheduler = self._spawn(
            "kube-scheduler",
            binary("kube-scheduler"),
            *self._secure_component_flags(port),
            # kube-scheduler 1.37 counts a share twice while its allocation is in flight (the
            # informer has delivered it, PreBind has not yet dropped it from the in-flight claims):
            # a pod tried in that window is refused "cannot allocate all claims" although the GPU
            # has room, and no event re-queues it, as another claim's allocation is "unrelated".
            # It waits for the flush of unschedulable pods, 5 minutes by default; 10 s brings it
            # back within 40 s (the flush runs every 30 s). See docs/troubleshooting.md.
            f"--pod-max-in-unschedulable-pods-duration={_UNSCHEDULABLE_PODS_FLUSH_AFTER}",
        )
        scheduler.wait_until(lambda: _https_ok(port, "/healthz"), _START_TIMEOUT, "healthy scheduler")
        self.scheduler_port = port

    def _secure_component_flags(self, port: int) -> list[str]:
        """Flags shared by the controller manager and the scheduler: admin credentials, loopback
        only, no leader election (one replica), and a free secure port for /healthz and /metrics."""
        kubeconfig = self.admin_kubeconfig
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
        ]

    def _spawn(self, name: str, *argv: str | Path) -> ManagedProcess:
        process = ManagedProcess(name, list(argv), self.log_dir)
        self.processes.append(process)
        return process

    # -- probes ----------------------------------------------------------------------------

    def admin_ssl_context(self) -> ssl.SSLContext:
        """TLS context that trusts the cluster CA and presents the admin client certificate."""
        assert self.ca is not None
        context = ssl.create_default_context(cafile=str(self.ca.pair.cert))
        context.load_cert_chain(str(self._admin.cert), str(self._admin.key))
        return context

    def _apiserver_ok(self, path: str) -> bool:
        with urllib.request.urlopen(f"{self.server}{path}", context=self.admin_ssl_context(), timeout=5) as r:
            return bool(r.status == 200)

    def component_metrics(self, component: str) -> str:
        """The Prometheus text of a control-plane component's /metrics, read as the admin."""
        ports = {
            "kube-scheduler": self.scheduler_port,
            "kube-controller-manager": self.controller_manager_port,
        }
        if component == "kube-apiserver":
            url = f"{self.server}/metrics"
            context = self.admin_ssl_context()
        elif component not in ports:
            raise ValueError(f"no control-plane component named {component!r}")
        else:
            port = ports[component]
            url = f"https://127.0.0.1:{port}/metrics"
            # Those components serve a self-signed certificate; trust is not what is tested here.
            context = self.admin_ssl_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(url, context=context, timeout=10) as r:
            return str(r.read().decode())


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as r:
        return bool(r.status == 200)


def _https_ok(port: int, path: str) -> bool:
    """Health of a component serving a self-signed certificate; /healthz needs no credentials."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context, timeout=5) as r:
        return bool(r.status == 200)
