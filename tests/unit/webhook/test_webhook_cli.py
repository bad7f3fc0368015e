"""The command line: a true --help and a clear refusal without any certificate source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from tessera import command
from tessera.webhook.admission import AdmissionPolicy
from tessera.webhook.cli import Webhook, admission_policy, certificates_from, client_policy, parser
from testbed.pki import CertificateAuthority


def test_help_lists_every_flag_with_its_environment_variable() -> None:
    shown = subprocess.run(
        [sys.executable, "-c", "from tessera.webhook.cli import main; main(['--help'])"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0
    for flag in (
        "--port",
        "--metrics-port",
        "--tls-dir",
        "--dns-names",
        "--webhook-configuration",
        "--template-ttl",
        "--client-ca-file",
        "--client-names",
        "--allow-unauthenticated",
        "--high-priority-namespaces",
        "--seccomp",
    ):
        assert flag in shown.stdout
    assert "TESSERA_WEBHOOK_TLS_DIR" in shown.stdout


def test_no_certificate_source_is_refused_with_the_flags_to_use() -> None:
    with pytest.raises(SystemExit, match="give --tls-dir, or --dns-names"):
        certificates_from(parser().parse_args([]), client.ApiClient())


def test_environment_variables_set_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_WEBHOOK_PORT", "9443")
    monkeypatch.setenv("TESSERA_WEBHOOK_DNS_NAMES", "a.svc, b.svc")
    args = parser().parse_args([])
    assert (args.port, args.dns_names) == (9443, ["a.svc", "b.svc"])


def test_the_admission_policy_grants_no_one_priority_0_and_enforces_seccomp_unless_told() -> None:
    assert admission_policy(parser().parse_args([])) == AdmissionPolicy(frozenset(), "enforce")
    args = parser().parse_args(["--high-priority-namespaces=inference,batch", "--seccomp=warn"])
    assert admission_policy(args) == AdmissionPolicy(frozenset({"inference", "batch"}), "warn")


def test_the_admission_policy_comes_from_the_environment_and_a_bad_mode_stops_the_webhook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TESSERA_WEBHOOK_HIGH_PRIORITY_NAMESPACES", "inference")
    monkeypatch.setenv("TESSERA_WEBHOOK_SECCOMP", "off")
    assert admission_policy(parser().parse_args([])) == AdmissionPolicy(frozenset({"inference"}), "off")
    monkeypatch.setenv("TESSERA_WEBHOOK_SECCOMP", "strict")
    with pytest.raises(command.UsageError, match="--seccomp must be one of enforce, warn, off, not 'strict'"):
        admission_policy(parser().parse_args([]))


def test_without_a_client_ca_the_webhook_refuses_to_start_unless_told_to_serve_anyone() -> None:
    with pytest.raises(SystemExit, match=r"give --client-ca-file .* or --allow-unauthenticated"):
        client_policy(parser().parse_args([]))
    assert client_policy(parser().parse_args(["--allow-unauthenticated"])) is None


def test_the_client_ca_must_hold_a_certificate(tmp_path: Path) -> None:
    empty = tmp_path / "ca.crt"
    empty.write_text("not a certificate\n")
    with pytest.raises(SystemExit, match="holds no PEM certificate"):
        client_policy(parser().parse_args(["--client-ca-file", str(empty)]))
    with pytest.raises(SystemExit, match="cannot read the client CA bundle"):
        client_policy(parser().parse_args(["--client-ca-file", str(tmp_path / "missing.crt")]))


def test_allowed_client_names_default_to_the_documented_one(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    policy = client_policy(parser().parse_args(["--client-ca-file", str(ca.pair.cert)]))
    assert policy is not None and policy.names == {"kube-apiserver-webhook-client"}
    policy = client_policy(
        parser().parse_args(["--client-ca-file", str(ca.pair.cert), "--client-names", "a, b"])
    )
    assert policy is not None and policy.names == {"a", "b"}


@pytest.mark.parametrize(
    "flag", ["--shutdown-delay", "--shutdown-quiet", "--shutdown-timeout", "--explain-waiting-after"]
)
def test_a_negative_time_stops_the_webhook_with_the_flag_named(flag: str) -> None:
    with pytest.raises(command.UsageError, match=f"^{flag} must be 0 or more seconds, not -1$"):
        Webhook(parser().parse_args([f"{flag}=-1"]))


def test_a_waiting_pod_period_of_zero_stops_the_webhook() -> None:
    with pytest.raises(
        command.UsageError, match=r"^--explain-waiting-period must be more than 0 seconds, not 0$"
    ):
        Webhook(parser().parse_args(["--explain-waiting-period=0"]))
