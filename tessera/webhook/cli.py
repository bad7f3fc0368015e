"""``tessera-webhook``: flags (each with an environment variable), start-up in order, shutdown on
SIGTERM with the reviews in flight answered (the process skeleton is tessera/command.py)."""

from __future__ import annotations

import argparse
import datetime
import logging
import socket
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from kubernetes import client

from tessera import command
from tessera.command import Stoppable
from tessera.kube import when_reachable
from tessera.serving import TlsFiles, read_client_ca
from tessera.settings import setting, switch
from tessera.webhook import seccomp
from tessera.webhook.admission import AdmissionPolicy
from tessera.webhook.authentication import DEFAULT_CLIENT_NAME, ClientPolicy
from tessera.webhook.client_ca import ClientCaSecret
from tessera.webhook.secret_tls import Policy, SecretCertificates
from tessera.webhook.server import WebhookApp, WebhookServer
from tessera.webhook.slices import SliceCache
from tessera.webhook.templates import TemplateStore
from tessera.webhook.tls import Certificates, SelfManagedCertificates, keep_ca_bundle
from tessera.webhook.waiting_pods import WaitingPods

log = logging.getLogger("tessera.webhook")


def _optional_path(value: str) -> Path | None:
    return Path(value) if value else None


def _list(value: str) -> list[str]:
    return [item for item in (part.strip() for part in value.split(",")) if item]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tessera-webhook",
        description="Mutating admission webhook: converts HAMi-style nvidia.com/gpu, gpumem, "
        "gpumem-percentage and gpucores requests (and the use/nouse GPU annotations) into "
        "ResourceClaimTemplates of the gpu.tessera.dev DRA driver, and denies requests that can never "
        "be met. Every flag can also be set with the environment variable shown.",
    )
    env = "TESSERA_WEBHOOK_"
    setting(p, "--bind-address", env + "BIND_ADDRESS", "0.0.0.0", "address of /mutate")
    setting(p, "--port", env + "PORT", 8443, "HTTPS port of /mutate", int)
    setting(
        p,
        "--metrics-port",
        env + "METRICS_PORT",
        8080,
        "plain HTTP port of /metrics, /healthz and /readyz; -1 turns it off",
        int,
    )
    setting(
        p,
        "--probe-port",
        env + "PROBE_PORT",
        8081,
        "plain HTTP port of /healthz and /readyz alone, for the kubelet's probes; -1 turns it off",
        int,
    )
    setting(
        p,
        "--tls-dir",
        env + "TLS_DIR",
        None,
        "folder with tls.crt and tls.key (a mounted cert-manager secret), reloaded when they change; "
        "without it, the certificate of --tls-secret, else a CA of this process's own (one replica only)",
        _optional_path,
    )
    setting(
        p,
        "--tls-secret",
        env + "TLS_SECRET",
        "",
        "Secret in --namespace where the replicas keep their shared CA and serving certificate "
        "(made by the first replica, rotated CA-first; tessera/webhook/secret_tls.py), its CA kept in "
        "--webhook-configuration's caBundle",
    )
    setting(
        p,
        "--namespace",
        env + "NAMESPACE",
        "",
        "the release namespace, where --tls-secret and --client-ca-secret are",
    )
    setting(
        p,
        "--certificate-lifetime",
        env + "CERTIFICATE_LIFETIME",
        365 * 86400.0,
        "seconds a CA and serving certificate made for --tls-secret live",
        float,
    )
    setting(
        p,
        "--renew-fraction",
        env + "RENEW_FRACTION",
        0.67,
        "fraction of its lifetime after which a --tls-secret certificate is rotated",
        float,
    )
    setting(
        p,
        "--rotation-settle",
        env + "ROTATION_SETTLE",
        600.0,
        "seconds each --tls-secret rotation phase waits (new CA trusted before it serves, old CA kept "
        "after the switch) so every replica and the API server catch up; at least twice "
        "--certificate-check-interval",
        float,
    )
    setting(
        p,
        "--dns-names",
        env + "DNS_NAMES",
        [],
        "comma-separated DNS names for the self-made serving certificate, e.g. tessera-webhook.tessera.svc",
        _list,
    )
    setting(
        p,
        "--ip-addresses",
        env + "IP_ADDRESSES",
        [],
        "comma-separated IP addresses for the self-made serving certificate",
        _list,
    )
    setting(
        p,
        "--client-ca-file",
        env + "CLIENT_CA_FILE",
        None,
        "PEM bundle of the CA that signs the API server's client certificate; /mutate answers only "
        "callers presenting a certificate it verifies (reloaded when the file changes)",
        _optional_path,
    )
    setting(
        p,
        "--client-ca-secret",
        env + "CLIENT_CA_SECRET",
        "",
        "instead of --client-ca-file: a Secret in --namespace holding the CA (ca.crt) and the API "
        "server's client certificate (tls.crt, tls.key, for the first --client-names), made by the "
        "first replica when absent (tessera/webhook/client_ca.py)",
    )
    setting(
        p,
        "--client-certificate-lifetime",
        env + "CLIENT_CERTIFICATE_LIFETIME",
        3650 * 86400.0,
        "seconds the CA and client certificate made for --client-ca-secret live (never rotated: the API "
        "server's kubeconfig holds a copy)",
        float,
    )
    setting(
        p,
        "--client-names",
        env + "CLIENT_NAMES",
        [DEFAULT_CLIENT_NAME],
        "comma-separated subject common names allowed to post reviews",
        _list,
    )
    switch(
        p,
        "--allow-unauthenticated",
        env + "ALLOW_UNAUTHENTICATED",
        False,
        "serve /mutate to any caller, without --client-ca-file: only where the API server cannot "
        "present a client certificate, since anyone reaching the port can then have templates made",
    )
    setting(
        p,
        "--webhook-configuration",
        env + "CONFIGURATION",
        "",
        "MutatingWebhookConfiguration whose caBundle the webhook keeps current when it makes its own CA "
        "or keeps --tls-secret",
    )
    setting(
        p,
        "--certificate-check-interval",
        env + "CERTIFICATE_CHECK_INTERVAL",
        60.0,
        "seconds between checks for new certificate files, rotation and the caBundle",
        float,
    )
    setting(
        p,
        "--shutdown-delay",
        env + "SHUTDOWN_DELAY",
        10.0,
        "seconds at least to keep serving after SIGTERM, not ready and closing each connection after "
        "its answer, so the API server moves to other replicas before this one stops accepting",
        float,
    )
    setting(
        p,
        "--shutdown-quiet",
        env + "SHUTDOWN_QUIET",
        3.0,
        "after --shutdown-delay, keep serving until no request has come for this many seconds: the "
        "API server still calling means it has not yet seen the endpoint go",
        float,
    )
    setting(
        p,
        "--shutdown-timeout",
        env + "SHUTDOWN_TIMEOUT",
        25.0,
        "seconds at most the whole drain lasts, whatever still calls; less than the pod's "
        "termination grace period, which must also cover the reviews in flight",
        float,
    )
    setting(
        p,
        "--high-priority-namespaces",
        env + "HIGH_PRIORITY_NAMESPACES",
        [],
        "comma-separated namespaces whose pods may ask nvidia.com/priority 0 (high), which holds back "
        "low-priority neighbours on the GPU; a pod elsewhere asking it is refused",
        _list,
    )
    setting(
        p,
        "--seccomp",
        env + "SECCOMP",
        seccomp.ENFORCE,
        "containers whose GPU share the shim enforces, without a RuntimeDefault or Localhost seccomp "
        "profile (so able to unshare past the shim): enforce gives those without one RuntimeDefault "
        "and refuses Unconfined, warn only warns, off does nothing",
        choices=seccomp.MODES,
    )
    setting(
        p,
        "--template-ttl",
        env + "TEMPLATE_TTL",
        300.0,
        "seconds a template is known to exist before the next pod checks again",
        float,
    )
    setting(
        p,
        "--explain-waiting-after",
        env + "EXPLAIN_WAITING_AFTER",
        60.0,
        "seconds a pod with Tessera claims must have been unschedulable before an Event on it says why "
        "(kubectl tessera why's reasons; again only when they change); 0 turns the Events off",
        float,
    )
    setting(
        p,
        "--explain-waiting-period",
        env + "EXPLAIN_WAITING_PERIOD",
        15.0,
        "seconds between two looks at the pods that wait",
        float,
    )
    p.add_argument(
        "--kubeconfig", type=Path, default=None, help="kubeconfig; default $KUBECONFIG, else in-cluster"
    )
    command.log_flags(p, env)
    command.api_flags(p, env)
    return p


