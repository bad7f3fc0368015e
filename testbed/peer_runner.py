"""Run unittest test modules and record each test's outcome, one JSON line per event, as it happens.

Executed as a script by a *client* interpreter (a virtual environment with numba-cuda, say), not
imported by the test bed: so it uses the standard library alone. ``python peer_runner.py OUT
MODULE...`` appends to OUT a ``started`` line before each test and an outcome line after it, flushed
at once, so that when the process dies in a test (a crash, a hang killed by the caller) the caller
still knows which test it died in, and a ``module`` line before each module's tests, so that it knows
where to start again.
"""

from __future__ import annotations

import json
import sys
import traceback
import unittest
from types import TracebackType
from typing import IO, TypeAlias

DETAIL_CHARS = 2000
"""What is kept of a failure's traceback: its end, where the error is."""

ExcInfo: TypeAlias = tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None]


class Recorder(unittest.TestResult):
    """A test result that writes every start and outcome to ``out`` as it happens."""

    def __init__(self, out: IO[str]) -> None:
        super().__init__()
        self.out = out

    def record(self, test_id: str, outcome: str, detail: str = "") -> None:
        self.out.write(json.dumps({"id": test_id, "outcome": outcome, "detail": detail[-DETAIL_CHARS:]}))
        self.out.write("\n")
        self.out.flush()

    # unittest.TestResult's method names.
    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self.record(test.id(), "started")

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.record(test.id(), "passed")

    def addFailure(self, test: unittest.TestCase, err: ExcInfo) -> None:
        super().addFailure(test, err)
        self.record(test.id(), "failed", _text(err))

    def addError(self, test: unittest.TestCase, err: ExcInfo) -> None:
        # Also what a failing setUpClass or setUpModule reports, under an id such as
        # "setUpClass (module.Class)": the class's tests then never start.
        super().addError(test, err)
        self.record(test.id(), "error", _text(err))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self.record(test.id(), "skipped", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: ExcInfo) -> None:
        super().addExpectedFailure(test, err)
        self.record(test.id(), "xfailed", _text(err))

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self.record(test.id(), "xpassed")

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: ExcInfo | None) -> None:
        # A failed subtest fails its test, which then reports no success of its own.
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = isinstance(err[1], test.failureException)
            self.record(test.id(), "failed" if failed else "error", f"{subtest.id()}\n{_text(err)}")


def _text(err: ExcInfo) -> str:
    return "".join(traceback.format_exception(err[1]))


def run(out: IO[str], modules: list[str]) -> None:
    """Run each module's tests in turn, recording into ``out``."""
    loader = unittest.TestLoader()
    result = Recorder(out)
    for module in modules:
        result.record(module, "module")
        # A module that does not import becomes a test that reports the ImportError.
        loader.loadTestsFromName(module).run(result)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: peer_runner.py OUT MODULE...", file=sys.stderr)
        return 2
    with open(argv[0], "a", encoding="utf-8") as out:
        run(out, argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
