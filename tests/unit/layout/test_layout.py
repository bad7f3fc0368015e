"""The product's layout: one folder per part, each importing only what its role allows; nothing of
the development tree reachable from the product; one name per module (no links, no old paths); the
product installs the product's commands and the development distribution the test bed's."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.layout.layout_facts import (
    CORE,
    PARTS,
    REPO,
    imported_modules,
    imports_outside,
    product_files,
    scripts,
)

ALLOWED: dict[str, set[str]] = {
    CORE: set(),
    "shim": {CORE},
    "proto": set(),
    "driver": {CORE, "shim", "proto"},
    "exporter": {CORE, "shim", "driver"},
    "webhook": {CORE},
    "admissioncheck": {CORE},
    "kubectl": {CORE, "admissioncheck"},
    "webview": {CORE, "kubectl"},
}
"""Which parts each part may import. The webhook and the admission check share the GPU request
model (tessera/gpu_request.py) and the ResourceSlice reader through the core, never through each
other: a change to how one writes cannot silently change how the other reads. The kubectl plugin
reads, and explains, with the admission check's own fit code: its "why" must be the admission
check's judgement, so it imports it rather than having a second one. The web view shows what the
plugin shows, with the plugin's views and judgement."""

ONE_SHOT_COMMANDS = {"tessera.kubectl.cli"}
"""Commands that read, print and exit: the daemons' skeleton (start, wait for a signal, stop) is
not theirs."""

EXPORTER_READS_OF_THE_DRIVER = (
    "tessera.driver.checkpoint",
    "tessera.driver.claim_files",
    "tessera.driver.devices",
    "tessera.driver.discovery",
)
"""The exporter reads what the driver leaves on the node (its checkpoint and claim folders) and
finds GPUs the same way; nothing of the daemon itself (its servers, its gRPC plugin, its config)."""


def test_every_part_has_a_rule_and_the_rules_cover_the_tree() -> None:
    folders = {path.name for path in (REPO / "tessera").iterdir() if (path / "__init__.py").exists()}
    assert folders == set(PARTS)
    assert set(ALLOWED) == {CORE, *PARTS}


WEBHOOK_EXPLAINS_WITH = {
    "tessera/webhook/waiting_pods.py": {
        "tessera.kubectl.snapshot",
        "tessera.kubectl.text",
        "tessera.kubectl.why",
    }
}
"""The one exception to the webhook's rule: its Event on a waiting pod tells what ``kubectl tessera
why`` tells, so it uses the plugin's judgement (and through it the admission check's fit) rather
than a copy. Nothing on the admission path imports it: how the webhook converts a pod never
depends on the admission check."""


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_a_part_imports_only_the_parts_its_role_allows_and_nothing_of_the_development_tree(part: str) -> None:
    assert list(product_files(part)), f"tessera/{part} has no Python file"
    stray = imports_outside(part, ALLOWED[part])
    for path, modules in WEBHOOK_EXPLAINS_WITH.items():
        if path in stray and set(stray[path]) <= modules:
            del stray[path]
    assert stray == {}


def test_only_the_webhooks_waiting_pod_events_and_its_command_reach_the_explanation() -> None:
    importers = {
        str(path.relative_to(REPO))
        for path in product_files("webhook")
        if "tessera.webhook.waiting_pods" in imported_modules(path)
    }
    assert importers == {"tessera/webhook/cli.py"}


def test_the_exporter_reads_the_drivers_files_but_imports_none_of_the_daemon() -> None:
    reads = {
        name
        for path in product_files("exporter")
        for name in imported_modules(path)
        if name.startswith("tessera.driver")
    }
    assert reads <= set(EXPORTER_READS_OF_THE_DRIVER)


COMMAND_MODULES = sorted(
    target.split(":")[0]
    for target in scripts(REPO / "pyproject.toml").values()
    if target.split(":")[0] not in ONE_SHOT_COMMANDS
)
"""The module of every daemon the product installs."""

