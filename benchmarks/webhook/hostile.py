"""What hostile input costs the webhook (issue 21): each attack's answer and how long it took, and
what a steady stream of real, authenticated GPU-pod reviews got meanwhile. Writes
hostile.{md,json} into benchmarks/webhook/results/ (or --out DIR).

    .venv/bin/python benchmarks/webhook/hostile.py [--rate 50] [--repeats 5] [--out DIR]

The webhook runs as in production, with client-certificate auth (benchmarks/webhook/harness.py).
The attacks, each repeated ``--repeats`` times while the stream runs: reviews whose gpumem is
``1e1000000``, ``1e5000`` and ``Infinity`` (with the API server's certificate, so they reach the
quantity parser), a 10 MB body (with the certificate, so it meets the size bound), a review
without a certificate (refused in the TLS handshake, which requires one), and ``--slow`` TCP
connections at once that never start their handshake (a tenant has no certificate, so that is as
far as it gets). An attack's time runs from its first byte sent to the answer's head received, or
to the connection's refusal or close. The stream is open loop (latency from each
request's due time) from its own client processes; /healthz and /readyz are polled every 0.2 s
throughout. Everything is on loopback and every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import ssl
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.run_info import RunInfo
from benchmarks.webhook.harness import (
    GPU_LIMITS,
    RunningWebhook,
    Sender,
    open_loop,
    review_body,
    running_webhook,
)

RESULTS = Path(__file__).resolve().parent / "results"
ANSWER_WAIT = 5.0
"""How long an attack waits for its answer before it counts as unanswered (the bar is 1 s)."""
STREAM_LEAD = 4.0
"""Seconds from starting the stream to the first attack: open_loop starts its schedule 3 s after
it is called, and one more second measures the stream before the attack."""


@dataclass(frozen=True)
class Attempt:
    """One attack's answer: the HTTP status (or what happened instead), the review's own status
    code when the HTTP answer is a review, and the seconds from first byte sent to answer."""

    status: str
    review_code: int | None
    seconds: float
    handshake: float = 0.0
    """Seconds the TCP connect and TLS handshake took before the first byte (they queue when 200
    connections open at once)."""


Attack = Callable[[RunningWebhook], Coroutine[Any, Any, list[Attempt]]]


def _context(webhook: RunningWebhook, certified: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=webhook.ca)
    if certified:
        context.load_cert_chain(webhook.direct.cert_file, webhook.direct.key_file)
    return context


def _head(length: int) -> bytes:
    return (
        "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


async def _post(webhook: RunningWebhook, body: bytes, certified: bool) -> Attempt:
    """Post ``body`` on a fresh TLS connection and read the answer's head while the body may still
    be going out (a refused 10 MB upload is answered from its head)."""
    opened = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", webhook.port, ssl=_context(webhook, certified), server_hostname="127.0.0.1"
        )
    except OSError as error:  # ssl.SSLError included: the server refused the handshake
        return Attempt(f"handshake refused ({type(error).__name__})", None, time.perf_counter() - opened)
    try:
        began = time.perf_counter()
        writer.write(_head(len(body)))
        writer.write(body)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_WAIT)
        except TimeoutError:
            return Attempt("no answer", None, time.perf_counter() - began, began - opened)
        except (asyncio.IncompleteReadError, OSError) as error:  # a refused handshake shows here in TLS 1.3
            return Attempt(
                f"closed ({type(error).__name__})", None, time.perf_counter() - began, began - opened
            )
        seconds = time.perf_counter() - began
        status = head.split(b" ", 2)[1].decode()
        review_code = None
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        if status == "200" and length:
            answer = json.loads(await asyncio.wait_for(reader.readexactly(length), ANSWER_WAIT))
            response = answer["response"]
            review_code = 200 if response.get("allowed") else int(response["status"]["code"])
        return Attempt(status, review_code, seconds, began - opened)
    finally:
        writer.transport.abort()


async def _stall(webhook: RunningWebhook) -> Attempt:
    """One slow client: a TCP connection that never sends its TLS ClientHello; the answer is how
    long the server keeps it (its time runs from the TCP connect)."""
    opened = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", webhook.port), ANSWER_WAIT
        )
    except (OSError, TimeoutError) as error:
        return Attempt(f"connect failed ({type(error).__name__})", None, time.perf_counter() - opened)
    began = time.perf_counter()
    try:
        try:
            left = await asyncio.wait_for(reader.read(), ANSWER_WAIT)
        except TimeoutError:
            return Attempt("still open", None, time.perf_counter() - began, began - opened)
        except OSError as error:
            return Attempt(
                f"reset ({type(error).__name__})", None, time.perf_counter() - began, began - opened
            )
        status = "closed" if not left else "answered"
        return Attempt(status, None, time.perf_counter() - began, began - opened)
    finally:
        writer.transport.abort()


def _quantity(gpumem: str) -> Attack:
    async def attack(webhook: RunningWebhook) -> list[Attempt]:
        limits = {**GPU_LIMITS, "nvidia.com/gpumem": gpumem}
        return [await _post(webhook, review_body(900_000, limits), certified=True)]

    return attack


async def _huge(webhook: RunningWebhook) -> list[Attempt]:
    return [await _post(webhook, b"{" + b" " * (10_000_000 - 2) + b"}", certified=True)]


async def _uncertified(webhook: RunningWebhook) -> list[Attempt]:
    return [await _post(webhook, review_body(900_001), certified=False)]


def _slow(connections: int) -> Attack:
    async def attack(webhook: RunningWebhook) -> list[Attempt]:
        return list(await asyncio.gather(*(_stall(webhook) for _ in range(connections))))

    return attack


class Probes:
    """/healthz and /readyz on the plain port, every 0.2 s, in a thread, until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: list[tuple[float, str, int, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            for path in ("/healthz", "/readyz"):
                began = time.perf_counter()
                try:
                    connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                    connection.request("GET", path)
                    status = connection.getresponse().status
                    connection.close()
                except OSError:
                    status = 0
                self.seen.append((time.time(), path, status, time.perf_counter() - began))

    def between(self, start: float, end: float) -> dict[str, Any]:
        window = [s for s in self.seen if start <= s[0] <= end]
        return {
            "probes": len(window),
            "not_200": sum(1 for s in window if s[2] != 200),
            "max_ms": round(max((s[3] for s in window), default=0.0) * 1000, 1),
        }


def _attempts(attempts: list[Attempt]) -> dict[str, Any]:
    times = sorted(a.seconds for a in attempts)
    return {
        "attempts": len(attempts),
        "statuses": dict(Counter(a.status for a in attempts)),
        "review_codes": dict(Counter(str(a.review_code) for a in attempts if a.review_code is not None)),
        "p50_ms": round(statistics.median(times) * 1000, 1),
        "max_ms": round(times[-1] * 1000, 1),
        "handshake_max_ms": round(max(a.handshake for a in attempts) * 1000, 1),
    }


def phase(
    webhook: RunningWebhook,
    probes: Probes,
    attack: Attack | None,
    rate: float,
    seconds: float,
    repeats: int,
    processes: int,
) -> dict[str, Any]:
    """The stream for ``seconds`` and, from STREAM_LEAD on, ``repeats`` rounds of ``attack`` 0.5 s
    apart (they fit well inside the stream's window)."""
    stream: dict[str, Any] = {}
    began = time.time()
    sender = threading.Thread(
        target=lambda: stream.update(open_loop(webhook.direct, "review", rate, seconds, processes))
    )
    sender.start()
    attempts: list[Attempt] = []
    if attack is not None:
        time.sleep(STREAM_LEAD)
        for _ in range(repeats):
            attempts += asyncio.run(attack(webhook))
            time.sleep(0.5)
    sender.join()
    result: dict[str, Any] = {"stream": stream, "health": probes.between(began, time.time())}
    if attempts:
        result["attack"] = _attempts(attempts)
    return result


def refused_counts(port: int) -> dict[str, float]:
    """tessera_webhook_requests_refused_total by status, from the webhook's own /metrics."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tessera_webhook_requests_refused_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels.split('status="', 1)[1].split('"', 1)[0]] = float(value)
    return counts


ATTACKS: list[tuple[str, str]] = [
    ("gpumem 1e1000000", "review, API server's certificate, `nvidia.com/gpumem: 1e1000000`"),
    ("gpumem 1e5000", "review, API server's certificate, `nvidia.com/gpumem: 1e5000`"),
    ("gpumem Infinity", "review, API server's certificate, `nvidia.com/gpumem: Infinity`"),
    ("10 MB body", "10,000,000-byte body with its Content-Length, API server's certificate"),
    ("no client certificate", "an ordinary GPU-pod review without a certificate"),
    ("slow connections", "concurrent TCP connections that never send their TLS ClientHello"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=50, help="real reviews per second during each attack")
    parser.add_argument("--seconds", type=float, default=10, help="length of the stream in each phase")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of each attack")
    parser.add_argument("--slow", type=int, default=200, help="slow connections per round")
    parser.add_argument("--processes", type=int, default=2, help="client processes sending the stream")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = RunInfo.start(
        ["tessera/webhook", "tessera/quantity.py", "tessera/names.py", "charts/tessera/files"]
    )
    attacks: dict[str, Attack | None] = {
        "none (baseline)": None,
        "gpumem 1e1000000": _quantity("1e1000000"),
        "gpumem 1e5000": _quantity("1e5000"),
        "gpumem Infinity": _quantity("Infinity"),
        "10 MB body": _huge,
        "no client certificate": _uncertified,
        "slow connections": _slow(args.slow),
    }
    figures: dict[str, Any] = {
        "rate": args.rate,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "slow": args.slow,
    }
    with running_webhook() as webhook:
        warm = Sender(webhook.direct)
        for i in range(50):  # the template created and remembered, as in admission.py
            warm(review_body(i))
        probes = Probes(webhook.metrics_port)
        probes.thread.start()
        phases: dict[str, Any] = {}
        for name, attack in attacks.items():
            phases[name] = phase(
                webhook, probes, attack, args.rate, args.seconds, args.repeats, args.processes
            )
            print(name, phases[name], flush=True)
        probes.stop.set()
        probes.thread.join()
        figures["phases"] = phases
        figures["refused_by_status"] = refused_counts(webhook.metrics_port)
    figures["webhook_exit_code_on_sigterm"] = webhook.exit_code
    info.finish()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hostile.json").write_text(
        json.dumps({"run": info.as_json(), "figures": figures}, indent=1) + "\n"
    )
    (args.out / "hostile.md").write_text("\n".join(report(info, figures, args.slow)) + "\n")
    print((args.out / "hostile.md").read_text())
    return 0


def report(info: RunInfo, figures: dict[str, Any], slow: int) -> list[str]:
    """The results page: one row per attack, its answers beside the stream's."""
    lines = [
        "# Webhook under hostile input",
        "",
        *info.markdown(),
        "",
        f"Real reviews: {figures['rate']:g}/s for {figures['seconds']:g} s per row, open loop, with the API "
        f"server's certificate. Each attack ran {figures['repeats']} rounds during its row's stream.",
        "",
        "| attack | answers (HTTP status: count) | review code | attack p50 ms | attack max ms "
        "| handshake max ms | real answered | real p50 ms | real p99 ms | real failed | probes (not 200) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    descriptions = dict(ATTACKS)
    for name, result in figures["phases"].items():
        stream, health = result["stream"], result["health"]
        attack = result.get("attack")
        label = name if attack is None else f"{name}: {descriptions[name]}"
        if name == "slow connections":
            label = f"{slow} {label}"
        cells = [
            label,
            ", ".join(f"{k}: {v}" for k, v in attack["statuses"].items()) if attack else "-",
            ", ".join(f"{k}: {v}" for k, v in attack["review_codes"].items())
            if attack and attack["review_codes"]
            else "-",
            attack["p50_ms"] if attack else "-",
            attack["max_ms"] if attack else "-",
            attack["handshake_max_ms"] if attack else "-",
            stream["requests"],
            stream["p50_ms"],
            stream["p99_ms"],
            stream["errors"],
            f"{health['probes']} ({health['not_200']})",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        f"The webhook's own count of refused requests (`tessera_webhook_requests_refused_total` by "
        f"status) at the end: {figures['refused_by_status']}. Exit status on SIGTERM: "
        f"{figures['webhook_exit_code_on_sigterm']}.",
        "",
        "How to read it: an attack's time runs from its first byte sent (after the TLS handshake, whose "
        "own time is the handshake column) to the answer's head, or for a refused handshake from the "
        "TCP connect to the refusal, and for a slow connection from its TCP connect to the server's "
        "close; a quantity review is answered HTTP "
        "200 with the pod denied, and the review "
        "code is the one the API server passes on to the pod's creator. The real stream's latencies run "
        "from each request's due time, so queueing counts; 'real failed' counts reviews not answered "
        "200 with a patch. Probes are /healthz and /readyz on the plain port every 0.2 s during the row. "
        "Attackers, stream and webhook share the machine's cores.",
    ]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
