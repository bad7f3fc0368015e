"""Tessera's hand-written admission listener against aiohttp's server (3.14.5, already a dependency
through the kubernetes client), measured on what issue 37 asks of the port: how long a client that
stalls its handshake, or sends its head a header line at a time, is held; how many connections one
address can keep open; and the most reviews a second one process answers. Writes
server_library.{md,json} into benchmarks/webhook/results/ (or --out DIR).

    .venv/bin/python benchmarks/webhook/server_library.py [--seconds 10] [--out DIR]

Both servers run the same WebhookApp (the real admission decision; templates are not written) with
the same TLS context, which requires the API server's client certificate, each in a process of its
own on 127.0.0.1. aiohttp gets what it offers against these attacks: its defaults, and no handshake
timeout (TCPSite has no parameter for one). Everything is on loopback and every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.run_info import RunInfo
from benchmarks.webhook.admission import closed_loop
from benchmarks.webhook.harness import Target
from tessera.quantity import GiB
from tessera.webhook.authentication import DEFAULT_CLIENT_NAME, ClientPolicy
from tessera.webhook.fleet import Fleet
from tessera.webhook.server import WebhookApp, WebhookServer
from tessera.webhook.tls import SelfManagedCertificates
from testbed.pki import CertificateAuthority
from testbed.polling import poll_until
from testbed.process import free_port

RESULTS = Path(__file__).resolve().parent / "results"
HELD_AT_MOST = 30.0
"""Seconds a held connection is watched before it counts as held for good."""
ONE_ADDRESS = 1500
"""Connections one address opens at once."""


class NoTemplates:
    def ensure(self, template: dict[str, Any]) -> bool:
        return False


def serve(kind: str, port: int, folder: Path) -> None:
    """The server ``kind`` on 127.0.0.1:``port`` until killed; its CA bundle written to the folder."""
    certificates = SelfManagedCertificates([], ["127.0.0.1"], client_ca=folder / "client-ca" / "ca.crt")
    (folder / f"{kind}-ca.pem").write_bytes(certificates.ca_bundle())
    app = WebhookApp(lambda: Fleet(memory_sizes=(80 * GiB,), max_gpus_per_node=4), NoTemplates())
    if kind == "tessera":
        server = WebhookServer(
            app, certificates, "127.0.0.1", port, clients=ClientPolicy(frozenset({DEFAULT_CLIENT_NAME}))
        )
        server.start()
        while True:
            time.sleep(3600)
    from aiohttp import web

    async def mutate(request: web.Request) -> web.Response:
        status, body = app.review(await request.read())
        return web.Response(status=status, body=body, content_type="application/json")

    async def main() -> None:
        application = web.Application(client_max_size=3 * 2**20)
        application.router.add_post("/mutate", mutate)
        runner = web.AppRunner(application, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=certificates.context()).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def held_for(connection: socket.socket, send: list[bytes], every: float) -> float:
    """Seconds until the server closes ``connection``, which sends ``send`` one item every ``every``
    seconds (nothing at all when empty), at most HELD_AT_MOST."""
    started = time.monotonic()
    connection.settimeout(every)
    index = 0
    while time.monotonic() - started < HELD_AT_MOST:
        try:
            if send:
                connection.sendall(send[min(index, len(send) - 1)])
                index += 1
            if connection.recv(1) == b"":
                break
        except TimeoutError:
            continue
        except OSError:
            break
    connection.close()
    return round(time.monotonic() - started, 2)


def open_from_one_address(port: int) -> int:
    """How many of ONE_ADDRESS connections from 127.0.0.9 are still open 0.5 s after the last opened."""
    connections = []
    for _ in range(ONE_ADDRESS):
        connection = socket.socket()
        connection.bind(("127.0.0.9", 0))
        connection.connect(("127.0.0.1", port))
        connection.setblocking(False)
        connections.append(connection)
    time.sleep(0.5)
    still = 0
    for connection in connections:
        try:
            still += connection.recv(1) != b""
        except BlockingIOError:
            still += 1
        except OSError:
            pass
        connection.close()
    return still


def measure(kind: str, folder: Path, seconds: float) -> dict[str, Any]:
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "serve", kind, str(port), str(folder)])
    try:
        poll_until(lambda: (folder / f"{kind}-ca.pem").exists(), 30, f"{kind} started")
        time.sleep(1)
        client = folder / "client-ca" / "apiserver"
        target = Target(
            "127.0.0.1",
            port,
            "/mutate",
            ca_file=str(folder / f"{kind}-ca.pem"),
            cert_file=str(client.with_suffix(".crt")),
            key_file=str(client.with_suffix(".key")),
        )
        head = [b"POST /mutate HTTP/1.1\r\n"] + [f"X-Line-{n}: 1\r\n".encode() for n in range(100)]

        def plain() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=HELD_AT_MOST)

        def certified() -> socket.socket:  # past the handshake: the API server's certificate
            return target.context().wrap_socket(plain(), server_hostname="127.0.0.1")

        return {
            "stalled_handshake_held_s": held_for(plain(), [], 1.0),
            "partial_handshake_held_s": held_for(plain(), [b"\x16\x03\x01"], 1.0),
            "slow_head_held_s": held_for(certified(), head, 1.0),
            "open_from_one_address": open_from_one_address(port),
            "flat_out": closed_loop(target, connections=16, seconds=seconds, processes=2),
        }
    finally:
        process.kill()
        process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = RunInfo.start(["tessera/webhook", "tessera/serving.py", "tessera/peer_slots.py"])
    with tempfile.TemporaryDirectory(prefix="tessera-library-") as scratch:
        folder = Path(scratch)
        ca = CertificateAuthority(folder / "client-ca", common_name="apiserver-client-ca")
        ca.issue("apiserver", common_name=DEFAULT_CLIENT_NAME, client=True)
        results = {kind: measure(kind, folder, args.seconds) for kind in ("tessera", "aiohttp")}
    info.finish()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "server_library.json").write_text(json.dumps({"run": info.as_json(), **results}, indent=2))
    lines = ["# The admission listener: hand-written or aiohttp", "", *info.markdown(), ""]
    lines.append(f"Held connections are watched for at most {HELD_AT_MOST:g} s.\n")
    lines.append("| measure | tessera | aiohttp |\n|---|---|---|")
    for key in (
        "stalled_handshake_held_s",
        "partial_handshake_held_s",
        "slow_head_held_s",
        "open_from_one_address",
    ):
        lines.append(f"| {key} | {results['tessera'][key]} | {results['aiohttp'][key]} |")
    for key in ("rate_per_s", "p50_ms", "p99_ms", "errors"):
        row = [results[kind]["flat_out"].get(key) for kind in ("tessera", "aiohttp")]
        lines.append(f"| flat out, 16 connections: {key} | {row[0]} | {row[1]} |")
    (args.out / "server_library.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
    else:
        sys.exit(main())
