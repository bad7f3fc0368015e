"""Fixtures shared by every test tier: the local control plane, API clients and namespaces.

The cluster is session-scoped (starting it costs seconds; sharing it costs nothing because every test
works in its own namespace and names its cluster-scoped objects uniquely). The control plane with
Kueue (``kueue_cluster``) is shared too, by the modules listed in ``KUEUE_MODULES``, one module
after another: they run next to each other (on one pytest-xdist worker under `make test`), each
finds it as the one before it did, and it stops after the last of them. When a test that used a
cluster fails, the tail of each component's log is attached to its report.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Generator, Iterator
from typing import Protocol, cast

import pytest
from kubernetes import client
from xdist.scheduler import LoadScopeScheduling

from tessera.kube import api_client
from testbed import queue_bed
from testbed.binaries import COMPONENTS
from testbed.cluster import LocalCluster
from testbed.fake_nodes import create_ready_node
from testbed.interrupts import interrupt_on_sigterm
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.shared_cluster import SharedCluster, Turn


def _fail_unless_built(*components: str) -> None:
    """Fail the test at once when a test-bed binary is missing: building takes minutes, longer than
    a test may take (a cluster would build it on start). `make test` builds first."""
    missing = [name for name in components if COMPONENTS[name].missing()]
    if missing:
        pytest.fail(f"test-bed binaries not built ({', '.join(missing)}): run `make binaries`")


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    _fail_unless_built("etcd", "kubernetes")
    with LocalCluster() as running:
        yield running


@pytest.fixture(scope="session")
def kube(cluster: LocalCluster) -> client.ApiClient:
    return api_client(cluster.admin_kubeconfig)


KUEUE_MODULES = frozenset(
    {
        "tests/e2e/test_queue_bar_real_node.py",
        "tests/integration/test_admission_check_failover.py",
        "tests/integration/test_admission_check_kueue.py",
        "tests/integration/test_chart_queue_install.py",
        "tests/integration/test_queue_bar.py",
    }
)
"""The modules that take turns on ``kueue_cluster``: one unit of work, run one after another (on one
worker under `make test`). Named by path because pytest-xdist's scheduler sees only node IDs: its
own group marks no longer reach it under pytest 9.2 (pytest-xdist#1386), so the list is the one
thing both the workers and the scheduler read. ``kueue_cluster`` refuses a module not listed."""

_NEXT_ITEM = pytest.StashKey["pytest.Item | None"]()


@pytest.fixture(scope="session")
def _kueue_control_plane() -> Iterator[SharedCluster]:
    shared = SharedCluster(queue_bed.kueue_cluster)
    yield shared
    shared.stop()


@pytest.fixture(scope="module")
def kueue_cluster(
    request: pytest.FixtureRequest, _kueue_control_plane: SharedCluster
) -> Iterator[LocalCluster]:
    """The local control plane with Kueue configured as docs/queue.md says (gpumem and gpucores
    charged as tessera.dev/gpu-memory and gpu-cores, times nvidia.com/gpu), this module's turn on it.
    When the module ends, what it started beside the control plane stops and what it made goes
    (testbed/shared_cluster.py), unless no module after it uses the cluster: then it stops."""
    module = request.node.nodeid
    if module not in KUEUE_MODULES:
        pytest.fail(
            f"{module} uses kueue_cluster but is not in KUEUE_MODULES (tests/conftest.py): the modules"
            " sharing it must run one after another"
        )
    _fail_unless_built("etcd", "kubernetes", "kueue")
    cluster = _kueue_control_plane.get()
    turn = Turn.begin(cluster)
    yield cluster
    following = request.session.stash.get(_NEXT_ITEM, None)
    if following is not None and _unit_of(following.nodeid) == KUEUE_UNIT:
        turn.end()
    else:
        _kueue_control_plane.stop()


KUEUE_UNIT = "kueue-control-plane"


def _unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or :data:`KUEUE_UNIT` for the modules of
    :data:`KUEUE_MODULES`."""
    module = nodeid.partition("::")[0]
    return KUEUE_UNIT if module in KUEUE_MODULES else module


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Tell module fixtures, which tear down inside the last test's teardown, what runs next."""
    item.session.stash[_NEXT_ITEM] = nextitem
    return (yield)


@contextlib.contextmanager
def made_namespace(kube: client.ApiClient) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default ServiceAccount exists), deleted afterwards;
    for fixtures of a wider scope than ``namespace``."""
    core = client.CoreV1Api(kube)
    name = unique_name("test")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        poll_until(
            lambda: core.read_namespaced_service_account("default", name), 30, "default ServiceAccount"
        )
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
def namespace(kube: client.ApiClient) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default ServiceAccount exists), deleted afterwards."""
    with made_namespace(kube) as name:
        yield name


