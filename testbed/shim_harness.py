"""Test support for the shim: build it and its test programs, and run processes as one claim.

Used by tests/shim, benchmarks/shim and tests/gpu. A :class:`Claim` is what the driver sets up
for one ResourceClaim - a limits file, a usage region, a shim installation beside the driver
libraries - plus the environment that puts a process under it. Against the simulated driver the
driver libraries are build/simgpu's; on a machine with a GPU, NVIDIA's.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.machinery
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "tessera" / "shim"
SIMGPU_BUILD = REPO / "build" / "simgpu"
PROGRAM_BUILD = REPO / "build" / "shim" / "tests"
PROGRAM_SOURCES = REPO / "tests" / "shim" / "programs"
SIMGPU_TEST_HEADERS = REPO / "tests" / "simgpu" / "programs"


BUILD_LOCK = REPO / "build" / ".build.lock"


@contextlib.contextmanager
def exclusive_build() -> Iterator[None]:
    """Hold this checkout's build lock: the pytest-xdist workers of `make test` start at once and
    each builds what its tests need, into the same folders; one at a time, the first builds and the
    others find it done (a program compiled while another worker runs it fails with "text file
    busy", and two compilers writing one file can leave a broken binary)."""
    BUILD_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with BUILD_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_simgpu() -> None:
    """The simulated driver's libraries and programs, by the project's own build (`make simgpu`),
    as CI builds them."""
    with exclusive_build():
        subprocess.run(["make", "-C", str(REPO / "simgpu"), "-j2"], check=True, capture_output=True)


def build_shim() -> None:
    """Build the preload libraries and the cffi binding in place, as the package build does."""
    with exclusive_build():
        _build_shim()


def _build_shim() -> None:
    spec = importlib.util.spec_from_file_location("tessera_shim_build", SHIM / "build.py")
    assert spec is not None and spec.loader is not None
    shim_build: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim_build)
    shim_build.build_preload()
    binding = _binding_python_imports()
    if binding is None or _stale(binding, SHIM / "src", SHIM / "include"):
        shim_build.build_format_inplace()


