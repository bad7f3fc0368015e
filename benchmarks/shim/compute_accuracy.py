"""Compute-cap accuracy of the shim on the simulated GPU: achieved GPU share for caps 10-90,
kernels of 20 us to 20 ms and 1 to 8 processes of one claim, plus two claims capped at 30 and
60 side by side. Writes benchmarks/shim/results/compute_accuracy.{md,json}.

    .venv/bin/python benchmarks/shim/compute_accuracy.py [--quick] [--processes 1,4]

Each point runs the claim's processes for SECONDS[kernel] (2 s for 20 and 200 us kernels, 3 s for
2 ms, 6 s for 20 ms), each keeping 4 kernels in flight (shim_probe duty); a process's share is its
kernels' GPU time over its wall time (start-up and the final drain included); the claim's share
is its processes' GPU time over the claim's wall time, from the first process's start to the
last one's end (CLOCK_MONOTONIC). Not the sum of per-process shares: a process's last launch can
wait for budget past its end time, so per-process windows differ and their shares do not add up
to the claim's. The number of kernels the claim ran is recorded per point. "no shim" is
what the same workload reaches with no shim at all on this machine, run before and after each
row (the simulator and the CPUs limit short kernels), so a cap above it cannot be shown. `cpu
wait` is, per point, the largest share of a process's wall time it spent runnable but waiting
for a CPU (its run delay): the most a busy machine can have taken from the achieved share.

The whole table (1, 2, 4 and 8 processes) takes about 10 minutes of wall time; --processes
runs a subset of the process counts, and the results say which.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.*

from benchmarks.run_info import RunInfo
from testbed.shim_harness import (
    PROGRAM_BUILD,
    SIMGPU_BUILD,
    Claim,
    build_programs,
    build_shim,
    build_simgpu,
    claim_on,
    simulated_node,
    values,
)

RESULTS = Path(__file__).resolve().parent / "results"
KERNELS = [20_000, 200_000, 2_000_000, 20_000_000]
CAPS = [10, 20, 30, 40, 50, 60, 70, 80, 90]
PROCS = [1, 2, 4, 8]
# The code whose accuracy is measured: the shim, the simulated driver it runs on, the probe.
MEASURED = ["tessera/shim", "simgpu/src", "include/cuda-abi", "tests/shim/programs"]


def run(
    claims: list[Claim], kernel_ns: int, seconds: float, plain: dict[str, str] | None = None
) -> list[tuple[int, int, int, int]]:
    """One duty process per entry, all at once: (kernels launched, start_ns, end_ns, run delay
    in ns) of each."""
    procs = []
    for c in claims:
        args = [str(c.programs / "shim_probe"), "duty", str(kernel_ns), str(seconds), "4"]
        env = plain if plain is not None else c.env()
        procs.append(
            subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    found = []
    for p in procs:
        out, err = p.communicate(timeout=seconds + 120)
        if p.returncode != 0:
            raise RuntimeError(err)
        v = values(out)
        found.append((int(v["launched"]), int(v["start_ns"]), int(v["end_ns"]), int(v["run_delay_ns"])))
    return found


def share(procs: list[tuple[int, int, int, int]], kernel_ns: int) -> float:
    """A claim's share: its processes' GPU time over the claim's wall time."""
    kernels = sum(k for k, _, _, _ in procs)
    span = max(e for _, _, e, _ in procs) - min(s for _, s, _, _ in procs)
    return 100.0 * kernels * kernel_ns / span


def cpu_wait(procs: list[tuple[int, int, int, int]]) -> float:
    """The largest share (percent) of a process's wall time spent waiting for a CPU."""
    return max(100.0 * d / (e - s) for _, s, e, d in procs)


SECONDS = {20_000: 2.0, 200_000: 2.0, 2_000_000: 3.0, 20_000_000: 6.0}


def seconds_for(kernel_ns: int, quick: bool) -> float:
    return SECONDS[kernel_ns] / 2 if quick else SECONDS[kernel_ns]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="caps 10/50/90 only, shorter runs")
    parser.add_argument(
        "--processes",
        default=",".join(map(str, PROCS)),
        help="comma-separated process counts to run (default: all of " + ",".join(map(str, PROCS)) + ")",
    )
    args = parser.parse_args()
    caps = [10, 50, 90] if args.quick else CAPS
    procs_run = [int(n) for n in args.processes.split(",")]
    info = RunInfo.start(MEASURED)
    build_shim()
    build_simgpu()
    build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        root = Path(tmp)
        for kernel in KERNELS:
            for nprocs in procs_run:
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
                before = share(run([nolimit] * nprocs, kernel, secs, plain=dict(env)), kernel)
                row_rows = []
                for cap in caps:
                    claim = claim_on(
                        node / f"cap{cap}",
                        env,
                        [(uuids[0], None, cap)],
                        SIMGPU_BUILD / "libcuda.so.1",
                        SIMGPU_BUILD / "libnvidia-ml.so.1",
                        PROGRAM_BUILD,
                    )
                    procs = run([claim] * nprocs, kernel, secs)
                    achieved = share(procs, kernel)
                    kernels = sum(k for k, _, _, _ in procs)
                    row_rows.append(
                        {
                            "kernel_us": kernel // 1000,
                            "processes": nprocs,
                            "cap": cap,
                            "achieved": round(achieved, 2),
                            "error": round(achieved - cap, 2),
                            "kernels": kernels,
                            "seconds": secs,
                            "cpu_wait": round(cpu_wait(procs), 2),
                        }
                    )
                    print(json.dumps(row_rows[-1]), flush=True)
                after = share(run([nolimit] * nprocs, kernel, secs, plain=dict(env)), kernel)
                for row in row_rows:
                    row["ceiling"] = round(min(before, after), 1)
                    row["no_shim_before"] = round(before, 1)
                    row["no_shim_after"] = round(after, 1)
                rows.extend(row_rows)
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
        pair = [share([p], 2_000_000) for p in run([a, b], 2_000_000, 4.0)]
        print("pair", pair, flush=True)
    write(rows, pair, args.quick, procs_run, info.finish())


