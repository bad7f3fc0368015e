"""Fixtures shared by every test tier: the local control plane, API clients and namespaces.

The cluster is session-scoped (starting it costs seconds; sharing it costs nothing because every test
works in its own namespace and names its cluster-scoped objects uniquely). When a test that used the
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

from tessera.kube import api_client
from testbed.binaries import COMPONENTS
from testbed.cluster import LocalCluster
from testbed.fake_nodes import create_ready_node
from testbed.interrupts import interrupt_on_sigterm
from testbed.names import unique_name
from testbed.polling import poll_until


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    missing = [name for name in ("etcd", "kubernetes") if COMPONENTS[name].missing()]
    if missing:
        # Building takes minutes: longer than a test may take. `make test` builds first.
        pytest.fail(f"test-bed binaries not built ({', '.join(missing)}): run `make binaries`")
    with LocalCluster() as running:
        yield running


@pytest.fixture(scope="session")
def kube(cluster: LocalCluster) -> client.ApiClient:
    return api_client(cluster.admin_kubeconfig)


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
takes the next module when it is almost done with its last, in collection order: modules that
wait minutes go first, and the tail of the run is made of the short ones."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order modules by tier (:data:`TIER_ORDER`, then the rest as collected), or shuffled with
    ``--shuffle-modules``; tests inside a module keep their order, since module fixtures and some
    tests build on the ones before them. Every xdist worker collects with the same options, so all
    of them see the same order, as xdist requires."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.partition("::")[0], []).append(item)
    names = list(modules)
    seed = config.getoption("--shuffle-modules")
    if seed is not None:
        random.Random(seed).shuffle(names)
    else:
        names.sort(key=_tier_rank)  # stable: modules of one tier keep their collection order
    items[:] = [item for name in names for item in modules[name]]


def _tier_rank(module_path: str) -> int:
    parts = module_path.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


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
