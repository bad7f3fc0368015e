"""The command line: a true --help and a clear refusal without any certificate source."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tessera.webhook.cli import certificates_from, parser


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
    ):
        assert flag in shown.stdout
    assert "TESSERA_WEBHOOK_TLS_DIR" in shown.stdout


def test_no_certificate_source_is_refused_with_the_flags_to_use() -> None:
    with pytest.raises(SystemExit, match="give --tls-dir, or --dns-names"):
        certificates_from(parser().parse_args([]))


def test_environment_variables_set_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_WEBHOOK_PORT", "9443")
    monkeypatch.setenv("TESSERA_WEBHOOK_DNS_NAMES", "a.svc, b.svc")
    args = parser().parse_args([])
    assert (args.port, args.dns_names) == (9443, ["a.svc", "b.svc"])
