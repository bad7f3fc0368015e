"""Where `make test`'s time goes: the JUnit XML that `make test` writes, summed per test module.

pytest's ``--durations`` names the slowest tests; the wall time of a module also holds its
fixtures' setup and teardown (control planes, real nodes), which is where most of the suite's time
is. JUnit records both inside each test case's ``time``, so summing a module's cases gives what
the module costs.

    .venv/bin/python -m tools.test_durations                    # build/test-results/junit.xml
    .venv/bin/python -m tools.test_durations --top 20 other.xml

It prints a Markdown table (module, tests, minutes, share of the suite) for docs/testbed.md.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_REPORT = Path("build/test-results/junit.xml")


@dataclass(frozen=True)
class ModuleTime:
    """What one test module cost: its cases and the seconds they took, setup and teardown included."""

    module: str
    tests: int
    seconds: float


def module_times(report: Path) -> list[ModuleTime]:
    """Every module of ``report``, slowest first. A case's ``classname`` is its dotted module path,
    followed by its class for tests written in classes; the module is the part that names a file
    (``test_*``)."""
    totals: dict[str, tuple[int, float]] = {}
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


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Sum a JUnit report's test time per module.")
    parser.add_argument("report", nargs="?", type=Path, default=DEFAULT_REPORT, help="JUnit XML file")
    parser.add_argument("--top", type=int, default=15, help="how many modules to list (default 15)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if not args.report.is_file():
        print(f"no JUnit report at {args.report}: run `make test` first", file=sys.stderr)
        return 1
    print(markdown(module_times(args.report), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
