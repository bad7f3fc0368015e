"""The peer-suite runner records every test's outcome, survives a test that crashes or hangs its
process, and the comparison lists exactly the tests that passed in one run and not in the other.
Run here with this interpreter and small unittest modules written for the purpose."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from testbed.peer_suite import (
    CRASHED,
    Outcome,
    load_selection,
    regressions,
    run_modules,
    run_selection,
)

OUTCOMES = """
import unittest

class Cases(unittest.TestCase):
    def test_passes(self):
        pass

    def test_fails(self):
        self.assertEqual(1, 2)

    def test_errs(self):
        raise RuntimeError("boom")

    @unittest.skip("not here")
    def test_skipped(self):
        pass

    @unittest.expectedFailure
    def test_xfails(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_xpasses(self):
        pass

    def test_one_subtest_fails(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)
"""

CRASHING = """
import os, unittest

class Cases(unittest.TestCase):
    def test_a_before(self):
        pass

    def test_b_crashes(self):
        os.abort()

    def test_c_after(self):
        pass
"""

HANGING = """
import time, unittest

class Cases(unittest.TestCase):
    def test_hangs(self):
        time.sleep(600)
"""

AFTER = """
import unittest

class Cases(unittest.TestCase):
    def test_runs(self):
        pass
"""


@pytest.fixture
def modules(tmp_path: Path) -> dict[str, str]:
    """The modules above, importable by the child processes: the environment to run them in."""
    source = tmp_path / "src"
    source.mkdir()
    texts = {"outcomes": OUTCOMES, "crashing": CRASHING, "hanging": HANGING, "after": AFTER}
    for name, text in texts.items():
        (source / f"{name}.py").write_text(textwrap.dedent(text))
    return {**os.environ, "PYTHONPATH": str(source)}


def test_every_outcome_of_a_module_is_recorded_by_test_id(tmp_path: Path, modules: dict[str, str]) -> None:
    run = run_modules(Path(sys.executable), ["outcomes"], modules, 60, tmp_path)
    assert {test_id.removeprefix("outcomes.Cases."): o.outcome for test_id, o in run.items()} == {
        "test_passes": "passed",
        "test_fails": "failed",
        "test_errs": "error",
        "test_skipped": "skipped",
        "test_xfails": "xfailed",
        "test_xpasses": "xpassed",
        "test_one_subtest_fails": "failed",
    }
    assert "RuntimeError: boom" in run["outcomes.Cases.test_errs"].detail
    assert "(i=1)" in run["outcomes.Cases.test_one_subtest_fails"].detail
    assert run["outcomes.Cases.test_skipped"].detail == "not here"


def test_a_test_that_kills_its_process_crashed_and_the_next_module_still_runs(
    tmp_path: Path, modules: dict[str, str]
) -> None:
    run = run_modules(Path(sys.executable), ["crashing", "after"], modules, 60, tmp_path)
    assert run["crashing.Cases.test_a_before"].outcome == "passed"
    assert run["crashing.Cases.test_b_crashes"].outcome == CRASHED
    assert "exit status -6" in run["crashing.Cases.test_b_crashes"].detail  # SIGABRT
    assert "crashing.Cases.test_c_after" not in run
    assert run["after.Cases.test_runs"].outcome == "passed"


def test_a_test_that_outlives_the_timeout_crashed_and_the_next_module_still_runs(
    tmp_path: Path, modules: dict[str, str]
) -> None:
    run = run_modules(Path(sys.executable), ["hanging", "after"], modules, 3, tmp_path)
    assert run["hanging.Cases.test_hangs"] == Outcome(CRASHED, "killed after 3 s")
    assert run["after.Cases.test_runs"].outcome == "passed"


def test_a_module_that_does_not_import_is_an_error(tmp_path: Path, modules: dict[str, str]) -> None:
    run = run_modules(Path(sys.executable), ["no_such_module", "after"], modules, 60, tmp_path)
    (failed,) = (o for test_id, o in run.items() if "no_such_module" in test_id)
    assert failed.outcome == "error"
    assert "No module named 'no_such_module'" in failed.detail
    assert run["after.Cases.test_runs"].outcome == "passed"


def test_a_selection_runs_every_module_in_its_processes(tmp_path: Path, modules: dict[str, str]) -> None:
    run = run_selection(Path(sys.executable), ["outcomes", "crashing", "after"], modules, 2, 60, tmp_path)
    assert {test_id.split(".")[0] for test_id in run} == {"outcomes", "crashing", "after"}
    assert run["after.Cases.test_runs"].outcome == "passed"


def test_a_regression_is_a_test_that_passed_before_and_failed_or_did_not_run_after() -> None:
    passed, failed, skipped = Outcome("passed"), Outcome("failed", "why"), Outcome("skipped")
    before = {"a": passed, "b": passed, "c": failed, "d": skipped, "e": passed}
    after = {"a": passed, "b": failed, "c": passed, "d": failed}
    assert [(r.test_id, r.outcome.outcome) for r in regressions(before, after)] == [
        ("b", "failed"),
        ("e", "missing"),
    ]
    assert str(regressions(before, after)[0]) == "b: failed\nwhy"


def test_a_selection_lists_modules_and_a_reason_for_every_group_left_out(tmp_path: Path) -> None:
    path = tmp_path / "selection.toml"
    path.write_text('modules = ["a", "b"]\n[[excluded]]\ngroup = "c"\nreason = """\nslow\n"""\n')
    selection = load_selection(path)
    assert selection.modules == ("a", "b")
    assert [(e.group, e.reason) for e in selection.excluded] == [("c", "slow")]


@pytest.mark.parametrize(
    "text, complaint",
    [
        ('modules = ["a", "a"]\n', "listed twice: a"),
        ('modules = ["a"]\n[[excluded]]\ngroup = "c"\nreason = " "\n', "without a reason: c"),
    ],
)
def test_a_selection_with_a_module_twice_or_an_unexplained_exclusion_is_refused(
    tmp_path: Path, text: str, complaint: str
) -> None:
    path = tmp_path / "selection.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=complaint):
        load_selection(path)
