"""Serving certificates: the self-made CA and its rotation, mounted files reloaded on change, and the
client CA that decides whose certificates pass the handshake."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509

from tessera.serving import TlsFiles
from tessera.webhook.tls import SelfManagedCertificates, write_pem_pair
from testbed.pki import CertificateAuthority, KeyPair

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
    mounted = TlsFiles(tmp_path)
    first = mounted.context()
    assert mounted.refresh() is False
    (tmp_path / "tls.crt").write_bytes(b"half written")
    assert mounted.refresh() is False and mounted.context() is first
    write_pem_pair(tmp_path, two.serving_certificate(), two._serving.key_pem)  # type: ignore[union-attr]
    assert mounted.refresh() is True and mounted.context() is not first


def handshake(context: ssl.SSLContext, ca_bundle: bytes, client: KeyPair) -> bool:
    """Whether a client presenting ``client`` completes a request with a server using ``context``."""
    server_side, client_side = socket.socketpair()
    client_context = ssl.create_default_context(cadata=ca_bundle.decode())
    client_context.check_hostname = False
    client_context.load_cert_chain(client.cert, client.key)
    outcome: list[bool] = []

    def serve() -> None:
        try:
            with context.wrap_socket(server_side, server_side=True) as tls:
                tls.sendall(b"ok")
                outcome.append(True)
        except (ssl.SSLError, OSError):
            outcome.append(False)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_context.wrap_socket(client_side) as tls:
            tls.recv(2)
    except (ssl.SSLError, OSError):
        pass
    thread.join(30)
    return outcome == [True]


def test_the_client_ca_is_reread_when_it_changes_and_only_its_certificates_pass(tmp_path: Path) -> None:
    first, second = CertificateAuthority(tmp_path / "first"), CertificateAuthority(tmp_path / "second")
    first_client = first.issue("c1", common_name="kube-apiserver-webhook-client", client=True)
    second_client = second.issue("c2", common_name="kube-apiserver-webhook-client", client=True)
    trusted = tmp_path / "client-ca.crt"
    trusted.write_bytes(first.pair.cert.read_bytes())
    made = SelfManagedCertificates([], ["127.0.0.1"], client_ca=trusted)
    assert handshake(made.context(), made.ca_bundle(), first_client)
    assert not handshake(made.context(), made.ca_bundle(), second_client)
    trusted.write_bytes(second.pair.cert.read_bytes())
    made.refresh()
    assert handshake(made.context(), made.ca_bundle(), second_client)
    assert not handshake(made.context(), made.ca_bundle(), first_client)
    trusted.write_bytes(b"")  # mid-swap: the bundle in use stays
    made.refresh()
    assert handshake(made.context(), made.ca_bundle(), second_client)