def admission_policy(args: argparse.Namespace) -> AdmissionPolicy:
    """The administrator's decisions at admission; a --seccomp from the environment is checked
    here, since argparse checks choices only on the command line."""
    if args.seccomp not in seccomp.MODES:
        raise command.UsageError(f"--seccomp must be one of {', '.join(seccomp.MODES)}, not {args.seccomp!r}")
    return AdmissionPolicy(frozenset(args.high_priority_namespaces), args.seccomp)


def client_policy(args: argparse.Namespace) -> ClientPolicy | None:
    """Who may post reviews; refuses to start without a client CA unless that is asked for by name."""
    if args.client_ca_file is None:
        if not args.allow_unauthenticated:
            raise SystemExit(
                "tessera-webhook: give --client-ca-file (the CA of the API server's client certificate; "
                "docs/install.md) or --client-ca-secret, or --allow-unauthenticated to serve any caller"
            )
        log.warning("serving /mutate to any caller: --allow-unauthenticated")
        return None
    try:
        read_client_ca(args.client_ca_file)
    except ValueError as error:
        raise SystemExit(f"tessera-webhook: {error}") from None
    if not args.client_names:
        raise SystemExit("tessera-webhook: --client-names is empty, so no caller could post reviews")
    return ClientPolicy(frozenset(args.client_names))


