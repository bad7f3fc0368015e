"""docs/install.md's privileges table says what the rendered chart grants, container by container:
the chart is rendered with helm (the default values, and the layout of "Several nodes on one host",
which the test bed installs), every container of every pod it makes (``helm test`` pods included) has
exactly one row for that layout, and each row's user, host namespaces, privilege, added capabilities,
read-only root and host paths are the rendered ones. A privilege added to a template without a row,
or a row left behind after one is dropped, fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from testbed.chart_bed import node_layout_values
from tests.chart_helm import REPO, render

INSTALL_MD = REPO / "docs" / "install.md"
HEADING = "### Privileges, container by container"
COLUMNS = [
    "pod",
    "container",
    "with",
    "user",
    "hostPID",
    "hostNetwork",
    "privileged",
    "capabilities added",
    "read-only root",
    "host paths",
    "for",
]
CHECKED = COLUMNS[3:10]
NODE_ROOT = "/tmp/tessera-nodes"
# The two layouts, by the name the table's "with" column gives them; "any" rows hold in both. The
# second is the values shown under "Several nodes on one host" (the test bed's, bar its simulator).
LAYOUTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "several nodes on one host": {
        "kubeletPlugin": node_layout_values(
            NODE_ROOT, f"{NODE_ROOT}/$(NODE_NAME)/driver/usr/lib/x86_64-linux-gnu"
        )
    },
}
# The optional admission check and web view are rendered too, so that their containers have to have a row.
CHECK_ON = {"queue": {"admissionCheck": {"enabled": True}}, "webview": {"enabled": True}}
WITH_KUEUE = ("--api-versions", "kueue.x-k8s.io/v1beta2")
POD_KINDS = {"Pod", "Deployment", "DaemonSet", "StatefulSet", "Job"}


def table_rows() -> list[dict[str, str]]:
    """The table under HEADING, one dict per row, cells stripped."""
    text = INSTALL_MD.read_text()
    assert HEADING in text, f"docs/install.md has no section {HEADING!r}"
    lines = text.split(HEADING, 1)[1].splitlines()
    table = _first_table(lines)
    header = _cells(table[0])
    assert header == COLUMNS, f"the table's columns are {header}, expected {COLUMNS}"
    return [dict(zip(COLUMNS, _cells(line), strict=True)) for line in table[2:]]


def _first_table(lines: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def pod_name(cell: str) -> str:
    """The pod's object name in a release called tessera: the cell's `<release>-...` name."""
    names = [name for name in _code(cell) if name.startswith("<release>-")]
    assert len(names) == 1, f"pod cell {cell!r} names {names}"
    return names[0].replace("<release>", "tessera")


def layout_of(cell: str) -> str:
    """The "with" cell's layout: any, defaults, or the name of the section it links to."""
    link = re.fullmatch(r"\[([^\]]+)\]\(#[a-z0-9-]+\)", cell)
    return (link.group(1) if link else cell).lower()


def yes_no(value: bool) -> str:
    return "yes" if value else "no"


def facts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """What one rendered container is granted, written as the table writes it."""
    context = container.get("securityContext", {})
    pod_context = pod.get("securityContext", {})
    user = context.get("runAsUser", pod_context.get("runAsUser"))
    added = context.get("capabilities", {}).get("add", [])
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
    paths = [
        f"`{volumes[m['name']]}`" + (" (ro)" if m.get("readOnly") else "")
        for m in container.get("volumeMounts", [])
        if m["name"] in volumes
    ]
    return {
        "user": "image's" if user is None else str(user),
        "hostPID": yes_no(pod.get("hostPID", False)),
        "hostNetwork": yes_no(pod.get("hostNetwork", False)),
        "privileged": yes_no(context.get("privileged", False)),
        "capabilities added": ", ".join(f"`{c}`" for c in added) or "none",
        "read-only root": yes_no(context.get("readOnlyRootFilesystem", False)),
        "host paths": ", ".join(paths) or "none",
    }


def rendered_containers(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, str]]:
    """(pod object name, container name) to the container's facts, for every pod the chart makes."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for o in objects:
        if o["kind"] not in POD_KINDS:
            continue
        pod = o["spec"] if o["kind"] == "Pod" else o["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            out[(o["metadata"]["name"], container["name"])] = facts(pod, container)
    return out


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-privileges")


def test_the_table_names_only_known_layouts_and_explains_every_row() -> None:
    rows = table_rows()
    assert rows
    for row in rows:
        assert layout_of(row["with"]) in {"any", *LAYOUTS}, row
        assert row["for"], f"row {row['pod']} {row['container']} does not say what its privileges are for"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_rendered_container_has_its_row_and_the_row_is_true(home: Path, layout: str) -> None:
    values = {**LAYOUTS[layout], **CHECK_ON}
    rendered = rendered_containers(render(home / layout.replace(" ", "-"), values, extra=WITH_KUEUE))
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for row in table_rows():
        if layout_of(row["with"]) in ("any", layout):
            key = (pod_name(row["pod"]), row["container"].strip("`"))
            assert key not in rows, f"two rows for {key} with {layout}"
            rows[key] = {column: row[column] for column in CHECKED}
    assert set(rows) - set(rendered) == set(), "rows for containers the chart does not make"
    assert set(rendered) - set(rows) == set(), "containers without a row"
    for key, granted in rendered.items():
        assert rows[key] == granted, f"{key} with {layout}"