def write(
    rows: list[dict[str, float]], pair: list[float], quick: bool, procs_run: list[int], info: RunInfo
) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"quick": quick, "processes": procs_run, "driver": "simgpu"}
    (RESULTS / "compute_accuracy.json").write_text(
        json.dumps({"run": info.as_json(), "meta": meta, "rows": rows, "pair_30_60": pair}, indent=1) + "\n"
    )
    within = [r for r in rows if r["cap"] <= r["ceiling"] - 3]
    worst = max((abs(r["error"]) for r in within), default=0.0)
    caps = sorted({int(r["cap"]) for r in rows})
    subset = [n for n in PROCS if n not in procs_run]
    lines = [
        "# Compute-cap accuracy (simulated GPU)",
        "",
        *info.markdown(),
        "- Driver: simulated (build/simgpu).",
        *(
            [f"- A subset: {', '.join(map(str, procs_run))} processes per claim; not run: {subset}."]
            if subset
            else []
        ),
        *(["- Quick: caps 10, 50 and 90 only, each point half as long."] if quick else []),
        "",
        "Achieved share of GPU time (percent) by cap; each cell is achieved (error). Each point runs",
        "for " + ", ".join(f"{_label(k)}: {seconds_for(k, quick):g} s" for k in KERNELS) + " of wall",
        "time, start-up and drain included; `kernels` is the range of kernels the claim ran per point.",
        "`no shim`: the share the same workload reaches with no shim on this machine, run before and",
        "after the row; a cap at or above it cannot be shown (the machine, not the shim, is the limit).",
        "",
        f"Two claims capped at 30 and 60 on one GPU (2 ms kernels): **{pair[0]:.1f}** and **{pair[1]:.1f}**.",
        f"Worst |error| over points whose cap is at most the no-shim share minus 3: **{worst:.2f}** points "
        f"({len(within)} of {len(rows)} points).",
        "",
        "Worst |error| per kernel length and process count (same rule):",
        "",
        "| kernel | " + " | ".join(f"{n} procs" for n in procs_run) + " |",
        "|---|" + "---|" * len(procs_run),
    ]
    for kernel in KERNELS:
        cells = []
        for nprocs in procs_run:
            shown = [r for r in within if r["kernel_us"] == kernel // 1000 and r["processes"] == nprocs]
            cells.append(f"{max(abs(r['error']) for r in shown):.1f}" if shown else "-")
        lines.append(f"| {_label(kernel)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| kernel | procs | no shim | kernels | cpu wait | " + " | ".join(f"cap {c}" for c in caps) + " |",
        "|---|---|---|---|---|" + "---|" * len(caps),
    ]
    for kernel in KERNELS:
        for nprocs in procs_run:
            by_cap = {
                int(r["cap"]): r
                for r in rows
                if r["kernel_us"] == kernel // 1000 and r["processes"] == nprocs
            }
            if not by_cap:
                continue
            first = next(iter(by_cap.values()))
            base = f"{first['no_shim_before']:.0f}/{first['no_shim_after']:.0f}"
            counts = [int(r["kernels"]) for r in by_cap.values()]
            waits = [float(r["cpu_wait"]) for r in by_cap.values()]
            cells = [f"{by_cap[c]['achieved']:.1f} ({by_cap[c]['error']:+.1f})" for c in caps]
            lines.append(
                f"| {_label(kernel)} | {nprocs} | {base} | {min(counts)}-{max(counts)} | "
                f"{min(waits):.1f}-{max(waits):.1f} % | " + " | ".join(cells) + " |"
            )
    (RESULTS / "compute_accuracy.md").write_text("\n".join(lines) + "\n")


def _label(kernel: int) -> str:
    return f"{kernel // 1_000_000} ms" if kernel >= 1_000_000 else f"{kernel // 1000} us"


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"done in {time.monotonic() - started:.0f}s")
