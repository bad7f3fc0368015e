"""The serving certificate every webhook replica shares: kept by the replicas themselves in one Secret
of the release namespace (``webhook.tls.source: secret``), rotated without a moment where the API
server's ``caBundle`` and the certificate a replica serves disagree.

Why not the chart: a chart that makes key material must ``lookup`` the last one to keep it, and
``lookup`` returns nothing under ``helm template`` and GitOps tools, so every render minted a new CA.
Why not one CA per process (tls.py's ``SelfManagedCertificates``): two replicas would each put their
own CA in the bundle and fight over it.

What the Secret holds (``data``): ``ca.crt``, the CAs the webhook configuration's ``caBundle`` must
trust (one, or two during a rotation); ``tls.crt``/``tls.key``, the pair every replica serves;
during a rotation ``next.crt``/``next.key``, the pair signed by the new CA that replicas switch to
once the bundle trusts it. The annotation ``tessera.dev/tls-phase-since`` says when the Secret
entered its present phase. No CA key is kept: each rotation makes a CA, signs one serving
certificate with it, and forgets its key, so the CA and its certificate live and retire together.

The phases and the one step out of each (:func:`next_step`, pure, so tested with fixed clocks):

1. absent → CREATE: a CA and a certificate; the first replica to create wins, a loser (409) reads the
   winner's Secret and serves that. ``ca.crt`` also keeps the CAs the configuration's ``caBundle``
   holds at that moment, so webhooks still serving a certificate from before (an upgrade from the
   chart-made certificate) are not refused; step 4 drops them after ``settle``.
2. steady (one CA, no ``next``), certificate past ``renew_fraction`` of its life → ADD_CA: the new CA
   joins ``ca.crt`` and its certificate waits in ``next``; replicas go on serving ``tls.crt``.
3. adding (``next`` present) → SWITCH once the configuration's ``caBundle`` holds every CA of
   ``ca.crt`` and ``settle`` has passed since ADD_CA (every replica has polled the Secret and put
   the bigger bundle in place, and the API server has loaded it): ``next`` becomes ``tls``.
4. switched (several CAs - two after a rotation, up to five after CREATE kept the configuration's -
   no ``next``) → DROP_CA once ``settle`` has passed since SWITCH or CREATE (every replica polls
   well within it, so all serve the new certificate): ``ca.crt`` keeps only its issuer.
5. unreadable, or its certificate expired (no replica ran through a whole renewal period) → RESET:
   new material at once; the one case with a window, logged as a warning.

A replica that meets a Secret another replica is rotating does exactly what it does at any time: it
serves ``tls.crt``, sets the ``caBundle`` to ``ca.crt``, and takes the next step only if the phase
is due by the Secret's own timestamp, so a replica restarted mid-rotation carries on where the
Secret says. Every write is an update carrying the ``resourceVersion`` that was read, so of replicas
deciding the same step at once one wins and the others get 409, re-read and serve what won: the
Secret is the lock, and a step is never taken twice. A replica that read the Secret just before a
step may set the ``caBundle`` from the older ``ca.crt`` once more; the older bundle still trusts
what is served in the phase it describes (ADD_CA and DROP_CA change only ``ca.crt``, and SWITCH
waits ``settle`` after the bundle grew), and the next round sets it right.
"""

from __future__ import annotations

import base64
import datetime
import enum
import ipaddress
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import raw_json
from tessera.serving import read_client_ca, server_context
from tessera.webhook.tls import _BACKDATE, keep_ca_bundle, make_ca, make_serving

log = logging.getLogger(__name__)

PHASE_SINCE = "tessera.dev/tls-phase-since"


class Step(enum.Enum):
    KEEP = "keep"
    CREATE = "create"
    ADD_CA = "add-ca"
    SWITCH = "switch"
    DROP_CA = "drop-ca"
    RESET = "reset"


@dataclass(frozen=True)
class Stored:
    """What the Secret holds (PEM bytes), and when it entered its present phase."""

    ca_bundle: bytes
    cert: bytes
    key: bytes
    since: datetime.datetime
    next_cert: bytes = b""
    next_key: bytes = b""


@dataclass(frozen=True)
class Policy:
    """How long material lives, when it is renewed, and how long each rotation phase waits."""

    lifetime: datetime.timedelta
    renew_fraction: float
    settle: datetime.timedelta
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]


def _certificates(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem) if pem else []


