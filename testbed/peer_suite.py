"""A peer suite: another project's own tests, run by its own interpreter, test by test.

A *selection* file (TOML) names the test modules to run and, for every group left out, why. The
modules run in child processes of the client interpreter (``testbed/peer_runner.py``), a few at
once; a process that crashes or hangs costs the test it was in, and the next process goes on after
it. The
result of a run is each test id's outcome; :func:`regressions` compares two runs of the same
selection test by test, which is what lets a tier hold a rule such as "every test that passes
without the shim passes with it" while the simulated driver grows and the counts move.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

RUNNER = Path(__file__).resolve().with_name("peer_runner.py")

PASSED = "passed"
CRASHED = "crashed"
"""The outcome of a test its process died in (killed on the module's timeout, or a crash)."""


@dataclass(frozen=True)
class Exclusion:
    """A group of the peer's tests left out of the selection, and why."""

    group: str
    reason: str


@dataclass(frozen=True)
class Selection:
    """What a peer suite runs: test modules (dotted names), and what it leaves out."""

    modules: tuple[str, ...]
    excluded: tuple[Exclusion, ...]


def load_selection(path: Path) -> Selection:
    """Read a selection file: ``modules = [...]`` and ``[[excluded]]`` tables of ``group`` and
    ``reason``. A module listed twice, or an exclusion without a reason, is an error."""
    data = tomllib.loads(path.read_text())
    modules = tuple(data["modules"])
    twice = sorted({m for m in modules if modules.count(m) > 1})
    if twice:
        raise ValueError(f"{path}: modules listed twice: {', '.join(twice)}")
    excluded = tuple(Exclusion(e["group"], e["reason"].strip()) for e in data.get("excluded", []))
    unexplained = [e.group for e in excluded if not e.reason]
    if unexplained:
        raise ValueError(f"{path}: excluded without a reason: {', '.join(unexplained)}")
    return Selection(modules, excluded)


@dataclass(frozen=True)
class Outcome:
    """One test's outcome in a run, with the end of its traceback or its skip reason."""

    outcome: str
    detail: str = ""


Run = dict[str, Outcome]
"""Test id -> outcome."""


@dataclass
class Events:
    """What a runner's event lines say: each test's outcome, and the modules it began."""

    run: Run
    modules_begun: int


def read_events(lines: Iterable[str]) -> Events:
    """Read a runner's event lines. A test that started and never ended crashed; a test that
    reported more than once (subtests) keeps its first outcome that is not a pass."""
    events = Events({}, 0)
    for line in lines:
        event = json.loads(line)
        test_id, outcome = event["id"], event["outcome"]
        if outcome == "module":
            events.modules_begun += 1
        elif outcome == "started":
            events.run[test_id] = Outcome(CRASHED)
        elif events.run.get(test_id, Outcome(CRASHED)).outcome in (CRASHED, PASSED):
            events.run[test_id] = Outcome(outcome, event["detail"])
    return events


DETAIL_TAIL = 2000
"""How much of a dead process's stderr a crashed outcome keeps."""


def run_modules(
    python: Path, modules: Sequence[str], env: Mapping[str, str], timeout: float, cwd: Path
) -> Run:
    """Run ``modules`` in turn in one process of ``python`` (imports and start-up are paid once),
    and their tests' outcomes. When the process exits abnormally, or outlives ``timeout`` (for all
    of them) and is killed, the test it was running is ``crashed`` with the process's ending, and
    a fresh process goes on with the modules after that test's; a module whose process died before
    any of its tests started is itself recorded as crashed."""
    run: Run = {}
    remaining = list(modules)
    while remaining:
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl", dir=cwd) as log:
            try:
                done = subprocess.run(
                    [str(python), str(RUNNER), log.name, *remaining],
                    env=dict(env),
                    cwd=cwd,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
                ending = f"exit status {done.returncode}: {done.stderr[-DETAIL_TAIL:]}"
                finished = done.returncode == 0
            except subprocess.TimeoutExpired:
                ending, finished = f"killed after {timeout:.0f} s", False
            events = read_events(log)
        crashed = [test_id for test_id, o in events.run.items() if o.outcome == CRASHED]
        for test_id in crashed:
            events.run[test_id] = Outcome(CRASHED, ending)
        run.update(events.run)
        if finished:
            break
        dead_in = remaining[max(events.modules_begun, 1) - 1]
        if not crashed:
            run[dead_in] = Outcome(CRASHED, ending)
        remaining = remaining[max(events.modules_begun, 1) :]
    return run


def run_selection(
    python: Path, modules: Sequence[str], env: Mapping[str, str], jobs: int, timeout: float, cwd: Path
) -> Run:
    """Run every module, in ``jobs`` processes at once (each a share of the modules, dealt in
    turn); all their tests' outcomes."""
    shares = [modules[i::jobs] for i in range(jobs) if modules[i::jobs]]
    with ThreadPoolExecutor(max_workers=len(shares)) as pool:
        runs = pool.map(lambda share: run_modules(python, share, env, timeout, cwd), shares)
        return {test_id: outcome for run in runs for test_id, outcome in run.items()}


@dataclass(frozen=True)
class Regression:
    """A test that passed in the reference run and did not in the other (or did not run at all)."""

    test_id: str
    outcome: Outcome

    def __str__(self) -> str:
        return f"{self.test_id}: {self.outcome.outcome}\n{self.outcome.detail}".rstrip()


def regressions(reference: Run, other: Run) -> list[Regression]:
    """Each test that passed in ``reference`` and did not pass in ``other``, in id order."""
    missing = Outcome("missing", "the test did not run")
    return [
        Regression(test_id, other.get(test_id, missing))
        for test_id, outcome in sorted(reference.items())
        if outcome.outcome == PASSED and other.get(test_id, missing).outcome != PASSED
    ]


def counts(run: Run) -> dict[str, int]:
    """How many tests had each outcome."""
    found: dict[str, int] = {}
    for outcome in run.values():
        found[outcome.outcome] = found.get(outcome.outcome, 0) + 1
    return dict(sorted(found.items()))


def default_jobs() -> int:
    """One module process per CPU this process may run on."""
    return len(os.sched_getaffinity(0))
