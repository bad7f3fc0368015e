"""What every recorded benchmark result says about the run that produced it, read from the run
itself rather than written by hand: when it ran, on what machine (CPU model, cores, load average
at the start and at the end), the exact command, and which commit it measured - HEAD when the run
started, the last commit that changed the measured code, and any uncommitted change to that code
(a result measured on a dirty tree says so).

Benchmark scripts are run as files (``.venv/bin/python benchmarks/shim/overhead.py``); they put
the repository root on ``sys.path`` to import this module as ``benchmarks.run_info``.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``model name`` in /proc/cpuinfo)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class RunInfo:
    """Start one with :meth:`start` before measuring and call :meth:`finish` after."""

    measured_paths: list[str]
    """The repository paths whose code the benchmark measures (their commit and changes count)."""
    started: str = ""
    finished: str = ""
    command: str = ""
    cwd: str = ""
    host: str = ""
    cpu_model: str = ""
    cores: int = 0
    """CPUs this process may run on (its affinity), which is what the benchmark can use."""
    cores_online: int = 0
    load_average_start: list[float] = field(default_factory=list)
    load_average_end: list[float] = field(default_factory=list)
    head: str = ""
    """``git rev-parse HEAD`` when the run started."""
    measured_commit: str = ""
    """The last commit that changed any of ``measured_paths`` (at or before ``head``)."""
    uncommitted: list[str] = field(default_factory=list)
    """``git status --porcelain`` lines for ``measured_paths`` when the run started: empty means
    the code measured is exactly ``measured_commit``'s."""
    tree_dirty_elsewhere: bool = False
    """Whether files outside ``measured_paths`` differed from ``head`` (other work in progress)."""

    @classmethod
    def start(cls, measured_paths: list[str]) -> RunInfo:
        info = cls(measured_paths=measured_paths)
        info.started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        info.command = shlex.join(sys.orig_argv)
        info.cwd = os.getcwd()
        info.host = f"{platform.node()} {platform.machine()}, Linux {platform.release()}"
        info.cpu_model = cpu_model()
        info.cores = len(os.sched_getaffinity(0))
        info.cores_online = os.cpu_count() or 0
        info.load_average_start = _load()
        info.head = _git("rev-parse", "HEAD")
        info.measured_commit = _git("log", "-1", "--format=%H", "HEAD", "--", *measured_paths)
        info.uncommitted = _git("status", "--porcelain", "--", *measured_paths).splitlines()
        everything = _git("status", "--porcelain").splitlines()
        info.tree_dirty_elsewhere = len(everything) > len(info.uncommitted)
        return info

    def finish(self) -> RunInfo:
        self.finished = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        self.load_average_end = _load()
        return self

    def as_json(self) -> dict[str, object]:
        return asdict(self)

    def markdown(self) -> list[str]:
        """The lines a results page opens with."""
        if self.uncommitted:
            state = "with uncommitted changes to the measured code: " + "; ".join(
                f"`{line}`" for line in self.uncommitted
            )
        else:
            state = "measured code unchanged from that commit"
        elsewhere = " (other files of the tree had uncommitted changes)" if self.tree_dirty_elsewhere else ""
        return [
            f"- Run: {self.started} to {self.finished}.",
            f"- Command (in `{self.cwd}`): `{self.command}`",
            f"- Machine: {self.cpu_model}, {self.cores} cores usable ({self.cores_online} online), "
            f"{self.host}. Load average (1, 5, 15 min) at the start "
            f"{' '.join(map(str, self.load_average_start))}, at the end "
            f"{' '.join(map(str, self.load_average_end))}.",
            f"- Code: HEAD {self.head}; last commit changing {', '.join(self.measured_paths)}: "
            f"{self.measured_commit}; {state}{elsewhere}.",
        ]
