"""A caller of the webhook's port as the unit and integration tests play it (the API server with its
client certificate, or a tenant with none or another): its TLS context, a raw TLS connection for
what http.client will not send (stalled heads, unread bodies), and the answer read until the
server closes. Written once so both tiers meet the server the same way."""

from __future__ import annotations

import socket
import ssl

from tessera.webhook.tls import SelfManagedCertificates
from testbed.pki import KeyPair


def client_context(certificates: SelfManagedCertificates, client: KeyPair | None) -> ssl.SSLContext:
    """Trusts the webhook's CA and presents ``client``'s certificate (none when None)."""
    context = ssl.create_default_context(cadata=certificates.ca_bundle().decode())
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


def tls_socket(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    """A TLS connection to the webhook on 127.0.0.1:``port``, handshake done."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def answer_of(connection: ssl.SSLSocket) -> bytes:
    """Everything the server sends until it closes the connection (b"" if it just closes)."""
    received = b""
    while True:
        try:
            chunk = connection.recv(65536)
        except (ConnectionError, ssl.SSLError):
            return received
        if not chunk:
            return received
        received += chunk


def handshake_refused(port: int, context: ssl.SSLContext) -> bool:
    """Whether the webhook on 127.0.0.1:``port`` refuses a connection with ``context`` in its TLS
    handshake. TLS 1.3 lets the client finish its side first, so the refusal shows on the first read."""
    try:
        connection = tls_socket(port, context)
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return connection.recv(1) == b""
    except (ssl.SSLError, ConnectionError):
        return True
