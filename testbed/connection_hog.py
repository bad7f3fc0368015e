"""A tenant holding as many of a server's connections as it can, from addresses of its own: the
attacker of issue 37, run as a process of its own so that its CPU is not the test's.

    python -m testbed.connection_hog SECONDS JOB...

Each JOB is ``KIND:PORT:COUNT:SOURCE`` (127.0.0.1:PORT; SOURCE is the address connections are
made from, another loopback address standing for another pod). Every one of the COUNT connections
is reopened as soon as the server closes it (after ``REOPEN_PAUSE``), for SECONDS:

- ``tls-idle``: a TLS handshake without a client certificate, then silence;
- ``tcp-idle``: a TCP connection that never starts its handshake;
- ``slow-head``: plain HTTP, a request line and then one header line every ``HEADER_EVERY`` seconds,
  never the blank line that ends the head.

At the end it prints one JSON line: per job, the connections opened and how many the server closed.
Standard library only; the file-descriptor limit is raised to its hard limit first, since 2 000
connections pass the usual soft limit of 1 024.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import ssl
import sys
from dataclasses import dataclass

REOPEN_PAUSE = 1.0
"""Seconds before a closed connection is opened again: the attacker holds connections, it does not
flood handshakes (a different attack, bounded by the attacker's own CPU)."""

HEADER_EVERY = 5.0


@dataclass
class Job:
    kind: str
    port: int
    count: int
    source: str
    opened: int = 0
    closed_by_server: int = 0


def _context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def _hold(job: Job, stop: asyncio.Event) -> None:
    """One of the job's connections, reopened whenever the server closes it, until ``stop``."""
    while not stop.is_set():
        writer = None
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1",
                job.port,
                ssl=_context() if job.kind == "tls-idle" else None,
                local_addr=(job.source, 0),
            )
            job.opened += 1
            if job.kind == "slow-head":
                writer.write(b"GET /healthz HTTP/1.1\r\n")
                line = 0
                while not stop.is_set() and not reader.at_eof():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(reader.read(1), HEADER_EVERY)
                    writer.write(f"X-Line-{line}: 1\r\n".encode())
                    await writer.drain()
                    line += 1
            else:
                await reader.read(1)  # returns when the server closes it
            if not stop.is_set():
                job.closed_by_server += 1
        except (OSError, ssl.SSLError, EOFError):
            if not stop.is_set():
                job.closed_by_server += 1
        finally:
            if writer is not None:
                writer.transport.abort()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), REOPEN_PAUSE)


async def _run(seconds: float, jobs: list[Job]) -> None:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_hold(job, stop)) for job in jobs for _ in range(job.count)]
    await asyncio.sleep(seconds)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def parse(spec: str) -> Job:
    kind, port, count, source = spec.split(":")
    if kind not in ("tls-idle", "tcp-idle", "slow-head"):
        raise SystemExit(f"unknown kind {kind!r}")
    return Job(kind, int(port), int(count), source)


def main(argv: list[str]) -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    seconds, jobs = float(argv[0]), [parse(spec) for spec in argv[1:]]
    asyncio.run(_run(seconds, jobs))
    print(json.dumps([vars(job) for job in jobs]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
