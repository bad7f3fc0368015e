"""Where `make test`'s time goes: the JUnit XML that `make test` writes, summed per test module.

pytest's ``--durations`` names the slowest tests; the wall time of a module also holds its
fixtures' setup and teardown (control planes, real nodes), which is where most of the suite's time
is. JUnit records both inside each test case's ``time``, so summing a module's cases gives what
the module costs.

    .venv/bin/python -m tools.test_durations            # every report in build/test-results/
    .venv/bin/python -m tools.test_durations --top 20 other.xml

It prints a Markdown table (module, tests, minutes, share of the suite) for docs/testbed.md, and
each report's wall time: `make test` runs its phases (parallel, then alone) as one report each,
and with several workers the modules' minutes add up to more than the wall time.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPORT_FOLDER = Path("build/test-results")


@dataclass(frozen=True)
class ModuleTime:
    """What one test module cost: its cases and the seconds they took, setup and teardown included."""

    module: str
    tests: int
    seconds: float


def module_times(*reports: Path) -> list[ModuleTime]:
    """Every module of ``reports``, slowest first. A case's ``classname`` is its dotted module path,
    followed by its class for tests written in classes; the module is the part that names a file
    (``test_*``)."""
    totals: dict[str, tuple[int, float]] = {}
    for report in reports:
        for case in ElementTree.parse(report).iter("testcase"):
            module = _module_of(case.get("classname", ""))
            count, seconds = totals.get(module, (0, 0.0))
            totals[module] = (count + 1, seconds + float(case.get("time", "0") or 0))
    times = [ModuleTime(module, count, seconds) for module, (count, seconds) in totals.items()]
    return sorted(times, key=lambda t: t.seconds, reverse=True)


def _module_of(classname: str) -> str:
    parts = classname.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].startswith("test_"):
            return "/".join(parts[: i + 1]) + ".py"
    return classname or "(unknown)"


def markdown(times: Sequence[ModuleTime], top: int) -> str:
    """The ``top`` slowest modules as a Markdown table, with the suite's sum on the last line."""
    total = sum(t.seconds for t in times) or 1.0
    lines = ["| module | tests | minutes | share |", "|---|---:|---:|---:|"]
    lines += [_row(t.module, t.tests, t.seconds, total) for t in times[:top]]
    lines.append(_row("all modules", sum(t.tests for t in times), total, total))
    return "\n".join(lines)


def _row(module: str, tests: int, seconds: float, total: float) -> str:
    return f"| `{module}` | {tests} | {seconds / 60:.1f} | {100 * seconds / total:.0f} % |"


def wall_seconds(report: Path) -> float:
    """How long the pytest run that wrote ``report`` took, start to end (its test suite's ``time``)."""
    return sum(float(suite.get("time", "0") or 0) for suite in ElementTree.parse(report).iter("testsuite"))


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Sum JUnit reports' test time per module.")
    parser.add_argument(
        "reports", nargs="*", type=Path, help=f"JUnit XML files (default: every *.xml in {REPORT_FOLDER}/)"
    )
    parser.add_argument("--top", type=int, default=15, help="how many modules to list (default 15)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    reports: list[Path] = args.reports or sorted(REPORT_FOLDER.glob("*.xml"))
    missing = [str(report) for report in reports if not report.is_file()]
    if missing or not reports:
        where = ", ".join(missing) or f"{REPORT_FOLDER}/*.xml"
        print(f"no JUnit report at {where}: run `make test` first", file=sys.stderr)
        return 1
    print(markdown(module_times(*reports), args.top))
    print()
    for report in reports:
        print(f"{report}: wall time {wall_seconds(report) / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
