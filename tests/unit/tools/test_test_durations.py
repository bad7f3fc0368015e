"""The per-module summary of `make test`'s JUnit report: a module's time is the sum of its cases,
setup and teardown included, whatever class its tests sit in."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.test_durations import ModuleTime, main, markdown, module_times

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4" time="150.0">
<testcase classname="tests.e2e.test_demo" name="test_demo_runs" time="120.0"/>
<testcase classname="tests.unit.common.test_quantity" name="test_a" time="0.5"/>
<testcase classname="tests.unit.common.test_quantity.TestParsing" name="test_b" time="1.5"/>
<testcase classname="tests.e2e.test_demo" name="test_demo_again" time="60.0"/>
</testsuite></testsuites>
"""


def write(tmp_path: Path) -> Path:
    report = tmp_path / "junit.xml"
    report.write_text(REPORT)
    return report


def test_a_modules_cases_are_summed_slowest_module_first(tmp_path: Path) -> None:
    assert module_times(write(tmp_path)) == [
        ModuleTime("tests/e2e/test_demo.py", 2, 180.0),
        ModuleTime("tests/unit/common/test_quantity.py", 2, 2.0),
    ]


def test_the_table_lists_the_top_modules_and_the_whole_suite(tmp_path: Path) -> None:
    table = markdown(module_times(write(tmp_path)), top=1).splitlines()
    assert table[2] == "| `tests/e2e/test_demo.py` | 2 | 3.0 | 99 % |"
    assert table[-1] == "| `all modules` | 4 | 3.0 | 100 % |"
    assert len(table) == 4


def test_the_reports_of_both_phases_add_up_per_module_and_each_reports_its_wall_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = write(tmp_path)
    second = tmp_path / "alone.xml"
    second.write_text(REPORT.replace('time="150.0"', 'time="30.0"'))
    assert module_times(first, second)[0] == ModuleTime("tests/e2e/test_demo.py", 4, 360.0)
    assert main([str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert f"{first}: wall time 2.5 minutes" in out
    assert f"{second}: wall time 0.5 minutes" in out


def test_a_missing_report_is_an_error_that_says_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "absent.xml")]) == 1
    assert "run `make test` first" in capsys.readouterr().err
