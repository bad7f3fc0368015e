"""Added cost per call of the shim: kernel launch, allocation and free with 10 000 allocations
live, cuMemGetInfo_v2, and the launch of a one-node CUDA graph, against the same program with no
shim; the capped configuration gives the cost of launches and graph launches under a compute
cap. Alloc+free is also measured inside one process against the driver's own functions
(alloc_free.c), which is what the target is set on, and so is a floor under it (floor_shim.c:
the least any per-allocation memory limit does) in the same runs. Writes overhead.{md,json} into
benchmarks/shim/results/ (or --out DIR).

    .venv/bin/python benchmarks/shim/overhead.py [--driver-dir DIR | --stub] [--out DIR] [--runs N]

By default it runs on the simulated driver; --driver-dir names a directory holding NVIDIA's
libcuda.so.1 and libnvidia-ml.so.1 to measure against a real GPU; --stub runs on a driver that
does nothing (stub_driver.c: every call returns at once), where what a hook costs is nearly all
that is measured, and writes overhead_stub.{md,json}. Each configuration runs
--runs times (the configurations interleaved, so load that comes and goes falls on all of them),
each run keeping the best of 5 rounds per call; the table gives the best run (least disturbed)
and the JSON also the median. The results name the machine, the command and the commit
measured, as the run found them (benchmarks/run_info.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.*

from benchmarks.run_info import RunInfo
from testbed.shim_harness import (
    PROGRAM_BUILD,
    REPO,
    SIMGPU_BUILD,
    SIMGPU_TEST_HEADERS,
    build_programs,
    build_shim,
    build_simgpu,
    claim_on,
    simulated_node,
    values,
)

RESULTS = Path(__file__).resolve().parent / "results"
STUB_SOURCE = Path(__file__).resolve().parent / "stub_driver.c"
FLOOR_SOURCE = Path(__file__).resolve().parent / "floor_shim.c"
ALLOC_FREE_SOURCE = Path(__file__).resolve().parent / "alloc_free.c"
BENCH_BUILD = REPO / "build" / "shim" / "bench"
STUB_BUILD = BENCH_BUILD / "stub"
FLOOR_BUILD = BENCH_BUILD / "floor"
FLOOR = "floor: a counter and a pointer table, nothing else (floor_shim.c)"
STUB_UUID = "GPU-5a5a5a5a-0000-0000-0000-000000000001"  # stub_driver.c's uuid_bytes
RUNS = 5
KEYS = ("launch_ns", "alloc_ns", "free_ns", "info_ns", "graph_ns")
MEASURES = (*KEYS, "info_direct_ns", "pair_added_ns", "cold_lines_ns")
COLD_LINES = 12  # alloc_free.c's calibration: lines read per pair, 2 * (1 + CHASE_LINES)
ROUNDS = {"simulated": 200, "stub": 3000, "real": 1000}  # alloc_free rounds per run


def added(r: dict[str, int], base: dict[str, int], key: str) -> int:
    """What the shim adds to `key`: against the run without the shim, except cuMemGetInfo_v2,
    whose simulated call (microseconds, varying with the load) drowns the shim's part across
    processes; it is compared within each run with the driver's own function called directly,
    in alternating rounds (on the row without the shim, that is the method's noise)."""
    if key == "info_ns":
        return r["info_ns"] - r["info_direct_ns"]
    return r[key] - base[key]


# The code whose cost is measured: the shim, the drivers it runs on, the probes.
MEASURED = [
    "tessera/shim",
    "simgpu/src",
    "include/cuda-abi",
    "tests/shim/programs",
    "benchmarks/shim/alloc_free.c",
    "benchmarks/shim/stub_driver.c",
    "benchmarks/shim/floor_shim.c",
]


def _compile(source: Path, target: Path, *extra: str) -> None:
    """Compile a benchmark program or the stub with the flags the test programs get."""
    target.parent.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{REPO / 'include' / 'cuda-abi'}", f"-I{SIMGPU_TEST_HEADERS}"]
    flags = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", *includes]
    cc = shlex.split(os.environ.get("CC", "cc"))
    subprocess.run([*cc, *flags, *extra, "-o", str(target), str(source)], check=True)


def build_stub() -> Path:
    """Compile stub_driver.c into a libcuda.so.1 of its own directory (built like the
    simulator's libraries); returns the directory."""
    soname = ["-Wl,-soname,libcuda.so.1", "-Wl,--no-undefined"]
    _compile(STUB_SOURCE, STUB_BUILD / "libcuda.so.1", "-fPIC", "-shared", "-fvisibility=hidden", *soname)
    return STUB_BUILD


def floor_env(directory: Path, base: dict[str, str], real_cuda: Path) -> dict[str, str]:
    """``base`` with floor_shim.c preloaded in ``directory``, its libcuda-real.so.1 alias
    pointing at ``real_cuda`` (laid out as the shim's installation is)."""
    alias_stub = FLOOR_BUILD / "libcuda-real.so.1"
    alias_stub.parent.mkdir(parents=True, exist_ok=True)
    stub_source = FLOOR_BUILD / "alias.c"
    stub_source.write_text("/* the DT_NEEDED name of the driver: see floor_shim.c */\n")
    _compile(stub_source, alias_stub, "-fPIC", "-shared", "-Wl,-soname,libcuda-real.so.1")
    library = FLOOR_BUILD / "libtessera-floor.so"
    _compile(
        FLOOR_SOURCE,
        library,
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-Wl,-soname,libcuda.so.1",
        "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
        "-Wl,--no-as-needed",
        str(alias_stub),
        "-ldl",
    )
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(library, directory / library.name)
    (directory / "libcuda-real.so.1").symlink_to(real_cuda)
    return {**base, "LD_PRELOAD": str(directory / library.name)}


def bench_once(env: dict[str, str], n: int, rounds: int) -> dict[str, int]:
    """One run of ``shim_probe bench`` and one of alloc_free (its added_ns as pair_added_ns)."""
    found: dict[str, int] = {}
    for command in (
        [str(PROGRAM_BUILD / "shim_probe"), "bench", str(n)],
        [str(BENCH_BUILD / "alloc_free"), str(rounds)],
    ):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        found.update({key: int(value) for key, value in values(done.stdout).items()})
    if found["cold_lines"] != COLD_LINES:
        raise RuntimeError(f"alloc_free.c reads {found['cold_lines']} calibration lines, not {COLD_LINES}")
    return {key: found["added_ns" if key == "pair_added_ns" else key] for key in MEASURES}


def bench(
    envs: dict[str, dict[str, str]], n: int, runs: int, rounds: int
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """Best and median per configuration over ``runs`` interleaved runs."""
    seen: dict[str, dict[str, list[int]]] = {name: {k: [] for k in MEASURES} for name in envs}
    for _ in range(runs):
        for name, env in envs.items():
            for key, value in bench_once(env, n, rounds).items():
                seen[name][key].append(value)
    best = {name: {k: min(v) for k, v in r.items()} for name, r in seen.items()}
    median = {name: {k: int(statistics.median(v)) for k, v in r.items()} for name, r in seen.items()}
    return best, median


HOOKED = {  # the hook's source file and name, as callgrind names them
    "launch": ("cuda_launch_hooks.c", "cuLaunchKernel"),
    "alloc": ("cuda_memory_hooks.c", "cuMemAlloc_v2"),
    "free": ("cuda_memory_hooks.c", "cuMemFree_v2"),
    "info": ("cuda_memory_hooks.c", "cuMemGetInfo_v2"),
    "graph": ("cuda_launch_hooks.c", "cuGraphLaunch"),
}


def added_instructions(env: dict[str, str]) -> dict[str, float]:
    """Instructions the shim adds per call (each hook's inclusive count less the driver's own
    function inside it, per call), counted by valgrind's callgrind over ``shim_probe bench``:
    exact and independent of the machine's load, which wall-clock figures of calls this short on
    a busy 2-core machine are not. Empty without valgrind."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="tessera-callgrind-") as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                str(PROGRAM_BUILD / "shim_probe"),
                "bench",
                "2000",
            ],
            env=env,
            capture_output=True,
            check=True,
            timeout=600,
        )
        tree = subprocess.run(
            ["callgrind_annotate", "--threshold=100", "--inclusive=yes", "--tree=calling", str(out)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()

    def count(text: str) -> int:
        return int(text.split()[0].replace(",", ""))

    def is_star(line: str) -> bool:  # a function's own line in the tree
        return re.search(r"%\)\s+\*\s", line) is not None

    def is_callee(line: str) -> bool:  # a line under it naming one function it calls
        return re.search(r"%\)\s+>\s", line) is not None

    def calls_of(line: str, name: str) -> int:
        return int(line.split(f":{name} (")[1].split("x)")[0].replace(",", ""))

    found: dict[str, float] = {}
    for what, (source, name) in HOOKED.items():
        hook = next(
            (i for i, line in enumerate(tree) if is_star(line) and f"{source}:{name} [" in line), None
        )
        if hook is None:
            continue
        # The driver's function called by the hook itself: the rest is the shim's.
        for line in tree[hook + 1 :]:
            if not is_callee(line):
                break
            if f":{name} (" in line and source not in line:
                found[what] = (count(tree[hook]) - count(line)) / calls_of(line, name)
        if what in found:
            continue
        # Called through a helper: every call of the driver's function in the benchmark is the
        # hook's, so the hook's inclusive count less the function's whole count is the shim's.
        real = next(
            (
                line
                for line in tree
                if is_star(line) and f":{name} [" in line and source not in line and "shim_probe" not in line
            ),
            None,
        )
        calls = max(
            (calls_of(line, name) for line in tree if is_callee(line) and f"{source}:{name} (" in line),
            default=0,
        )
        if real is not None and calls > 0:
            found[what] = (count(tree[hook]) - count(real)) / calls
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    driver_choice = parser.add_mutually_exclusive_group()
    driver_choice.add_argument("--driver-dir", type=Path, default=None)
    driver_choice.add_argument("--stub", action="store_true")
    parser.add_argument("--launches", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    info = RunInfo.start(MEASURED)
    build_shim()
    if args.driver_dir is None:
        build_simgpu()
    driver = args.driver_dir or SIMGPU_BUILD
    build_programs(PROGRAM_BUILD, driver)
    _compile(ALLOC_FREE_SOURCE, BENCH_BUILD / "alloc_free", "-ldl")
    simulated = args.driver_dir is None
    kind = "stub" if args.stub else "simulated" if simulated else "real"
    with tempfile.TemporaryDirectory(prefix="tessera-overhead-") as tmp:
        root = Path(tmp)
        if simulated:
            uuids, env = simulated_node(root / "node", memory_bytes=16 << 30)
        else:
            env = dict(os.environ)
            uuids = [_first_uuid(env)]
        cuda, nvml = driver / "libcuda.so.1", driver / "libnvidia-ml.so.1"
        if args.stub:  # the stub's libcuda.so.1 found first; the simulator's NVML (unused)
            stub = build_stub()
            env["LD_LIBRARY_PATH"] = f"{stub}:{env['LD_LIBRARY_PATH']}"
            uuids, cuda = [STUB_UUID], stub / "libcuda.so.1"
        unlimited = claim_on(root / "none", env, [], cuda, nvml, PROGRAM_BUILD)
        limited = claim_on(root / "mem", env, [(uuids[0], 8 << 30, 0)], cuda, nvml, PROGRAM_BUILD)
        capped = claim_on(root / "cap", env, [(uuids[0], 8 << 30, 50)], cuda, nvml, PROGRAM_BUILD)
        results, medians = bench(
            {
                "no shim": dict(env),
                "shim, no limits": unlimited.env(),
                "shim, memory limit, uncapped": limited.env(),
                "shim, memory limit, capped at 50 %": capped.env(),
                FLOOR: floor_env(root / "floor", env, cuda),
            },
            args.launches,
            args.runs,
            ROUNDS[kind],
        )
        # On the simulated driver (and the stub) only: a real driver's calls are short enough to
        # time, and valgrind over NVIDIA's library would take the GPU check's time.
        instructions = (
            {
                "shim, memory limit, uncapped": added_instructions(limited.env()),
                "shim, memory limit, capped at 50 %": added_instructions(capped.env()),
            }
            if simulated
            else {}
        )
    if args.stub:
        driver, name = "stub (benchmarks/shim/stub_driver.c: every call returns at once)", "overhead_stub"
    elif simulated:
        driver, name = "simulated (build/simgpu)", "overhead"
    else:
        driver, name = str(args.driver_dir), "overhead"
    write(results, medians, instructions, driver, args.runs, args.out / name, info.finish())


def _first_uuid(env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(PROGRAM_BUILD / "shim_probe"), "devices"], env=env, capture_output=True, text=True
    )
    return next(line.split("uuid=")[1].split()[0] for line in done.stdout.splitlines() if "uuid=" in line)


def write(
    results: dict[str, dict[str, int]],
    medians: dict[str, dict[str, int]],
    instructions: dict[str, dict[str, float]],
    driver: str,
    runs: int,
    out: Path,
    info: RunInfo,
) -> None:
    """``out``.json and ``out``.md."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "run": info.as_json(),
                "driver": driver,
                "runs": runs,
                "results": results,
                "medians": medians,
                "added_instructions": instructions,
            },
            indent=1,
        )
        + "\n"
    )
    lines = [
        "# Shim overhead per call",
        "",
        *info.markdown(),
        f"- Driver: {driver}.",
        "",
        f"Best of {runs} runs (configurations interleaved), each the best of 5 rounds; ns per call.",
        "Launch: an empty kernel. Alloc/free: 4 KiB, with 10 000 other allocations live. Info:",
        "cuMemGetInfo_v2 (memory limit in force: the claim's figures). Graph: cuGraphLaunch of a",
        "one-node graph. Added = with shim minus without; for info, the call through the shim",
        "minus the driver's own function called directly in the same run (alternating rounds).",
        "Targets: launch <= 30 ns (uncapped), alloc+free <= 150 ns (the pair, in one process:",
        "medians below), info <= 100 ns. The capped row is the controller's own cost per launch",
        "and graph launch: its empty kernels are measured at 0 ns, so the budget never runs out",
        "and no launch waits. The medians (overhead.json) show what the machine's load added.",
        "",
        "| configuration | launch | alloc | free | info | graph | added launch | added alloc "
        "| added free | added info | added graph |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += _rows(results)
    lines += [
        "",
        "Medians of the same runs:",
        "",
        "| configuration | added launch | added alloc | added free | added info | added graph "
        "| added alloc+free, one process |",
        "|---|---|---|---|---|---|---|",
    ]
    base = medians["no shim"]
    for name, r in medians.items():
        cells = [f"{added(r, base, k):+d}" for k in KEYS] + [f"{r['pair_added_ns']:+d}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Added alloc+free, one process (alloc_free.c): rounds of 200 cuMemAlloc_v2 (4 KiB) and",
        "their cuMemFree_v2 through the shim alternate with the same through the driver's own",
        "functions in one process, 10 000 allocations live through the shim; per run the median",
        "over the rounds of the pair through the shim less the pair direct, then the median over",
        "the runs. Without the shim both rounds call the driver: that row is the method's noise.",
        "The floor row preloads floor_shim.c instead of the shim: one counter against a limit and",
        "a pointer table under one lock, the least any per-allocation limit does. The shim's",
        "figure less the floor's is what the shim adds above that, at that time on this machine.",
        "",
        *_calibration(medians),
    ]
    if not instructions:
        lines += ["", "Instructions added per call: not counted (a real driver, or no valgrind)."]
    else:
        lines += [
            "",
            "Instructions the shim adds per call (callgrind: exact, whatever the load):",
            "",
            "| configuration | " + " | ".join(HOOKED) + " |",
            "|---|" + "---|" * len(HOOKED),
        ]
    for name, counts in instructions.items():
        cells = [f"{counts[k]:.0f}" if k in counts else "-" for k in HOOKED]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def _calibration(medians: dict[str, dict[str, int]]) -> list[str]:
    """What a cold line cost while the pair was measured (alloc_free.c's third kind of round):
    the shim's figure is only comparable across runs against it."""
    cost = statistics.median(r["cold_lines_ns"] for r in medians.values())
    return [
        "Calibration, in the same processes: the driver's own pair, each call then reading",
        f"{COLD_LINES // 2} lines of the benchmark's own one after another, added {cost:+.0f} ns per pair",
        f"({COLD_LINES} lines, {cost / COLD_LINES:.0f} ns a line; median over the configurations): what",
        "about as many cold lines as the shim touches per pair (cache_lines.md) cost after the",
        "driver's work, on this machine at that time.",
    ]


def _rows(results: dict[str, dict[str, int]]) -> list[str]:
    base = results["no shim"]
    rows = []
    for name, r in results.items():
        rows.append(
            f"| {name} | "
            + " | ".join(str(r[k]) for k in KEYS)
            + " | "
            + " | ".join(f"{added(r, base, k):+d}" for k in KEYS)
            + " |"
        )
    return rows


if __name__ == "__main__":
    main()
