"""Who may post reviews to ``/mutate``: the Kubernetes API server, known by its client certificate.

Anything that can reach the webhook's port (any pod, without a NetworkPolicy) could otherwise post a
forged AdmissionReview, naming any namespace, and have templates created there. The API server
presents a client certificate to admission webhooks when its admission configuration gives it one
(docs/install.md, "Authenticating the API server to the webhook"); the TLS layer verifies that
certificate against the client CA bundle (webhook/tls.py), and this policy then accepts only the
common names it is given. Refusals are HTTP statuses with one sentence, before the body is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.quantity import quote

DEFAULT_CLIENT_NAME = "kube-apiserver-webhook-client"
"""The common name the docs and the test bed give the API server's client certificate."""


def common_names(peer: Mapping[str, Any] | None) -> list[str]:
    """The subject common names of a verified peer certificate as ``ssl`` reports it."""
    names: list[str] = []
    for rdn in (peer or {}).get("subject", ()):
        names += [value for attribute, value in rdn if attribute == "commonName"]
    return names


@dataclass(frozen=True)
class ClientPolicy:
    """The common names allowed to post reviews; the certificate itself was verified by TLS."""

    names: frozenset[str]

    def refusal(self, peer: Mapping[str, Any] | None) -> tuple[int, str] | None:
        """None for an allowed caller, else the HTTP status (403 for a certificate of another
        name) and the sentence to answer with. With authentication on, the TLS layer already
        refuses a handshake without a certificate; the 401 for a missing one stays as a second
        line of defence, should a listener ever be set up without that requirement."""
        if not peer:
            return 401, (
                "a client certificate is required: this webhook answers only the Kubernetes API server "
                "(see the webhook's authentication in docs/install.md)."
            )
        presented = common_names(peer)
        if not any(name in self.names for name in presented):
            allowed = ", ".join(sorted(self.names))
            shown = quote(presented[0]) if presented else "without a common name"
            return 403, f"client certificate {shown} is not allowed to post reviews (allowed: {allowed})."
        return None
