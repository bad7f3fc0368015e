"""Added cost per call of the shim: kernel launch (uncapped), allocation and free with 10 000
allocations live, against the same program with no shim. Writes overhead.{md,json} into
benchmarks/shim/results/ (or --out DIR).

    .venv/bin/python benchmarks/shim/overhead.py [--driver-dir DIR] [--out DIR]

By default it runs on the simulated driver; --driver-dir names a directory holding NVIDIA's
libcuda.so.1 and libnvidia-ml.so.1 to measure against a real GPU. Each configuration runs
several times and keeps the best (least disturbed) figure per call. The results name the machine,
the command and the commit measured, as the run found them (benchmarks/run_info.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.*

from benchmarks.run_info import RunInfo
from tessera.shim.testing import (
    PROGRAM_BUILD,
    REPO,
    SIMGPU_BUILD,
    build_programs,
    build_shim,
    claim_on,
    simulated_node,
    values,
)

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = 5
# The code whose cost is measured: the shim, the simulated driver it runs on, the probe.
MEASURED = ["shim", "simgpu/src", "include/cuda-abi", "tests/shim/programs"]


def bench(env: dict[str, str], n: int) -> dict[str, int]:
    best: dict[str, int] = {}
    for _ in range(RUNS):
        done = subprocess.run(
            [str(PROGRAM_BUILD / "shim_probe"), "bench", str(n)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        for key, value in values(done.stdout).items():
            best[key] = min(best.get(key, 1 << 62), int(value))
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--driver-dir", type=Path, default=None)
    parser.add_argument("--launches", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    info = RunInfo.start(MEASURED)
    build_shim()
    if args.driver_dir is None:
        subprocess.run(["make", "-C", str(REPO / "simgpu"), "-j2"], check=True, capture_output=True)
    driver = args.driver_dir or SIMGPU_BUILD
    build_programs(PROGRAM_BUILD, driver)
    with tempfile.TemporaryDirectory(prefix="tessera-overhead-") as tmp:
        root = Path(tmp)
        if args.driver_dir is None:
            uuids, env = simulated_node(root / "node", memory_bytes=16 << 30)
        else:
            env = dict(os.environ)
            uuids = [_first_uuid(env)]
        cuda, nvml = driver / "libcuda.so.1", driver / "libnvidia-ml.so.1"
        unlimited = claim_on(root / "none", env, [], cuda, nvml, PROGRAM_BUILD)
        limited = claim_on(root / "mem", env, [(uuids[0], 8 << 30, 0)], cuda, nvml, PROGRAM_BUILD)
        capped = claim_on(root / "cap", env, [(uuids[0], 8 << 30, 50)], cuda, nvml, PROGRAM_BUILD)
        results = {
            "no shim": bench(dict(env), args.launches),
            "shim, no limits": bench(unlimited.env(), args.launches),
            "shim, memory limit, uncapped": bench(limited.env(), args.launches),
            "shim, memory limit, capped at 50 %": bench(capped.env(), args.launches),
        }
    driver = "simulated (build/simgpu)" if args.driver_dir is None else str(args.driver_dir)
    write(results, driver, args.out, info.finish())


def _first_uuid(env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(PROGRAM_BUILD / "shim_probe"), "devices"], env=env, capture_output=True, text=True
    )
    return next(line.split("uuid=")[1].split()[0] for line in done.stdout.splitlines() if "uuid=" in line)


def write(results: dict[str, dict[str, int]], driver: str, out: Path, info: RunInfo) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(
        json.dumps({"run": info.as_json(), "driver": driver, "runs": RUNS, "results": results}, indent=1)
        + "\n"
    )
    base = results["no shim"]
    lines = [
        "# Shim overhead per call",
        "",
        *info.markdown(),
        f"- Driver: {driver}.",
        "",
        f"Best of {RUNS} runs, ns per call. Launch: an empty kernel. Alloc/free: 4 KiB, with 10 000 other",
        "allocations live. Added = with shim minus without. Targets: launch <= 30 ns (uncapped),",
        "alloc/free <= 1000 ns. The capped row is the controller's own cost per launch: its empty",
        "kernels are measured at 0 ns, so the budget never runs out and no launch waits.",
        "",
        "| configuration | launch | alloc | free | added launch | added alloc | added free |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        added = [r[k] - base[k] for k in ("launch_ns", "alloc_ns", "free_ns")]
        lines.append(
            f"| {name} | {r['launch_ns']} | {r['alloc_ns']} | {r['free_ns']} | "
            + " | ".join(f"{a:+d}" for a in added)
            + " |"
        )
    (out / "overhead.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