def next_step(stored: Stored | None, now: datetime.datetime, configured: bytes, policy: Policy) -> Step:
    """The one step to take from ``stored`` (None: no Secret) at ``now``, given the ``caBundle`` the
    webhook configuration holds (``configured``). Raises nothing: unreadable material is RESET."""
    if stored is None:
        return Step.CREATE
    try:
        bundle = _certificates(stored.ca_bundle)
        [serving] = _certificates(stored.cert)
    except ValueError:
        return Step.RESET
    if not bundle or now >= serving.not_valid_after_utc:
        return Step.RESET
    settled = now >= stored.since + policy.settle
    if stored.next_cert:
        try:
            trusted = set(bundle) <= set(_certificates(configured))
        except ValueError:
            trusted = False
        return Step.SWITCH if trusted and settled else Step.KEEP
    if len(bundle) > 1:
        return Step.DROP_CA if settled else Step.KEEP
    issued = serving.not_valid_before_utc + _BACKDATE
    due = issued + (serving.not_valid_after_utc - issued) * policy.renew_fraction
    return Step.ADD_CA if now >= due else Step.KEEP


def _mint(now: datetime.datetime, policy: Policy) -> tuple[bytes, bytes, bytes]:
    """A new CA (PEM) and a serving certificate and key it signed; the CA's key is not kept."""
    ca, ca_key = make_ca(now, policy.lifetime)
    addresses = [ipaddress.ip_address(address) for address in policy.ip_addresses]
    serving = make_serving(ca, ca_key, list(policy.dns_names), addresses, now, policy.lifetime)
    return ca.cert_pem, serving.cert_pem, serving.key_pem


MAX_ADOPTED_CAS = 4
"""CAs of the configuration's caBundle a new Secret keeps trusting (see :func:`apply`), at most."""


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """By signature, not by name: two CAs minted in the same second carry the same name."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _still_trusted(configured: bytes, now: datetime.datetime) -> bytes:
    """The unexpired CAs of the configuration's ``caBundle`` (PEM), at most :data:`MAX_ADOPTED_CAS`;
    nothing when it cannot be read."""
    try:
        valid = [ca for ca in _certificates(configured) if ca.not_valid_after_utc > now]
    except ValueError:
        return b""
    return b"".join(ca.public_bytes(serialization.Encoding.PEM) for ca in valid[:MAX_ADOPTED_CAS])


def apply(
    step: Step, stored: Stored | None, now: datetime.datetime, policy: Policy, configured: bytes = b""
) -> Stored:
    """The Secret's content after ``step`` (KEEP: unchanged), given the ``caBundle`` the webhook
    configuration holds (``configured``).

    CREATE and RESET mint new material, and keep trusting the CAs the configuration trusts now: the
    webhooks serving at that moment (an upgrade from ``tls.source: chart``, replicas still serving
    material from before a Secret was deleted) present certificates those CAs signed, and would be
    refused until they switch. The new Secret starts as a rotation just switched does: several CAs,
    the new one serving, and DROP_CA leaves the issuer alone once ``settle`` has passed."""
    if step in (Step.CREATE, Step.RESET) or stored is None:
        ca, cert, key = _mint(now, policy)
        return Stored(ca + _still_trusted(configured, now), cert, key, now)
    if step is Step.ADD_CA:
        ca, cert, key = _mint(now, policy)
        return replace(stored, ca_bundle=stored.ca_bundle + ca, next_cert=cert, next_key=key, since=now)
    if step is Step.SWITCH:
        return Stored(stored.ca_bundle, stored.next_cert, stored.next_key, now)
    if step is Step.DROP_CA:
        [serving] = _certificates(stored.cert)
        issuer = [ca for ca in _certificates(stored.ca_bundle) if _signed_by(serving, ca)]
        pem = b"".join(ca.public_bytes(serialization.Encoding.PEM) for ca in issuer)
        return replace(stored, ca_bundle=pem, since=now)
    return stored


def to_secret(stored: Stored) -> dict[str, Any]:
    """The Secret's ``data`` and the phase annotation, as the API takes them."""
    data = {"ca.crt": stored.ca_bundle, "tls.crt": stored.cert, "tls.key": stored.key}
    if stored.next_cert:
        data |= {"next.crt": stored.next_cert, "next.key": stored.next_key}
    return {
        "metadata": {"annotations": {PHASE_SINCE: stored.since.isoformat()}},
        "data": {name: base64.b64encode(value).decode() for name, value in data.items()},
    }


UNUSABLE = Stored(b"", b"", b"", datetime.datetime.min.replace(tzinfo=datetime.UTC))
"""A Secret that is there but holds no usable material: :func:`next_step` RESETs it."""


