"""The API server's client certificate when the chart is given no CA for it (``webhook.clientAuth``
with none of ``caBundle``, ``caSecret``, ``caConfigMap``): made by the webhook, not the chart.

A chart that makes key material must ``lookup`` the last one to keep it, and ``lookup`` returns
nothing under ``helm template`` and GitOps tools, so each of their renders made a new client CA and
the certificate copied into the API server's kubeconfig stopped being trusted. Instead the first
webhook replica makes a CA and a client certificate (common name: the first allowed name, extended
key usage clientAuth) into a Secret of the release namespace (``ca.crt``, ``tls.crt``, ``tls.key``,
the layout the chart's Secret had, so docs/install.md's copy commands are unchanged); a replica
that loses the race to create it (409) reads the winner's. Every replica trusts that Secret's
``ca.crt``, written to a file the server re-reads as it would a mounted ``--client-ca-file``. It is
never rotated: the API server's kubeconfig holds a copy, so only a person can replace it (deleting
the Secret makes a new one, which the API server must then be given).
"""

from __future__ import annotations

import base64
import datetime
import logging
import os
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import raw_json
from tessera.webhook.tls import make_ca, make_leaf

log = logging.getLogger(__name__)


def client_material(name: str, lifetime: datetime.timedelta, now: datetime.datetime) -> dict[str, bytes]:
    """A CA and a client certificate for ``name`` it signed, as the Secret's keys; the CA's key is
    not kept (nothing else is ever signed with it)."""
    ca, ca_key = make_ca(now, lifetime)
    leaf = make_leaf(
        ca,
        ca_key,
        x509.Name.from_rfc4514_string(f"CN={name}"),
        [],
        ExtendedKeyUsageOID.CLIENT_AUTH,
        now,
        lifetime,
    )
    return {"ca.crt": ca.cert_pem, "tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem}


class ClientCaSecret:
    """The Secret ``namespace/name``, made when absent; :meth:`sync` writes its ``ca.crt`` to ``file``."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        client_name: str,
        lifetime: datetime.timedelta,
        file: Path,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self.namespace, self.name, self.client_name = namespace, name, client_name
        self.lifetime = lifetime
        self.file = file

    def _read(self) -> dict[str, bytes] | None:
        try:
            body = raw_json(
                self._core.read_namespaced_secret(self.name, self.namespace, _preload_content=False)
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return {key: base64.b64decode(value) for key, value in (body.get("data") or {}).items()}

    def _create(self) -> None:
        material = client_material(self.client_name, self.lifetime, datetime.datetime.now(datetime.UTC))
        body = {
            "metadata": {"name": self.name, "namespace": self.namespace},
            "type": "kubernetes.io/tls",
            "data": {key: base64.b64encode(value).decode() for key, value in material.items()},
        }
        try:
            self._core.create_namespaced_secret(self.namespace, client.V1Secret.model_validate(body))
        except ApiException as error:
            if error.status != 409:
                raise
            return  # another replica made it first: read theirs
        log.info("made the API server's client certificate in the Secret %s/%s", self.namespace, self.name)

    def sync(self) -> None:
        """Make the Secret if there is none, then write its ``ca.crt`` to ``file`` when it changed
        (by a rename, so the server never reads half a file). A Secret without ``ca.crt`` leaves the
        file as it was: the server goes on trusting the last CA, and refuses to start without one."""
        data = self._read()
        if data is None:
            self._create()
            data = self._read() or {}
        ca = data.get("ca.crt", b"")
        if not ca:
            log.warning(
                "the Secret %s/%s holds no ca.crt; trusting the client CA read before",
                self.namespace,
                self.name,
            )
            return
        if self.file.exists() and self.file.read_bytes() == ca:
            return
        self.file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.file.with_suffix(".partial")
        partial.write_bytes(ca)
        os.replace(partial, self.file)