HTTP_SERVER_MODULES = ("http.server", "wsgiref", "socketserver")
"""Standard-library modules that make an HTTP server (or the socket server under one)."""
EVENT_LOOP_SERVERS = ("start_server", "create_server")
"""asyncio's calls that open a listening socket."""
HTTP_SERVERS_ALLOWED = {
    "tessera/serving.py": "the one way Tessera serves HTTP",
    "tessera/webhook/server.py": "the admission listener, kept for its bounds (its docstring says why)",
    "tessera/webview/cli.py": "the web view's page, a WSGI app served by waitress (its docstring says why)",
}


def _makes_a_server(path: Path) -> bool:
    imported = imported_modules(path)
    if any(
        name == module or name.startswith(module + ".") for name in imported for module in HTTP_SERVER_MODULES
    ):
        return True
    for node in ast.walk(ast.parse(path.read_text())):
        named = (
            node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        )
        if named in EVENT_LOOP_SERVERS:
            return True
    return False


def _calls_command_main(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "main"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "command"
        for node in ast.walk(function)
    )


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_every_daemon_runs_on_the_one_process_skeleton(module: str) -> None:
    path = REPO.joinpath(*module.split(".")).with_suffix(".py")
    assert "tessera.command" in imported_modules(path)
    tree = ast.parse(path.read_text())
    mains = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
    assert len(mains) == 1 and _calls_command_main(mains[0])


def test_only_the_serving_module_and_the_admission_listener_make_an_http_server() -> None:
    every_file = [path for part in (CORE, *PARTS) for path in product_files(part)]
    makers = {str(path.relative_to(REPO)) for path in every_file if _makes_a_server(path)}
    assert makers == set(HTTP_SERVERS_ALLOWED)


def test_the_repository_holds_no_symbolic_link() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "--stage"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert [line for line in tracked if line.startswith("120000")] == []


@pytest.mark.parametrize(
    "old_name",
    [
        "driver.daemon",
        "webhook.cli",
        "admissioncheck.cli",
        "shim.format",
        "proto.generate",
        "tessera.testbed",
        "tessera.simgpu",
        "tessera.shim.testing",
        "tessera.driver.exporter",
        "tessera.driver.metrics_server",
        "tessera.lifecycle",
    ],
)
def test_a_module_is_not_importable_under_its_old_name(old_name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {old_name}"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr


def test_each_module_has_one_name() -> None:
    spec = importlib.util.find_spec("tessera.driver.daemon")
    assert spec is not None and spec.origin == str(REPO / "tessera" / "driver" / "daemon.py")


def test_the_product_installs_its_commands_and_the_development_distribution_the_test_beds() -> None:
    assert scripts(REPO / "pyproject.toml") == {
        "tessera-driver": "tessera.driver.cli:main",
        "tessera-exporter": "tessera.exporter.cli:main",
        "tessera-webhook": "tessera.webhook.cli:main",
        "tessera-admission-check": "tessera.admissioncheck.cli:main",
        "kubectl-tessera": "tessera.kubectl.cli:main",
        "tessera-webview": "tessera.webview.cli:main",
    }
    assert scripts(REPO / "dev" / "pyproject.toml") == {"tessera-cluster": "testbed.cli:main"}


def test_lint_and_type_checks_cover_the_product_and_the_development_tree() -> None:
    makefile = (REPO / "Makefile").read_text().splitlines()
    sources = next(line for line in makefile if line.startswith("PY_SOURCES")).split(":=")[1].split()
    assert {"tessera", "testbed", "simgpu", "demo", "tools", "tests", "benchmarks"} <= set(sources)


def test_no_two_test_modules_share_a_name() -> None:
    """pytest imports test modules by their base name (the test folders are not packages), so two
    ``test_x.py`` in different tiers stop the whole run at collection, and only in a clean checkout:
    a working tree whose caches hold both hides it."""
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_the_driver_package_names_every_one_of_its_modules() -> None:
    """tessera/driver/__init__.py is where a reader learns the daemon's layout: a module it does not
    name is one the reader will not look for."""
    import tessera.driver

    described = set(re.findall(r"\b[a-z_]+\b", tessera.driver.__doc__ or ""))
    modules = {path.stem for path in (REPO / "tessera" / "driver").glob("*.py") if path.stem != "__init__"}
    assert modules - described == set()
