"""The serving certificate: from a mounted secret (cert-manager's ``tls.crt``/``tls.key``/``ca.crt``
layout), reloaded when the files change (``tessera.serving.TlsFiles``, as every Tessera server loads
TLS), or, when none is mounted, from a CA this process makes and rotates itself, whose certificate it
keeps in the webhook configuration's ``caBundle``.

Either way the server asks :meth:`Certificates.context` for every new connection, so a rotation takes
effect without a restart and connections in flight keep the context they started with. Given a client
CA bundle (``--client-ca-file``), the context also asks every client for a certificate and verifies it
against that bundle, re-read with the serving certificate (webhook/authentication.py decides which
verified names may post reviews).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client

from tessera.kube import raw_json
from tessera.serving import read_client_ca, server_context

log = logging.getLogger(__name__)


class Certificates(Protocol):
    def context(self) -> ssl.SSLContext: ...

    def refresh(self) -> bool:
        """Pick up new material if there is any; True when the serving certificate changed."""
        ...


_BACKDATE = datetime.timedelta(minutes=5)
"""Certificates are valid from a little before they are made, for clients whose clocks lag."""


@dataclass(frozen=True)
class _Issued:
    cert_pem: bytes
    key_pem: bytes
    issued: datetime.datetime
    not_after: datetime.datetime

    def due(self, now: datetime.datetime) -> bool:
        """Past two thirds of its life (counted from when it was made, not from its backdated start):
        time to replace it, long before anyone refuses it."""
        return now >= self.issued + (self.not_after - self.issued) * 2 / 3


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(
    now: datetime.datetime, lifetime: datetime.timedelta
) -> tuple[_Issued, ec.EllipticCurvePrivateKey]:
    """A self-signed CA valid for ``lifetime`` from ``now`` (backdated a little), and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"tessera-webhook-ca-{now:%Y%m%d%H%M%S}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    return _Issued(pem, _key_pem(key), now, now + lifetime), key


def make_leaf(
    ca: _Issued,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    names: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    now: datetime.datetime,
    lifetime: datetime.timedelta,
) -> _Issued:
    """A certificate for ``subject`` (and ``names``, if any) with the one extended key ``usage``,
    signed by ``ca``, valid for ``lifetime``."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return _Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), now, now + lifetime)


def make_serving(
    ca: _Issued,
    ca_key: ec.EllipticCurvePrivateKey,
    dns_names: list[str],
    ip_addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address],
    now: datetime.datetime,
    lifetime: datetime.timedelta,
) -> _Issued:
    """A serving certificate for the names and addresses, signed by ``ca``, valid for ``lifetime``."""
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    names += [x509.IPAddress(address) for address in ip_addresses]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera-webhook")])
    return make_leaf(ca, ca_key, subject, names, ExtendedKeyUsageOID.SERVER_AUTH, now, lifetime)


class SelfManagedCertificates:
    """A CA and a serving certificate made here, rotated at two thirds of their lives.

    A new CA is added to the bundle before it signs anything and the old one stays in the bundle
    until it expires, so clients holding either bundle keep trusting the server during a rotation.
    Made for one replica: each process has its own CA (several replicas share one through
    secret_tls.py, or a mounted secret)."""

    def __init__(
        self,
        dns_names: list[str],
        ip_addresses: list[str],
        ca_lifetime: datetime.timedelta = datetime.timedelta(days=365),
        serving_lifetime: datetime.timedelta = datetime.timedelta(days=30),
        client_ca: Path | None = None,
    ) -> None:
        self.dns_names = dns_names
        self.client_ca = client_ca
        self._client_ca_pem = read_client_ca(client_ca)
        self.ip_addresses = [ipaddress.ip_address(address) for address in ip_addresses]
        self.ca_lifetime = ca_lifetime
        self.serving_lifetime = serving_lifetime
        self._lock = threading.Lock()
        self._cas: list[tuple[_Issued, ec.EllipticCurvePrivateKey]] = []
        self._serving: _Issued | None = None
        self._context: ssl.SSLContext | None = None
        self.refresh()

    def refresh(self, now: datetime.datetime | None = None) -> bool:
        now = now or _now()
        with self._lock:
            changed = False
            self._cas = [(ca, key) for ca, key in self._cas if ca.not_after > now]
            if not self._cas or self._cas[-1][0].due(now):
                self._cas.append(make_ca(now, self.ca_lifetime))
                changed = True
            if changed or self._serving is None or self._serving.due(now):
                ca, ca_key = self._cas[-1]
                lifetime = min(self.serving_lifetime, ca.not_after - now)
                self._serving = make_serving(ca, ca_key, self.dns_names, self.ip_addresses, now, lifetime)
                changed = True
            client_ca = self._client_ca_pem
            if self.client_ca is not None and self._context is not None:
                try:
                    client_ca = read_client_ca(self.client_ca)
                except ValueError as error:  # mid-swap: keep trusting the bundle we have
                    log.warning("%s", error)
            if changed or client_ca != self._client_ca_pem:
                self._client_ca_pem = client_ca
                self._context = server_context(self._serving.cert_pem, self._serving.key_pem, client_ca)
            return changed

    def ca_bundle(self) -> bytes:
        """Every CA still valid, newest last: what the webhook configuration must trust."""
        with self._lock:
            return b"".join(ca.cert_pem for ca, _ in self._cas)

    def serving_certificate(self) -> bytes:
        assert self._serving is not None
        return self._serving.cert_pem

    def context(self) -> ssl.SSLContext:
        assert self._context is not None
        return self._context


def keep_ca_bundle(api: client.ApiClient, configuration: str, bundle: bytes) -> bool:
    """Set ``caBundle`` of every webhook in the MutatingWebhookConfiguration ``configuration`` to
    ``bundle``; True if anything changed (only a changed bundle is written)."""
    registration = client.AdmissionregistrationV1Api(api)
    body = raw_json(registration.read_mutating_webhook_configuration(configuration, _preload_content=False))
    wanted = base64.b64encode(bundle).decode()
    changed = False
    for webhook in body.get("webhooks") or []:
        config = webhook.setdefault("clientConfig", {})
        if config.get("caBundle") != wanted:
            config["caBundle"] = wanted
            changed = True
    if changed:
        registration.replace_mutating_webhook_configuration(
            configuration, client.V1MutatingWebhookConfiguration.model_validate(body)
        )
        log.info("caBundle of %s updated", configuration)
    return changed


def write_pem_pair(folder: Path, cert_pem: bytes, key_pem: bytes) -> None:
    """Write ``tls.crt``/``tls.key`` the way a mounted secret looks (used by tests and examples)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tls.crt").write_bytes(cert_pem)
    key = folder / "tls.key"
    key.touch(mode=0o600)
    os.chmod(key, 0o600)
    key.write_bytes(key_pem)
