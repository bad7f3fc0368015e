"""Cache lines the shim touches per cuMemAlloc_v2 + cuMemFree_v2 pair (10 000 allocations live),
and what they cost when every call finds them cold, as it does after a driver whose own work
evicts the caches (the simulator walks its list of allocations on every call). Why a separate
measure: on the simulated driver the shim's added time is nearly all cache misses, which
wall-clock figures on a busy 2-core machine show only through heavy noise; valgrind's
cachegrind counts them exactly.

    .venv/bin/python benchmarks/shim/cache_lines.py [--out DIR] [--runs N]

On the stub driver (stub_driver.c), alloc_free.c reads EVICT_KIB of other memory before every
call: under cachegrind (64 KiB, twice its simulated 32 KiB L1 data cache) each line the shim
touches per pair is then one miss (lines of the shim's sources, and of glibc's rwlock, which the
allocation gate used before 2026-12-02, reads and writes, stack included; the 30-round run less
the 10-round one, so setup cancels); timed (1 MiB, beyond this machine's L2), each cold line's
cost shows. Counts are averaged over the four placements of the stack against cache lines (a
padding variable in the environment moves it). On the simulated driver nothing is read between
calls: its own work (it walks its list of allocations) evicts the shim's lines, those touched
before its call and again after it, as it does when the target is timed there; the same
cachegrind count, without the timing noise.

Code lines too: the instruction cache is simulated at 1 KiB (16 lines), so that nearly every line
of the shim's code a call runs through is fetched anew, which counts about the lines its
instructions span per pair. A driver whose work evicts the shim's data can evict those lines as
well, and there are several times more of them; the timed run also reports alloc_free.c's
calibration (as many cold data lines of its own per pair), so that what the shim's data lines
can explain of its cost is read in the same run (docs/shim.md). Writes cache_lines.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.*

from benchmarks.run_info import RunInfo
from benchmarks.shim.overhead import (
    ALLOC_FREE_SOURCE,
    BENCH_BUILD,
    COLD_LINES,
    MEASURED,
    RESULTS,
    STUB_UUID,
    _compile,
    build_stub,
)
from testbed.shim_harness import (
    PROGRAM_BUILD,
    SIMGPU_BUILD,
    build_programs,
    build_shim,
    build_simgpu,
    claim_on,
    simulated_node,
    values,
)

PAIRS = (30 - 10) * 200  # alloc_free's BATCH pairs per round, 30 rounds less 10
COUNTED = ("D1mr", "D1mw")
CODE_LINES = "I1mr"  # with --I1 at 1 KiB: about the code lines each call runs through


def _events(path: Path) -> tuple[list[str], dict[tuple[str, str], list[int]]]:
    """Per (file, function) totals of a cachegrind output file."""
    names: list[str] = []
    where = ("", "")
    totals: dict[tuple[str, str], list[int]] = {}
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("fl="):
            where = (line[3:], where[1])
        elif line.startswith("fn="):
            where = (where[0], line[3:])
        elif line[:1].isdigit():
            row = totals.setdefault(where, [0] * len(names))
            for i, value in enumerate(line.split()[1:]):
                row[i] += int(value)
    return names, totals


def _shims(where: tuple[str, str]) -> bool:
    return "tessera/shim/src" in where[0] or "pthread_rwlock" in where[1]


# Where the process's stack starts, relative to a cache line, decides how many lines the shim's
# frames straddle (one more or one fewer per call): a padding variable of 0, 16, 32 and 48 bytes
# (the start is 16-byte aligned) gives each of the four placements, and the counts are averaged.
STACK_PHASES = (0, 16, 32, 48)


def lines_per_pair(env: dict[str, str], tmp: Path, evict_kib: int) -> dict[str, float]:
    """The shim's instructions and L1 data misses per pair, `evict_kib` KiB read before each
    call, averaged over the four placements of the stack against cache lines."""
    found = {name: 0.0 for name in ("Ir", *COUNTED, CODE_LINES)}
    for phase in STACK_PHASES:
        runs = {}
        for rounds in (10, 30):
            out = tmp / f"cg.{evict_kib}.{phase}.{rounds}"
            subprocess.run(
                [
                    "valgrind",
                    "--tool=cachegrind",
                    "--cache-sim=yes",
                    "--D1=32768,8,64",
                    "--I1=1024,2,64",
                    f"--cachegrind-out-file={out}",
                    str(BENCH_BUILD / "alloc_free"),
                    str(rounds),
                    str(evict_kib),
                ],
                env={**env, "TESSERA_BENCH_STACK_PHASE": "x" * phase},
                capture_output=True,
                check=True,
                timeout=600,
            )
            runs[rounds] = _events(out)
        names, many = runs[30]
        _, few = runs[10]
        for where, row in many.items():
            if _shims(where):
                base = few.get(where, [0] * len(names))
                for name in found:
                    found[name] += (
                        (row[names.index(name)] - base[names.index(name)]) / PAIRS / len(STACK_PHASES)
                    )
    found["lines"] = sum(found[name] for name in COUNTED)
    return found


def timed(env: dict[str, str], runs: int) -> dict[str, int]:
    """Median over runs of alloc_free's added ns per pair, without and with 1 MiB evicted, and of
    its calibration with 1 MiB evicted (COLD_LINES cold data lines of its own per pair)."""
    seen: dict[str, list[int]] = {"warm": [], "evicted": [], "evicted_calibration": []}
    for _ in range(runs):
        for name, args in (("warm", ["3000", "0"]), ("evicted", ["100", "1024"])):
            done = subprocess.run(
                [str(BENCH_BUILD / "alloc_free"), *args],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=300,
            )
            found = values(done.stdout)
            seen[name].append(int(found["added_ns"]))
            if name == "evicted":
                seen["evicted_calibration"].append(int(found["cold_lines_ns"]))
    return {name: int(statistics.median(v)) for name, v in seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    info = RunInfo.start(MEASURED)
    build_shim()
    build_simgpu()
    build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    _compile(ALLOC_FREE_SOURCE, BENCH_BUILD / "alloc_free", "-ldl")
    stub = build_stub()
    with tempfile.TemporaryDirectory(prefix="tessera-cache-lines-") as tmp:
        root = Path(tmp)
        uuids, simulated = simulated_node(root / "node", memory_bytes=16 << 30)
        env = dict(simulated)
        env["LD_LIBRARY_PATH"] = f"{stub}:{env['LD_LIBRARY_PATH']}"
        nvml = SIMGPU_BUILD / "libnvidia-ml.so.1"
        claim = claim_on(
            root / "mem", env, [(STUB_UUID, 8 << 30, 0)], stub / "libcuda.so.1", nvml, PROGRAM_BUILD
        )
        on_simulator = claim_on(
            root / "sim",
            simulated,
            [(uuids[0], 8 << 30, 0)],
            SIMGPU_BUILD / "libcuda.so.1",
            nvml,
            PROGRAM_BUILD,
        )
        lines = lines_per_pair(claim.env(), root, 64)
        lines_simulated = lines_per_pair(on_simulator.env(), root, 0)
        times = timed(claim.env(), args.runs)
    info = info.finish()
    sim = lines_simulated
    out = args.out / "cache_lines"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "run": info.as_json(),
                "runs": args.runs,
                "per_pair": lines,
                "per_pair_simulated": lines_simulated,
                "added_ns": times,
            },
            indent=1,
        )
        + "\n"
    )
    out.with_suffix(".md").write_text(
        "\n".join(
            [
                "# Cache lines the shim touches per alloc+free pair",
                "",
                *info.markdown(),
                "- Driver: stub (benchmarks/shim/stub_driver.c), and simulated (build/simgpu) on the"
                " second row; memory limit in force, 10 000 allocations live.",
                "",
                "| per pair | instructions | L1 data read misses | write misses | cold lines "
                "| code lines (1 KiB I1) |",
                "|---|---|---|---|---|---|",
                f"| shim (cachegrind, 64 KiB evicted before every call) | {lines['Ir']:.0f} "
                f"| {lines['D1mr']:.1f} | {lines['D1mw']:.1f} | {lines['lines']:.1f} "
                f"| {lines[CODE_LINES]:.1f} |",
                f"| shim on the simulated driver (cachegrind, nothing evicted: the driver's work does)"
                f" | {sim['Ir']:.0f} | {sim['D1mr']:.1f} | {sim['D1mw']:.1f} | {sim['lines']:.1f} "
                f"| {sim[CODE_LINES]:.1f} |",
                "",
                f"Added ns per pair (alloc_free.c, median of {args.runs} runs): "
                f"caches warm {times['warm']:+d}, 1 MiB evicted before every call {times['evicted']:+d};"
                f" alloc_free.c's calibration, {COLD_LINES} cold data lines of its own per pair after"
                f" the same eviction, {times['evicted_calibration']:+d}.",
                "",
            ]
        )
    )


if __name__ == "__main__":
    main()
