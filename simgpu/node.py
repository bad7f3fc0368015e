"""A simulated node as tests and tools drive it: its configuration, and processes started on it.

Processes started here run the test programs built into build/simgpu/tests (or any command) with
the node's environment, so they load the simulated driver exactly as they would NVIDIA's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from simgpu.config import NodeSpec, library_dir, process_env, write_config


def program_dir() -> Path:
    """Where ``make -C simgpu`` puts the C test programs."""
    return library_dir() / "tests"


@dataclass
class Node:
    """A simulated node: its spec and the configuration file written from it."""

    spec: NodeSpec
    config: Path

    @property
    def env(self) -> dict[str, str]:
        return process_env(self.config)

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        return {**self.env, **(extra or {})}

    def update(self, spec: NodeSpec) -> None:
        """Rewrite the configuration (running processes pick up fault changes)."""
        self.spec = spec
        write_config(spec, self.config)

    def program(
        self, *args: str, timeout: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a test program from build/simgpu/tests to completion on this node (``env`` adds
        variables to the node's environment)."""
        return subprocess.run(
            [str(program_dir() / args[0]), *args[1:]],
            env=self._env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a test program on this node, with pipes for stdin and stdout."""
        return subprocess.Popen(
            [str(program_dir() / args[0]), *args[1:]],
            env=self._env(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def python(
        self, code: str, timeout: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run Python code in a fresh interpreter on this node (pynvml and ctypes load the
        simulated libraries by soname there, as they would NVIDIA's)."""
        return subprocess.run(
            [sys.executable, "-c", code],
            env=self._env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python_json(self, code: str, timeout: float = 60, env: Mapping[str, str] | None = None) -> object:
        """Run Python code that prints one JSON document; return it."""
        done = self.python(code, timeout, env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


NodeFactory = Callable[..., Node]


def read_line(proc: subprocess.Popen[str], prefix: str) -> str:
    """The next stdout line of ``proc`` starting with ``prefix`` (fails if it exits first)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line.strip()
    stderr = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"process ended without printing {prefix!r}: {stderr}")


def release(proc: subprocess.Popen[str]) -> None:
    """Let a holding probe finish (close its stdin) and reap it."""
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)