def client_ca_secret(args: argparse.Namespace, api: client.ApiClient) -> ClientCaSecret | None:
    """With --client-ca-secret: the Secret made if absent and its CA written to a private file, which
    becomes --client-ca-file (so the server reloads it like any other)."""
    if not args.client_ca_secret:
        return None
    if args.client_ca_file is not None or not args.namespace or not args.client_names:
        raise SystemExit(
            "tessera-webhook: --client-ca-secret needs --namespace and --client-names, "
            "and no --client-ca-file"
        )
    file = Path(tempfile.mkdtemp(prefix="tessera-client-ca-")) / "ca.crt"
    secret = ClientCaSecret(
        api,
        args.namespace,
        args.client_ca_secret,
        args.client_names[0],
        datetime.timedelta(seconds=args.client_certificate_lifetime),
        file,
    )
    secret.sync()
    args.client_ca_file = file
    return secret


def certificates_from(args: argparse.Namespace, api: client.ApiClient) -> Certificates:
    client_ca = args.client_ca_file
    if args.tls_dir is not None:
        return TlsFiles(args.tls_dir, client_ca)
    if not args.dns_names and not args.ip_addresses:
        raise SystemExit(
            "tessera-webhook: give --tls-dir, or --dns-names/--ip-addresses for a self-made certificate"
        )
    if not args.tls_secret:
        return SelfManagedCertificates(args.dns_names, args.ip_addresses, client_ca=client_ca)
    if not args.namespace or not args.webhook_configuration:
        raise SystemExit("tessera-webhook: --tls-secret needs --namespace and --webhook-configuration")
    if not 0 < args.renew_fraction < 1:
        raise SystemExit("tessera-webhook: --renew-fraction must lie between 0 and 1")
    if args.rotation_settle < 2 * args.certificate_check_interval:
        raise SystemExit(
            "tessera-webhook: --rotation-settle must be at least twice --certificate-check-interval, "
            "or a replica could still serve a certificate the caBundle no longer trusts"
        )
    policy = Policy(
        lifetime=datetime.timedelta(seconds=args.certificate_lifetime),
        renew_fraction=args.renew_fraction,
        settle=datetime.timedelta(seconds=args.rotation_settle),
        dns_names=tuple(args.dns_names),
        ip_addresses=tuple(args.ip_addresses),
    )
    return SecretCertificates(
        api, args.namespace, args.tls_secret, args.webhook_configuration, policy, client_ca
    )


