"""The test-bed CA issues certificates that verify against it, with the names and roles asked for."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.pki import CertificateAuthority, write_service_account_keys


def test_serving_certificate_is_signed_by_the_ca_for_the_requested_names(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue(
        "server",
        common_name="kube-apiserver",
        dns_names=("localhost",),
        ip_addresses=("127.0.0.1",),
        server=True,
    )
    ca_cert = x509.load_pem_x509_certificate(ca.pair.cert.read_bytes())
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    cert.verify_directly_issued_by(ca_cert)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert oct(pair.key.stat().st_mode & 0o777) == "0o600"


def test_client_certificate_carries_user_and_groups(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("node", common_name="system:node:n1", organizations=("system:nodes",), client=True)
    subject = x509.load_pem_x509_certificate(pair.cert.read_bytes()).subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:n1"
    assert subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"


def test_service_account_keys_are_an_rsa_pair(tmp_path: Path) -> None:
    pair = write_service_account_keys(tmp_path)
    public = serialization.load_pem_public_key(pair.cert.read_bytes())
    private = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    assert isinstance(public, rsa.RSAPublicKey)
    assert isinstance(private, rsa.RSAPrivateKey)
    assert private.public_key().public_numbers() == public.public_numbers()
