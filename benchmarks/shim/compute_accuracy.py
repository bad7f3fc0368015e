"""Compute-cap accuracy of the shim on the simulated GPU: achieved GPU share for caps 10-90,
kernels of 20 us to 20 ms and 1 to 8 processes of one claim, plus two claims capped at 30 and
60 side by side. Writes benchmarks/shim/results/compute_accuracy.{md,json}.

    .venv/bin/python benchmarks/shim/compute_accuracy.py [--quick]

Each point runs the claim's processes for a few seconds, each keeping 4 kernels in flight
(shim_probe duty); a process's share is its kernels' GPU time over its wall time, the claim's
the sum over its processes. "ceiling" is what the same workload reaches with no shim at all on
this machine (the simulator and CPUs limit short kernels), so a cap above it cannot be shown.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from tessera.shim.testing import (
    PROGRAM_BUILD,
    REPO,
    SIMGPU_BUILD,
    Claim,
    build_programs,
    build_shim,
    claim_on,
    simulated_node,
    values,
)

RESULTS = Path(__file__).resolve().parent / "results"
KERNELS = [20_000, 200_000, 2_000_000, 20_000_000]
CAPS = [10, 20, 30, 40, 50, 60, 70, 80, 90]
PROCS = [1, 2, 4, 8]


def run(
    claims: list[Claim], kernel_ns: int, seconds: float, plain: dict[str, str] | None = None
) -> list[float]:
    procs = []
    for c in claims:
        args = [str(c.programs / "shim_probe"), "duty", str(kernel_ns), str(seconds), "4"]
        env = plain if plain is not None else c.env()
        procs.append(
            subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    shares = []
    for p in procs:
        out, err = p.communicate(timeout=seconds + 120)
        if p.returncode != 0:
            raise RuntimeError(err)
        shares.append(float(values(out)["share"]))
    return shares


def seconds_for(kernel_ns: int, quick: bool) -> float:
    base = 1.0 if quick else 2.0
    return base * 2 if kernel_ns >= 20_000_000 else base


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="caps 10/50/90 only, shorter runs")
    args = parser.parse_args()
    caps = [10, 50, 90] if args.quick else CAPS
    build_shim()
    subprocess.run(["make", "-C", str(REPO / "simgpu"), "-j2"], check=True, capture_output=True)
    build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        root = Path(tmp)
        for kernel in KERNELS:
            for nprocs in PROCS:
                node = root / f"k{kernel}p{nprocs}"
                uuids, env = simulated_node(node)
                secs = seconds_for(kernel, args.quick)
                nolimit = claim_on(
                    node / "free",
                    env,
                    [],
                    SIMGPU_BUILD / "libcuda.so.1",
                    SIMGPU_BUILD / "libnvidia-ml.so.1",
                    PROGRAM_BUILD,
                )
                ceiling = sum(run([nolimit] * nprocs, kernel, secs, plain=dict(env)))
                for cap in caps:
                    claim = claim_on(
                        node / f"cap{cap}",
                        env,
                        [(uuids[0], None, cap)],
                        SIMGPU_BUILD / "libcuda.so.1",
                        SIMGPU_BUILD / "libnvidia-ml.so.1",
                        PROGRAM_BUILD,
                    )
                    achieved = sum(run([claim] * nprocs, kernel, secs))
                    row = {
                        "kernel_us": kernel // 1000,
                        "processes": nprocs,
                        "cap": cap,
                        "achieved": round(achieved, 2),
                        "error": round(achieved - cap, 2),
                        "ceiling": round(ceiling, 1),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        uuids, env = simulated_node(root / "pair")
        a = claim_on(
            root / "pair" / "a",
            env,
            [(uuids[0], None, 30)],
            SIMGPU_BUILD / "libcuda.so.1",
            SIMGPU_BUILD / "libnvidia-ml.so.1",
            PROGRAM_BUILD,
        )
        b = claim_on(
            root / "pair" / "b",
            env,
            [(uuids[0], None, 60)],
            SIMGPU_BUILD / "libcuda.so.1",
            SIMGPU_BUILD / "libnvidia-ml.so.1",
            PROGRAM_BUILD,
        )
        pair = run([a, b], 2_000_000, 4.0)
        print("pair", pair, flush=True)
    write(rows, pair, args.quick)


def write(rows: list[dict[str, float]], pair: list[float], quick: bool) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.node()} {platform.machine()} {platform.processor() or ''} ({_cpus()} CPUs)".strip()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    meta = {"date": stamp, "machine": machine, "quick": quick, "driver": "simgpu (build/simgpu)"}
    (RESULTS / "compute_accuracy.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "pair_30_60": pair}, indent=1)
    )
    within = [r for r in rows if r["cap"] <= r["ceiling"] - 3]
    worst = max((abs(r["error"]) for r in within), default=0.0)
    lines = [
        "# Compute-cap accuracy (simulated GPU)",
        "",
        f"Date: {stamp}. Machine: {machine}. Driver: simulated (build/simgpu). "
        f"Command: `.venv/bin/python benchmarks/shim/compute_accuracy.py{' --quick' if quick else ''}`.",
        "",
        "Achieved share of GPU time (percent) by cap; each cell is achieved (error). `ceiling`: the share",
        "the same workload reaches with no shim on this machine - a cap at or above it cannot be shown here.",
        "",
        f"Two claims capped at 30 and 60 on one GPU (2 ms kernels): **{pair[0]:.1f}** and **{pair[1]:.1f}**.",
        f"Worst |error| over points whose cap is below the ceiling minus 3: **{worst:.2f}** points "
        f"({len(within)} of {len(rows)} points).",
        "",
    ]
    caps = sorted({int(r["cap"]) for r in rows})
    lines.append("| kernel | procs | ceiling | " + " | ".join(f"cap {c}" for c in caps) + " |")
    lines.append("|---|---|---|" + "---|" * len(caps))
    for kernel in KERNELS:
        for nprocs in PROCS:
            sel = {
                int(r["cap"]): r
                for r in rows
                if r["kernel_us"] == kernel // 1000 and r["processes"] == nprocs
            }
            if not sel:
                continue
            ceiling = next(iter(sel.values()))["ceiling"]
            label = f"{kernel // 1_000_000} ms" if kernel >= 1_000_000 else f"{kernel // 1000} us"
            cells = [f"{sel[c]['achieved']:.1f} ({sel[c]['error']:+.1f})" for c in caps]
            lines.append(f"| {label} | {nprocs} | {ceiling:.0f} | " + " | ".join(cells) + " |")
    (RESULTS / "compute_accuracy.md").write_text("\n".join(lines) + "\n")


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"done in {time.monotonic() - started:.0f}s")
