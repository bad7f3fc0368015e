"""Serving certificates: the self-made CA and its rotation, and mounted files reloaded on change."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

from cryptography import x509

from tessera.webhook.tls import FileCertificates, SelfManagedCertificates, write_pem_pair

DAY = datetime.timedelta(days=1)


def certificates(*pem: bytes) -> list[x509.Certificate]:
    return [cert for chunk in pem for cert in x509.load_pem_x509_certificates(chunk)]


def test_self_made_serving_certificate_names_the_service_and_is_signed_by_the_bundle() -> None:
    made = SelfManagedCertificates(["webhook.tessera.svc"], ["127.0.0.1"])
    [serving] = certificates(made.serving_certificate())
    [ca] = certificates(made.ca_bundle())
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["webhook.tessera.svc"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    serving.verify_directly_issued_by(ca)
    assert isinstance(made.context(), ssl.SSLContext)


def test_serving_certificate_is_replaced_at_two_thirds_of_its_life_and_the_ca_kept() -> None:
    made = SelfManagedCertificates(["w"], [], ca_lifetime=300 * DAY, serving_lifetime=30 * DAY)
    start = certificates(made.serving_certificate())[0].not_valid_before_utc + datetime.timedelta(minutes=5)
    first, bundle = made.serving_certificate(), made.ca_bundle()
    assert made.refresh(start + 19 * DAY) is False
    assert made.refresh(start + 21 * DAY) is True
    assert made.serving_certificate() != first and made.ca_bundle() == bundle


def test_a_new_ca_joins_the_bundle_before_the_old_one_leaves() -> None:
    made = SelfManagedCertificates(["w"], [], ca_lifetime=90 * DAY, serving_lifetime=30 * DAY)
    start = certificates(made.ca_bundle())[0].not_valid_before_utc + datetime.timedelta(minutes=5)
    made.refresh(start + 61 * DAY)
    _old, new = certificates(made.ca_bundle())
    certificates(made.serving_certificate())[0].verify_directly_issued_by(new)
    made.refresh(start + 91 * DAY)
    assert certificates(made.ca_bundle()) == [new]


def test_mounted_files_are_reloaded_only_when_they_change(tmp_path: Path) -> None:
    one, two = SelfManagedCertificates(["one"], []), SelfManagedCertificates(["two"], [])
    write_pem_pair(tmp_path, one.serving_certificate(), one._serving.key_pem)  # type: ignore[union-attr]
    mounted = FileCertificates(tmp_path)
    first = mounted.context()
    assert mounted.refresh() is False
    (tmp_path / "tls.crt").write_bytes(b"half written")
    assert mounted.refresh() is False and mounted.context() is first
    write_pem_pair(tmp_path, two.serving_certificate(), two._serving.key_pem)  # type: ignore[union-attr]
    assert mounted.refresh() is True and mounted.context() is not first