def from_secret(body: dict[str, Any]) -> Stored:
    """The Secret read back (:data:`UNUSABLE` when something is missing or malformed)."""
    metadata, data = body.get("metadata") or {}, body.get("data") or {}
    try:
        since = datetime.datetime.fromisoformat((metadata.get("annotations") or {})[PHASE_SINCE])
        raw = {name: base64.b64decode(value) for name, value in data.items()}
        return Stored(
            raw["ca.crt"],
            raw["tls.crt"],
            raw["tls.key"],
            since,
            raw.get("next.crt", b""),
            raw.get("next.key", b""),
        )
    except (KeyError, ValueError, TypeError):
        return UNUSABLE


def configured_ca_bundle(api: client.ApiClient, configuration: str) -> bytes:
    """The ``caBundle`` every webhook of the MutatingWebhookConfiguration holds (empty when they
    differ or one has none: then nothing is trusted yet by all of them)."""
    body = raw_json(
        client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
            configuration, _preload_content=False
        )
    )
    bundles = {(w.get("clientConfig") or {}).get("caBundle") or "" for w in body.get("webhooks") or []}
    return base64.b64decode(bundles.pop()) if len(bundles) == 1 else b""


class SecretCertificates:
    """The serving certificate from the shared Secret, the Secret's rotation steps, and the
    ``caBundle`` kept to the Secret's ``ca.crt``: :meth:`refresh` does one round of all three."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        secret: str,
        configuration: str,
        policy: Policy,
        client_ca: Path | None = None,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._api = api
        self.namespace, self.secret, self.configuration = namespace, secret, configuration
        self.policy = policy
        self.client_ca = client_ca
        self._clock = clock
        self._lock = threading.Lock()
        self._served: tuple[bytes, bytes, bytes | None] | None = None
        self._context: ssl.SSLContext | None = None
        self.refresh()

    def _read(self) -> tuple[Stored | None, str]:
        """The Secret and its resourceVersion; (None, "") when there is none."""
        try:
            body = raw_json(
                self._core.read_namespaced_secret(self.secret, self.namespace, _preload_content=False)
            )
        except ApiException as error:
            if error.status == 404:
                return None, ""
            raise
        return from_secret(body), body["metadata"]["resourceVersion"]

    def _write(self, stored: Stored, version: str) -> bool:
        """Create (no ``version``) or update at ``version``; False when another replica wrote first."""
        body = to_secret(stored)
        body["metadata"] |= {"name": self.secret, "namespace": self.namespace}
        body["type"] = "Opaque"
        try:
            if version:
                body["metadata"]["resourceVersion"] = version
                self._core.replace_namespaced_secret(
                    self.secret, self.namespace, client.V1Secret.model_validate(body)
                )
            else:
                self._core.create_namespaced_secret(self.namespace, client.V1Secret.model_validate(body))
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def refresh(self) -> bool:
        """One round: read the Secret, take its next step if one is due, set the ``caBundle`` to
        it, serve its certificate; True when the served certificate changed. API errors propagate
        (the caller retries next round) and leave what is served as it was."""
        with self._lock:
            stored, version = self._read()
            configured = configured_ca_bundle(self._api, self.configuration)
            now = self._clock()
            step = next_step(stored, now, configured, self.policy)
            if step is not Step.KEEP:
                if step is Step.RESET:
                    log.warning(
                        "the webhook's TLS Secret %s/%s holds no usable certificate; replacing it: "
                        "until every replica and the API server have the new one, some reviews may fail",
                        self.namespace,
                        self.secret,
                    )
                if self._write(apply(step, stored, now, self.policy, configured), version):
                    log.info("TLS Secret %s/%s: %s", self.namespace, self.secret, step.value)
                else:
                    log.info(
                        "TLS Secret %s/%s written by another replica; reading it", self.namespace, self.secret
                    )
                stored, version = self._read()
            assert stored is not None
            try:
                keep_ca_bundle(self._api, self.configuration, stored.ca_bundle)
            except ApiException as error:
                if error.status != 409:
                    raise
                # Another replica set it between our read and write: from the same Secret, or from
                # one a step older, which the next round corrects (the module docstring says why
                # that is safe).
                log.info(
                    "caBundle of %s written by another replica; checking it next round", self.configuration
                )
            return self._serve(stored)

    def _serve(self, stored: Stored) -> bool:
        client_ca = self._served[2] if self._served is not None else None
        try:
            client_ca = read_client_ca(self.client_ca)
        except ValueError as error:  # mid-swap: keep trusting the bundle we have
            if self._served is None:
                raise
            log.warning("%s", error)
        served = (stored.cert, stored.key, client_ca)
        if served == self._served:
            return False
        changed = self._served is None or self._served[:2] != served[:2]
        self._context = server_context(stored.cert, stored.key, client_ca)
        self._served = served
        return changed

    def context(self) -> ssl.SSLContext:
        assert self._context is not None
        return self._context