def _maintain_certificates(
    certificates: Certificates,
    client_secret: ClientCaSecret | None,
    api: client.ApiClient,
    configuration: str,
    interval: float,
    stop: threading.Event,
) -> None:
    """Reload or rotate the certificate (and the client CA), and keep the caBundle current, until
    ``stop``."""
    while True:
        try:
            if client_secret is not None:
                client_secret.sync()
            certificates.refresh()
            if configuration and isinstance(certificates, SelfManagedCertificates):
                keep_ca_bundle(api, configuration, certificates.ca_bundle())
        except Exception:  # the API may be briefly away: log and try again next round
            log.exception("certificate maintenance failed; retrying in %.0fs", interval)
        if stop.wait(interval):
            return


class Webhook(Stoppable):
    """The slice cache, the template store, the servers and the certificate upkeep: start, serve, stop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.fatal: str | None = None
        for flag in ("shutdown_delay", "shutdown_quiet", "shutdown_timeout", "explain_waiting_after"):
            if not getattr(args, flag) >= 0:
                name = "--" + flag.replace("_", "-")
                raise command.UsageError(f"{name} must be 0 or more seconds, not {getattr(args, flag):g}")
        if not args.explain_waiting_period > 0:
            raise command.UsageError(
                f"--explain-waiting-period must be more than 0 seconds, not {args.explain_waiting_period:g}"
            )
        self._args = args
        self._policy = admission_policy(args)
        self._api = command.api_client_from(args, args.kubeconfig)
        # The Secrets they read are the webhook's to serve with: it waits for the API server rather
        # than exit, so that it serves as soon as the server is back (tessera.kube.when_reachable).
        self._client_secret = when_reachable(
            lambda: client_ca_secret(args, self._api), "reading the client CA Secret", log
        )
        self._clients = client_policy(args)
        self._certificates = when_reachable(
            lambda: certificates_from(args, self._api), "reading the serving certificate", log
        )
        self._cache = SliceCache(self._api)
        self._templates = TemplateStore(self._api, ttl=args.template_ttl)
        self._waiting = (
            WaitingPods(
                self._api, args.explain_waiting_after, args.explain_waiting_period, socket.gethostname()
            )
            if args.explain_waiting_after > 0
            else None
        )
        self._server: WebhookServer | None = None
        super().__init__()

    def start(self) -> None:
        args = self._args
        self._cache.start()
        self._templates.start()
        app = WebhookApp(lambda: self._cache.fleet, self._templates, self._cache.synced.is_set, self._policy)
        self._server = WebhookServer(
            app,
            self._certificates,
            args.bind_address,
            args.port,
            None if args.metrics_port < 0 else args.metrics_port,
            self._clients,
            None if args.probe_port < 0 else args.probe_port,
        )
        threading.Thread(
            target=_maintain_certificates,
            args=(
                self._certificates,
                self._client_secret,
                self._api,
                args.webhook_configuration,
                args.certificate_check_interval,
                self._stop,
            ),
            name="certificates",
            daemon=True,
        ).start()
        self._server.start()
        if self._waiting is not None:
            threading.Thread(
                target=self._waiting.run, args=(self._stop,), name="waiting-pods", daemon=True
            ).start()
        log.info("serving /mutate on %s:%d", args.bind_address, self._server.port)

    def stop(self) -> None:
        """Drain (when stopped by a signal while serving), answer the reviews in flight, then stop
        the watches."""
        self._stop.set()
        if self._server is not None:
            if self.fatal is None:
                self._server.drain(
                    self._args.shutdown_delay, self._args.shutdown_quiet, self._args.shutdown_timeout
                )
            self._server.stop()
            self._server = None
        self._templates.stop()
        self._cache.stop()
        log.info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    return command.main(parser(), Webhook, log, argv)


if __name__ == "__main__":
    sys.exit(main())