@pytest.fixture
def fake_node(kube: client.ApiClient) -> Iterator[Callable[..., str]]:
    """Factory for Ready Node objects without a kubelet; every node made is deleted afterwards."""
    made: list[str] = []

    def make(labels: dict[str, str] | None = None) -> str:
        name = unique_name("node")
        create_ready_node(kube, name, labels)
        made.append(name)
        return name

    yield make
    core = client.CoreV1Api(kube)
    for name in made:
        core.delete_node(name)


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """Give the root logger its handlers and level back after each test. A test that runs a command's
    main() configures logging as the daemon would (tessera/logs.py): a handler on the sys.stderr of
    that moment, which is the test's capture, closed when the test ends; left behind, it made every
    later log line of the process fail with "I/O operation on closed file"."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def pytest_configure(config: pytest.Config) -> None:
    # A cancelled CI job sends SIGTERM: unwind like Ctrl-C so fixtures stop every daemon they started.
    interrupt_on_sigterm()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle-modules",
        metavar="SEED",
        type=int,
        default=None,
        help="run the test modules in an order shuffled with SEED (each module's tests keep their own"
        " order): shows that no module needs another to have run before it",
    )


TIER_ORDER = ("e2e", "integration", "dockerfile", "clients")
"""Tiers whose modules start first, slowest tier first. Under pytest-xdist (`make test`) a worker
takes the next unit of modules when it is almost done with its last, in collection order: modules
that wait minutes go first, and the tail of the run is made of the short ones."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order units of work (each module, or the :data:`KUEUE_MODULES` together) by tier
    (:data:`TIER_ORDER`, then the rest as collected), or shuffled with ``--shuffle-modules``; the
    modules of one unit run next to each other. Tests inside a module keep their order, since module
    fixtures and some tests build on the ones before them. Every xdist worker collects with the same
    options, so all of them see the same order, as xdist requires."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.partition("::")[0], []).append(item)
    units: dict[str, list[str]] = {}
    for module in modules:
        units.setdefault(_unit_of(module), []).append(module)
    seed = config.getoption("--shuffle-modules")
    if seed is not None:
        shuffle = random.Random(seed).shuffle
        for unit_modules in units.values():
            shuffle(unit_modules)
        order = list(units)
        shuffle(order)
    else:
        for unit_modules in units.values():
            unit_modules.sort(key=_tier_rank)  # stable: modules of one tier keep their collection order
        order = sorted(units, key=lambda unit: _tier_rank(units[unit][0]))
    items[:] = [item for unit in order for module in units[unit] for item in modules[module]]


def _tier_rank(module_path: str) -> int:
    parts = module_path.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """pytest-xdist's ``loadfile`` distribution, with the :data:`KUEUE_MODULES` as one unit: a worker
    takes a whole module, or all of those modules, at a time, so module fixtures are made once and
    the modules sharing the control plane with Kueue run one after another on one worker."""

    def _split_scope(self, nodeid: str) -> str:
        return _unit_of(nodeid)


@pytest.hookimpl
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> ModuleScheduling | None:
    """`make test` runs ``--dist loadfile``: distribute by :class:`ModuleScheduling` then."""
    return ModuleScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


class HasLogTails(Protocol):
    def log_tails(self) -> dict[str, str]: ...


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """When a test fails, attach the log tails of every daemon its fixtures started (the control
    plane's components, each real node's containerd and kubelet)."""
    report = yield
    if report.failed:
        tails: dict[str, str] = {}
        for value in getattr(item, "funcargs", {}).values():
            if callable(getattr(value, "log_tails", None)):
                tails.update(cast(HasLogTails, value).log_tails())
        for daemon, tail in tails.items():
            report.sections.append((f"{daemon} log (last lines)", tail))
    return report
