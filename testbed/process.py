"""Child processes of the test bed: started with their output in a log file, stopped for sure.

Every daemon the test bed starts (etcd, the control plane, later kubelets and containerd) goes
through here, so they all share one policy: output goes to <log dir>/<name>.log, the child is killed
if the test process dies (PR_SET_PDEATHSIG), and stop() escalates from SIGTERM to SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from testbed.polling import Fatal, poll_until

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: take SIGKILL when the parent dies, so nothing is orphaned."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_LISTEN_PORTS = range(10000, 30000)
"""Where free_port looks first: above the ports well-known services listen on, below Kubernetes'
NodePort range (30000-32767), where the chart's exporter listens on each node (31995)."""


def _ephemeral_low() -> int:
    """The lowest of the ports the kernel gives outgoing connections (and bind to port 0)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def connection_from(source: str, port: int) -> socket.socket:
    """A TCP connection to 127.0.0.1:``port`` made from the loopback address ``source``: another
    address stands for another pod, for servers that share their connections out by address."""
    connection = socket.socket()
    connection.settimeout(30)
    connection.bind((source, 0))
    connection.connect(("127.0.0.1", port))
    return connection


def free_port() -> int:
    """A TCP port that was free on every address a moment ago, for a server to listen on.

    Taken from _LISTEN_PORTS, below the kernel's ephemeral range, when there is room: a port the
    kernel picked for ``bind(port 0)`` is one it may give the next outgoing connection - the test bed makes
    thousands - and a server started on it minutes later then fails with "address already in use"
    (kube-apiserver did, once in a CI run). The probe binds every address without SO_REUSEADDR, so
    a port any socket holds, even in TIME_WAIT, is refused.
    """
    below = range(_LISTEN_PORTS.start, min(_LISTEN_PORTS.stop, _ephemeral_low()))
    for _ in range(100 if len(below) >= 1000 else 0):
        port = random.choice(below)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # no room below: the kernel's pick
        probe.bind(("0.0.0.0", 0))
        picked: int = probe.getsockname()[1]
        return picked


class ManagedProcess:
    """One long-running child process and its log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str | os.PathLike[str]],
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [os.fspath(a) for a in argv]
        self.log_path = log_dir / f"{name}.log"
        self._log_file = self.log_path.open("ab")
        log.info("starting %s: %s", name, " ".join(self.argv))
        try:
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                preexec_fn=_die_with_parent,
                start_new_session=True,
            )
        except BaseException:
            self._log_file.close()
            raise

    @property
    def pid(self) -> int:
        return self._popen.pid

    def running(self) -> bool:
        return self._popen.poll() is None

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ready() until it is true; fail early, with the log tail, if the process exits."""

        def check() -> bool:
            if not self.running():
                raise Fatal(
                    f"{self.name} exited with status {self._popen.returncode} before {what}:\n"
                    + self.log_tail()
                )
            return ready()

        try:
            poll_until(check, timeout, f"{self.name}: {what}")
        except TimeoutError as error:
            raise TimeoutError(f"{error}\n{self.log_tail()}") from error.__cause__

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the whole process group at once and reap it (a crash, as tests need one)."""
        if self.running():
            log.info("killing %s (pid %d)", self.name, self.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._popen.pid, signal.SIGKILL)
            self._popen.wait()
        self._log_file.close()

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the whole process group, then SIGKILL whatever is left after `grace` seconds."""
        if self.running():
            log.info("stopping %s (pid %d)", self.name, self.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._popen.pid, signal.SIGTERM)
            try:
                self._popen.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0fs; killing it", self.name, grace)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._popen.pid, signal.SIGKILL)
                self._popen.wait()
        self._log_file.close()
