"""What a hostile tenant sends the webhook from inside its own pod, straight to a replica's pod IP
(tests/e2e/test_tenant_attacks.py runs it in a container of the webhook's image, for its Python):
forged AdmissionReviews, an oversized body, and connections that send their headers slowly.

Standard library only, no certificate and no token: what any pod has. Each outcome is printed as
one line of ``key=value`` words; ``outcome`` is ``http-<status>`` when the server answered,
``refused-<reason>`` when the connection was refused or closed before an answer (a TLS handshake
that wants a client certificate, a reset), ``open`` when it was still waiting at the end.

    webhook_attack.py forged HOST PORT NAMESPACE...   one forged review per NAMESPACE: a pod asking
                                                       80000 MiB there, from system:anonymous
    webhook_attack.py body HOST PORT MEGABYTES         one well-formed review whose pod carries an
                                                       annotation of MEGABYTES MiB
    webhook_attack.py slow HOST PORT COUNT SECONDS     COUNT connections sending one header byte a
                                                       second, for at most SECONDS
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any

TIMEOUT = 30.0


def context() -> ssl.SSLContext:
    """The attacker does not check the server's certificate and has none of its own."""
    made = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    made.check_hostname = False
    made.verify_mode = ssl.CERT_NONE
    return made


def review(namespace: str, pod: dict[str, Any]) -> bytes:
    """An AdmissionReview v1 for the CREATE of ``pod`` in ``namespace``, as the apiserver would
    send it, but from nobody."""
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": namespace,
                "name": pod["metadata"]["name"],
                "userInfo": {"username": "system:anonymous", "groups": ["system:unauthenticated"]},
                "object": {"apiVersion": "v1", "kind": "Pod", **pod},
                "dryRun": False,
            },
        }
    ).encode()


def post(host: str, port: int, body: bytes) -> tuple[str, float]:
    """POST ``body`` to /mutate on a connection of its own; the outcome and the seconds it took to
    come back. A raw socket, not http.client: a server may answer (413, 401) and close before it
    has read everything sent, and the answer still counts."""
    started = time.monotonic()
    head = (
        f"POST /mutate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    answer = b""
    try:
        with (
            socket.create_connection((host, port), timeout=TIMEOUT) as raw,
            context().wrap_socket(raw, server_hostname=host) as tls,
        ):
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
                tls.sendall(head + body)
            while chunk := tls.recv(65536):
                answer += chunk
    except TimeoutError:
        return ("open" if not answer else outcome_of(answer)), time.monotonic() - started
    except ssl.SSLError as error:
        if not answer:
            return f"refused-tls-{error.reason or 'error'}", time.monotonic() - started
    except ConnectionError as error:
        if not answer:
            return f"refused-{type(error).__name__}", time.monotonic() - started
    return outcome_of(answer), time.monotonic() - started


def outcome_of(answer: bytes, show: bool = True) -> str:
    """``http-<status>`` of what the server sent back (with ``show``, printed shortened as a
    comment line), ``refused-closed`` for nothing."""
    if not answer:
        return "refused-closed"
    if show:
        print(f"# {answer[:400]!r}", flush=True)
    words = answer.split(b" ", 2)
    return f"http-{words[1].decode(errors='replace')}" if answer.startswith(b"HTTP/") else "http-?"


def forged(host: str, port: int, namespaces: list[str]) -> None:
    for namespace in namespaces:
        pod = {
            "metadata": {"name": "forged", "namespace": namespace},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "none",
                        "resources": {"limits": {"nvidia.com/gpumem": "80000", "nvidia.com/gpucores": "100"}},
                    }
                ]
            },
        }
        outcome, seconds = post(host, port, review(namespace, pod))
        print(f"namespace={namespace} outcome={outcome} ms={seconds * 1000:.0f}", flush=True)


def body(host: str, port: int, megabytes: int) -> None:
    pod = {
        "metadata": {"name": "big", "namespace": "default", "annotations": {"pad": "a" * (megabytes << 20)}},
        "spec": {"containers": [{"name": "main", "image": "none"}]},
    }
    sent = review("default", pod)
    outcome, seconds = post(host, port, sent)
    print(f"bytes={len(sent)} outcome={outcome} ms={seconds * 1000:.0f}", flush=True)


def slow_one(host: str, port: int, deadline: float, outcomes: list[str]) -> None:
    """One connection that completes TLS, then sends a request line and headers a byte a second."""
    try:
        raw = socket.create_connection((host, port), timeout=TIMEOUT)
        tls = context().wrap_socket(raw, server_hostname=host)
    except ssl.SSLError as error:
        outcomes.append(f"refused-tls-{error.reason or 'error'}")
        return
    except OSError as error:
        outcomes.append(f"refused-{type(error).__name__}")
        return
    request = b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nX-Slow: "
    tls.settimeout(1.0)
    try:
        sent = 0
        while time.monotonic() < deadline:
            if sent < len(request):
                tls.sendall(request[sent : sent + 1])
                sent += 1
            else:
                tls.sendall(b"a")
            try:
                answer = tls.recv(200)
            except TimeoutError:
                continue
            if not answer:
                outcomes.append("refused-closed")
                return
            outcomes.append(outcome_of(answer, show=False))
            return
        outcomes.append("open")
    except ssl.SSLError as error:
        outcomes.append(f"refused-tls-{error.reason or 'error'}")
    except OSError as error:
        outcomes.append(f"refused-{type(error).__name__}")
    finally:
        tls.close()


def slow(host: str, port: int, count: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    outcomes: list[str] = []
    threads = [
        threading.Thread(target=slow_one, args=(host, port, deadline, outcomes), daemon=True)
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + TIMEOUT)
    counted = Counter(outcomes)
    print(f"connections={count} answered={len(outcomes)}", flush=True)
    for outcome, n in sorted(counted.items()):
        print(f"outcome={outcome} count={n}", flush=True)


def main(argv: list[str]) -> int:
    mode, host, port = argv[1], argv[2], int(argv[3])
    if mode == "forged":
        forged(host, port, argv[4:])
    elif mode == "body":
        body(host, port, int(argv[4]))
    elif mode == "slow":
        slow(host, port, int(argv[4]), float(argv[5]))
    else:
        print(f"unknown mode {mode}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
