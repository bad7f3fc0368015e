"""How `make test` hands modules to its pytest-xdist workers (tests/conftest.py), shown by running
pytest-xdist itself, with the conftest as a plugin, on a tree of stand-in modules at the paths of
the real ones, whose tests write down which worker ran them: each module runs whole on one worker,
and the modules sharing the control plane with Kueue run one after another on one worker, in tier
order or shuffled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import KUEUE_MODULES

REPOSITORY = Path(__file__).resolve().parents[3]

RECORDING = """
import os
import pytest

from tests.conftest import KUEUE_MODULES

{fixture}

@pytest.mark.parametrize("n", range(3))
def test_runs(n: int, {argument}) -> None:
    with open(os.environ["RUN_RECORD"], "a") as record:
        record.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{__file__}}\\n")
"""

SHARED = '''@pytest.fixture(scope="module")
def kueue_cluster() -> str:
    """Stands in for the conftest's control plane: what groups a module is that it asks for one."""
    return "a cluster"'''

PLAIN_MODULES = (
    "tests/e2e/test_alpha.py",
    "tests/integration/test_bravo.py",
    "tests/integration/test_charlie.py",
    "tests/unit/test_delta.py",
)
SHARING_MODULES = tuple(sorted(KUEUE_MODULES))


def run_tree(tmp_path: Path, *options: str) -> list[tuple[str, str]]:
    """(worker, module) of every test, in the order they ran, from a three-worker run."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for module in PLAIN_MODULES + SHARING_MODULES:
        shares = module in SHARING_MODULES
        path = tree / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            RECORDING.format(
                fixture=SHARED if shares else "", argument="kueue_cluster: str" if shares else ""
            )
        )
    record = tmp_path / "record"
    env = {**os.environ, "RUN_RECORD": str(record), "PYTHONPATH": str(REPOSITORY)}
    command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q"]
    command += ["-n", "3", "--dist", "loadfile", "--no-loadscope-reorder", *options]
    finished = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    runs = [
        (worker, str(Path(path).relative_to(tree)))
        for worker, path in map(str.split, record.read_text().splitlines())
    ]
    assert len(runs) == 3 * (len(PLAIN_MODULES) + len(SHARING_MODULES))
    return runs


def assert_units_kept_whole(runs: list[tuple[str, str]]) -> None:
    workers_of: dict[str, set[str]] = {}
    for worker, module in runs:
        workers_of.setdefault(module, set()).add(worker)
    assert all(len(workers) == 1 for workers in workers_of.values()), workers_of
    [sharing_worker] = {workers_of[module].pop() for module in SHARING_MODULES}
    on_that_worker = [module for worker, module in runs if worker == sharing_worker]
    sharing = [i for i, module in enumerate(on_that_worker) if module in SHARING_MODULES]
    assert sharing == list(range(sharing[0], sharing[0] + len(sharing))), (
        f"the modules sharing the Kueue control plane must run one after another: {on_that_worker}"
    )


def test_each_module_runs_whole_on_one_worker_and_the_sharing_modules_one_after_another(
    tmp_path: Path,
) -> None:
    assert_units_kept_whole(run_tree(tmp_path))


def test_shuffled_modules_are_kept_whole_too(tmp_path: Path) -> None:
    assert_units_kept_whole(run_tree(tmp_path, "--shuffle-modules=4242"))