def _binding_python_imports() -> Path | None:
    """The compiled _format module this interpreter would import: the first that exists in the
    order of EXTENSION_SUFFIXES (a version-specific build shadows an abi3 one)."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = SHIM / f"_format{suffix}"
        if candidate.exists():
            return candidate
    return None


def _stale(product: Path, *inputs: Path) -> bool:
    newest = max(p.stat().st_mtime for d in inputs for p in ([d] if d.is_file() else d.rglob("*")))
    return product.stat().st_mtime < newest


def _cc(*args: str) -> None:
    cmd = [*shlex.split(os.environ.get("CC", "cc")), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{done.stderr}")


def build_programs(out: Path, cuda_link_dir: Path) -> Path:
    """Compile the C test programs into ``out``; ``shim_linked`` links ``-lcuda`` from
    ``cuda_link_dir`` (build/simgpu, or the directory of NVIDIA's libcuda.so)."""
    with exclusive_build():
        return _build_programs(out, cuda_link_dir)


def _build_programs(out: Path, cuda_link_dir: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{REPO / 'include' / 'cuda-abi'}", f"-I{SIMGPU_TEST_HEADERS}", f"-I{SHIM / 'include'}"]
    flags = ["-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", *includes]
    headers = [REPO / "include" / "cuda-abi", SIMGPU_TEST_HEADERS / "simgpu_test.h", SHIM / "include"]
    jobs = {
        "shim_probe": (["-ldl", "-lpthread"], []),
        "shim_stress": (["-ldl", "-lpthread"], []),
        "shim_share": (["-ldl"], []),
        "shim_slots": (["-ldl"], []),
        "tenant_attack": (["-ldl"], []),
        "shim_linked": ([f"-L{cuda_link_dir}", "-lcuda", "-ldl"], []),
        "libfakecu.so": ([], ["-shared", "-fPIC"]),
    }
    sources = {
        "shim_probe": "shim_probe.c",
        "shim_stress": "shim_stress.c",
        "shim_share": "shim_share.c",
        "shim_slots": "shim_slots.c",
        "tenant_attack": "tenant_attack.c",
        "shim_linked": "shim_linked.c",
        "libfakecu.so": "fake_cu.c",
    }
    for name, (libs, pre) in jobs.items():
        src = PROGRAM_SOURCES / sources[name]
        target = out / name
        if target.exists() and not _stale(target, src, *headers):
            continue
        _cc(*flags, *pre, str(src), "-o", str(target), *libs)
    return out


@dataclass
class Claim:
    """Processes started here run as processes of one claim: preloaded shim, its limits file,
    its usage region, on the node that ``base_env`` describes."""

    install_dir: Path
    limits: Path | None
    region: Path | None
    base_env: Mapping[str, str]
    programs: Path
    log_level: str = "warn"
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        from tessera.shim.install import Installation

        env = Installation(self.install_dir).env(self.limits, self.region, self.base_env, self.log_level)
        env.update(self.extra_env)
        env.update(extra)
        return env

    def run(
        self, *args: str, timeout: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a test program (from :func:`build_programs`) to completion."""
        return subprocess.run(
            [str(self.programs / args[0]), *args[1:]],
            env=self.env(**(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a test program with pipes for stdin, stdout and stderr."""
        return self.popen([str(self.programs / args[0]), *args[1:]], env)

    def popen(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start any command as a process of the claim, with pipes for stdin, stdout and stderr."""
        return subprocess.Popen(
            list(argv),
            env=self.env(**(env or {})),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run_prepared(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        tenant: str = "",
        mount_claim: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run a test program as a prepared container runs it: in a mount namespace of its own
        where the claim's folder (the installation's parent: shim, limits file, usage region) is
        mounted read-only at /run/tessera and its usage region read-write over its own file there,
        as prepare's CDI spec mounts them, the shim preloaded from there. ``tenant``: shell lines
        run inside first, as the container's root would (their failures do not stop the run).
        ``mount_claim=False`` leaves /run/tessera an ordinary folder of the container. The
        environment is ``env`` over the node's alone: neither variable naming the claim's files is
        set unless ``env`` sets it. Needs root (mount namespaces); callers skip without it."""
        from tessera.driver.claim_files import CONTAINER_DIR, CONTAINER_REGION, CONTAINER_SHIM_DIR
        from tessera.shim.format import LOG_ENV
        from tessera.shim.install import CUDA_LIBRARY, NVML_LIBRARY

        assert self.region is not None
        folder = shlex.quote(str(self.install_dir.parent))
        mounts = [f"mount -t tmpfs tmpfs {CONTAINER_DIR.parent}", f"mkdir -p {CONTAINER_DIR}"]
        if mount_claim:
            mounts += [
                f"mount --bind -o ro {folder} {CONTAINER_DIR}",
                f"mount --bind {shlex.quote(str(self.region))} {CONTAINER_REGION}",
            ]
        preload = ":".join(str(CONTAINER_SHIM_DIR / name) for name in (CUDA_LIBRARY, NVML_LIBRARY))
        script = "\n".join(
            ["set -e", *mounts, "set +e", tenant, f'LD_PRELOAD="${{LD_PRELOAD:-{preload}}}" exec "$@"']
        )
        process_env = {**self.base_env, LOG_ENV: self.log_level, **(env or {})}
        return subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
                str(self.programs / args[0]),
                *args[1:],
            ],
            env=process_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python(self, code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run Python code in a fresh interpreter under the shim."""
        return subprocess.run(
            [sys.executable, "-c", code], env=self.env(), capture_output=True, text=True, timeout=timeout
        )


ClaimFactory = Callable[..., Claim]
"""The tests' ``make_claim`` fixture."""


class ClaimProcess:
    """A running ``shim_slots`` under a claim (tests/shim/programs/shim_slots.c), or ``argv`` that
    speaks its protocol (tests/clients/programs/client.py): a process of the claim that makes the
    calls it is told to, one command at a time, and lives until killed."""

    def __init__(
        self, claim: Claim, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        from simgpu.node import read_line

        self.popen = claim.start("shim_slots", env=env) if argv is None else claim.popen(argv, env)
        self.pid = int(values(read_line(self.popen, "ready"))["pid"])

    def ask(self, command: str) -> dict[str, str]:
        """Send ``command``; its answer's ``key=value`` pairs."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(command + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            stderr = self.popen.stderr.read() if self.popen.stderr else ""
            raise AssertionError(f"{command!r}: the process ended: {stderr}")
        return values(line)

    def nvml_used(self, command: str) -> list[int]:
        """Every reading of NVML's used memory (v1, then v2) that ``command`` (an ``nvml``
        command, maybe a ``child`` one) took."""
        answer = self.ask(command)
        return [int(v) for key in ("used", "used_v2") for v in answer[key].split(",")]

    def holding(self, nbytes: int) -> ClaimProcess:
        """Start CUDA and allocate ``nbytes``, asserting both succeed."""
        assert self.ask("cuda")["rc"] == "0"
        assert self.ask(f"alloc {nbytes}")["rc"] == "0"
        return self

    def kill(self) -> None:
        self.popen.kill()
        self.popen.wait()


@dataclass(frozen=True)
class Share:
    """What one duty-cycle worker achieved (``shim_probe duty``, or a client program's duty loop
    that prints the same keys), in percent of its wall time.

    A share is GPU time over the workload's wall time, so a busy machine can lower it (a workload
    waiting for a CPU launches nothing) but never raise it: near a cap means at most ``tolerance``
    points above it and at most ``tolerance`` points below it plus the time it waited."""

    achieved: float
    """Its kernels' GPU time."""
    waited: float
    """Time it was runnable but waited for a CPU: at most what a busy machine can have cost it."""

    def near(self, target: float, tolerance: float) -> bool:
        return target - tolerance - self.waited <= self.achieved <= target + tolerance


def share_of(out: str) -> Share:
    """The :class:`Share` a duty-cycle worker's output reports."""
    v = values(out)
    return Share(float(v["share"]), 100.0 * int(v["run_delay_ns"]) / int(v["elapsed_ns"]))


def values(output: str) -> dict[str, str]:
    """The ``key=value`` pairs of a test program's output (later lines win)."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        for word in line.split():
            if "=" in word:
                key, _, value = word.partition("=")
                found[key] = value
    return found


def prefixed(output: str, prefix: str) -> dict[str, str]:
    """The ``key=value`` pairs of the output line that starts with ``prefix``."""
    for line in output.splitlines():
        if line.startswith(prefix):
            return values(line[len(prefix) :])
    raise AssertionError(f"no line starting with {prefix!r} in:\n{output}")


def dump(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)


def simulated_node(
    directory: Path, gpus: int = 1, memory_bytes: int = 1 << 30, **node_fields: Any
) -> tuple[list[str], dict[str, str]]:
    """A simulated node under ``directory``: its GPU UUIDs and the environment of a process on it.
    ``node_fields``: other :class:`simgpu.config.NodeSpec` fields (a client line's driver versions)."""
    from simgpu.config import NodeSpec, make_gpus, process_env, write_config

    spec = NodeSpec(
        state_file=directory / "state",
        gpus=make_gpus(gpus, directory.name, memory_bytes=memory_bytes),
        **node_fields,
    )
    config = write_config(spec, directory / "simgpu.conf")
    return [g.uuid for g in spec.gpus], process_env(config)


def claim_on(
    directory: Path,
    base_env: Mapping[str, str],
    limits: list[tuple[str, int | None, int]],
    real_cuda: Path,
    real_nvml: Path,
    programs: Path,
) -> Claim:
    """A claim under ``directory`` with ``limits`` as (uuid, memory_bytes | None, cores)."""
    from tessera.shim.format import GpuLimit, create_region, write_limits
    from tessera.shim.install import install

    installation = install(directory / "shim", real_cuda, real_nvml)
    limits_file = write_limits(directory / "limits", [GpuLimit(u, m, c) for u, m, c in limits])
    region = create_region(directory / "usage")
    return Claim(installation.directory, limits_file, region, base_env, programs)
