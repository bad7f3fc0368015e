"""The shared Secret's rotation steps (tessera/webhook/secret_tls.py), decided from the Secret, the
configuration's caBundle and a fixed clock: a new CA is trusted before it serves, and the old one
leaves only after every replica had time to switch."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from tessera.webhook.secret_tls import (
    MAX_ADOPTED_CAS,
    UNUSABLE,
    Policy,
    Step,
    Stored,
    apply,
    from_secret,
    next_step,
    to_secret,
)

DAY = datetime.timedelta(days=1)
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
POLICY = Policy(
    lifetime=90 * DAY,
    renew_fraction=2 / 3,
    settle=datetime.timedelta(minutes=10),
    dns_names=("tessera-webhook.tessera.svc",),
    ip_addresses=("127.0.0.1",),
)


def cas(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def issuer_of(cert_pem: bytes, bundle: bytes) -> x509.Certificate:
    """The one CA of ``bundle`` that signed the certificate (by signature: names can repeat)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    [issuer] = [ca for ca in cas(bundle) if signed_by(cert, ca)]
    return issuer


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def created() -> Stored:
    return apply(Step.CREATE, None, START, POLICY)


def test_no_secret_is_created_with_one_ca_that_signed_the_served_certificate() -> None:
    assert next_step(None, START, b"", POLICY) is Step.CREATE
    stored = created()
    assert issuer_of(stored.cert, stored.ca_bundle) == cas(stored.ca_bundle)[0]
    names = x509.load_pem_x509_certificate(stored.cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert names.value.get_values_for_type(x509.DNSName) == ["tessera-webhook.tessera.svc"]
    assert not stored.next_cert


def test_nothing_happens_before_the_renewal_point() -> None:
    stored = created()
    assert next_step(stored, START + 59 * DAY, stored.ca_bundle, POLICY) is Step.KEEP


def test_a_rotation_adds_the_ca_first_switches_once_trusted_and_drops_the_old_ca_last() -> None:
    stored = created()
    [old_ca] = cas(stored.ca_bundle)
    now = START + 61 * DAY
    assert next_step(stored, now, stored.ca_bundle, POLICY) is Step.ADD_CA
    adding = apply(Step.ADD_CA, stored, now, POLICY)
    assert adding.cert == stored.cert  # still serving the old certificate
    old, new_ca = cas(adding.ca_bundle)
    assert old == old_ca
    assert issuer_of(adding.next_cert, adding.ca_bundle) == new_ca

    # Not before the configuration trusts both CAs, and not before the settle time.
    assert next_step(adding, now + DAY, stored.ca_bundle, POLICY) is Step.KEEP
    assert next_step(adding, now + datetime.timedelta(minutes=1), adding.ca_bundle, POLICY) is Step.KEEP
    now += datetime.timedelta(minutes=11)
    assert next_step(adding, now, adding.ca_bundle, POLICY) is Step.SWITCH
    switched = apply(Step.SWITCH, adding, now, POLICY)
    assert (switched.cert, switched.key) == (adding.next_cert, adding.next_key)
    assert switched.ca_bundle == adding.ca_bundle and not switched.next_cert

    # The old CA stays until every replica had the settle time to serve the new certificate.
    assert next_step(switched, now + datetime.timedelta(minutes=9), switched.ca_bundle, POLICY) is Step.KEEP
    now += datetime.timedelta(minutes=11)
    assert next_step(switched, now, switched.ca_bundle, POLICY) is Step.DROP_CA
    dropped = apply(Step.DROP_CA, switched, now, POLICY)
    assert cas(dropped.ca_bundle) == [new_ca]
    assert dropped.cert == switched.cert
    assert next_step(dropped, now, dropped.ca_bundle, POLICY) is Step.KEEP


def test_every_phase_serves_a_certificate_its_own_bundle_trusts() -> None:
    stored, now = created(), START
    for _ in range(7):  # more than two whole rotations
        issuer_of(stored.cert, stored.ca_bundle)
        step = next_step(stored, now, stored.ca_bundle, POLICY)
        stored = apply(step, stored, now, POLICY)
        now += 20 * DAY if step is Step.KEEP else datetime.timedelta(minutes=11)


def test_an_expired_or_unreadable_secret_is_reset() -> None:
    stored = created()
    assert next_step(stored, START + 91 * DAY, stored.ca_bundle, POLICY) is Step.RESET
    assert next_step(UNUSABLE, START, b"", POLICY) is Step.RESET
    garbled = Stored(b"not pem", stored.cert, stored.key, START)
    assert next_step(garbled, START, b"", POLICY) is Step.RESET


def test_the_secret_round_trips_through_its_api_form() -> None:
    adding = apply(Step.ADD_CA, created(), START + 61 * DAY, POLICY)
    body = to_secret(adding)
    assert set(body["data"]) == {"ca.crt", "tls.crt", "tls.key", "next.crt", "next.key"}
    assert from_secret(body) == adding
    assert from_secret({"metadata": {}, "data": body["data"]}) is UNUSABLE
    assert from_secret({}) is UNUSABLE


def test_a_new_secret_keeps_trusting_what_the_configuration_trusts_until_settled() -> None:
    """An upgrade from the chart-made certificate: the old replicas serve a certificate the chart's
    CA signed, and the configuration's caBundle holds that CA. The first replica's new Secret keeps
    it beside its own CA, so the API server trusts old and new replicas alike; once every replica
    serves the new certificate (settle), the old CA goes."""
    [chart_ca] = cas(created().ca_bundle)  # another CA, as the chart made one
    configured = chart_ca.public_bytes(serialization.Encoding.PEM)
    assert next_step(None, START, configured, POLICY) is Step.CREATE
    stored = apply(Step.CREATE, None, START, POLICY, configured)
    new_ca, kept = cas(stored.ca_bundle)
    assert kept == chart_ca
    assert issuer_of(stored.cert, stored.ca_bundle) == new_ca
    assert not stored.next_cert
    assert next_step(stored, START + datetime.timedelta(minutes=1), stored.ca_bundle, POLICY) is Step.KEEP
    later = START + datetime.timedelta(minutes=11)
    assert next_step(stored, later, stored.ca_bundle, POLICY) is Step.DROP_CA
    assert cas(apply(Step.DROP_CA, stored, later, POLICY).ca_bundle) == [new_ca]


def test_only_readable_unexpired_cas_are_kept_and_only_a_few() -> None:
    expired = apply(Step.CREATE, None, START - 100 * DAY, POLICY).ca_bundle
    assert len(cas(apply(Step.CREATE, None, START, POLICY, expired).ca_bundle)) == 1
    assert len(cas(apply(Step.RESET, UNUSABLE, START, POLICY, b"not pem").ca_bundle)) == 1
    many = b"".join(created().ca_bundle for _ in range(MAX_ADOPTED_CAS + 3))
    assert len(cas(apply(Step.CREATE, None, START, POLICY, many).ca_bundle)) == 1 + MAX_ADOPTED_CAS


def test_the_old_ca_is_dropped_by_signature_even_when_both_cas_share_a_name() -> None:
    first, second = created(), created()  # minted in the same second: the same subject
    assert cas(first.ca_bundle)[0].subject == cas(second.ca_bundle)[0].subject
    both = Stored(second.ca_bundle + first.ca_bundle, second.cert, second.key, START)
    assert cas(apply(Step.DROP_CA, both, START, POLICY).ca_bundle) == cas(second.ca_bundle)
