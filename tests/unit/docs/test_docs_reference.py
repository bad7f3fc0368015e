"""docs/configuration.md is what tools/docs_reference.py writes from the chart's schema and values and the
daemons' parsers, and it covers every value and every flag that `--help` shows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tools import docs_reference
from tools.docs_reference import CHART, PAGE, REPO

PROGRAMS = ("tessera-driver", "tessera-exporter", "tessera-webhook", "tessera-admission-check")


def test_the_committed_page_is_what_the_generator_writes() -> None:
    expected = docs_reference.render()
    assert PAGE.read_text() == expected, (
        f"{PAGE.relative_to(REPO)} is out of date with the chart's schema, values.yaml or a daemon's "
        f"flags: run {docs_reference.COMMAND} and commit the page"
    )


def test_check_mode_fails_on_a_stale_page_and_passes_on_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "configuration.md"
    monkeypatch.setattr(docs_reference, "PAGE", page)
    monkeypatch.setattr(docs_reference, "REPO", tmp_path)
    page.write_text("stale\n")
    assert docs_reference.main(["--check"]) == 1
    assert docs_reference.main([]) == 0
    assert docs_reference.main(["--check"]) == 0


def _schema_paths(node: dict[str, object], prefix: str = "") -> list[tuple[str, dict[str, object]]]:
    out = []
    for key, child in (node.get("properties") or {}).items():  # type: ignore[attr-defined]
        path = f"{prefix}{key}"
        out.append((path, child))
        out += _schema_paths(child, path + ".")
    return out


CONSTRAINT = re.compile(
    r"(One of|At least|At most|More than|Matches|Each matches|Not empty|Passed as)\b[^|]*?\.(?=\s|$)"
)


def _says_something(description: str) -> bool:
    """Whether a description says more than the value's constraints and the flag it becomes."""
    return bool(CONSTRAINT.sub("", description).strip())


def test_every_chart_value_is_on_the_page_with_its_default_and_a_description() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    page = PAGE.read_text()
    undescribed = []
    for path, node in _schema_paths(schema):
        row = re.search(rf"^\| `{re.escape(path)}` \| ([^|]*) \| ([^|]*) \| (.*) \|$", page, re.M)
        assert row, f"chart value {path} has no row in {PAGE.name}"
        if node.get("properties"):
            continue
        current = values
        for key in path.split("."):
            current = current.get(key, None) if isinstance(current, dict) else None
        if current is not None:
            assert row.group(2) == f"`{json.dumps(current, separators=(', ', ': '))}`", path
        if not _says_something(row.group(3)):
            undescribed.append(path)
    assert not undescribed, (
        f"chart values without a description: {undescribed}; write a comment above each in values.yaml "
        "(or a description in values.schema.json) and regenerate the page"
    )


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_flag_of_help_is_on_the_page_with_its_variable(program: str) -> None:
    help_text = subprocess.run(
        [str(Path(sys.executable).parent / program), "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    ).stdout
    page = PAGE.read_text()
    section = page.split(f"### {program}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    flags = set(re.findall(r"(--[a-z][a-z-]*)", help_text)) - {"--help"}
    assert flags, help_text
    for flag in sorted(flags):
        assert f"`{flag}" in section, f"{program} {flag} is missing from {PAGE.name}"
    for row in re.findall(r"^\| `(--[^`]*)`.*\| (.*) \|$", section, re.M):
        assert _says_something(row[1]), f"{program} {row[0]} has no help text beyond its choices"
    for env in re.findall(r"\[env ([A-Z_][A-Z0-9_]*)", help_text):
        assert f"`{env}`" in section, f"{program}'s variable {env} is missing from {PAGE.name}"


def test_defaults_on_the_page_ignore_the_environment_of_whoever_generates_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tessera.exporter import cli as exporter_cli

    monkeypatch.setenv("TESSERA_LOG_LEVEL", "debug")
    monkeypatch.setenv("TESSERA_METRICS_PORT", "1234")
    _, flags = docs_reference.flags_of(exporter_cli.parser)
    defaults = {f.flags[0]: f.default for f in flags}
    assert defaults["--log-level"] == "`info`"
    assert defaults["--metrics-port"] == "`31995`"


def test_values_comments_belong_to_the_key_below_them() -> None:
    text = (
        "# file header\n"
        "\n"
        "# ----------\n"
        "# The group.\n"
        "group:\n"
        "  # First line\n"
        "  # and second.\n"
        "  leaf: 1\n"
        "  list:\n"
        "    - key: x\n"
        "  other: 2\n"
        "top: 3\n"
    )
    assert docs_reference.values_comments(text) == {
        "group": "The group.",
        "group.leaf": "First line and second.",
    }


def test_a_shim_variable_without_a_description_stops_the_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    header = tmp_path / "tessera_shim.h"
    header.write_text('#define TESSERA_LOG_ENV "TESSERA_SHIM_LOG"\n#define TESSERA_NEW_ENV "TESSERA_NEW"\n')
    monkeypatch.setattr(docs_reference, "SHIM_HEADER", header)
    with pytest.raises(KeyError, match="TESSERA_NEW_ENV"):
        docs_reference.shim_env()


def test_each_value_passed_as_a_flag_reaches_that_flag_in_the_rendered_chart(tmp_path: Path) -> None:
    """The page's "Passed as" comes from reading the templates; rendering them must agree."""
    from tests.chart_helm import render

    mapping = docs_reference.value_flags()
    assert mapping["kubeletPlugin.cleanupInterval"] == ("tessera-driver", "--cleanup-interval")
    assert mapping["webhook.templateTTL"] == ("tessera-webhook", "--template-ttl")
    assert mapping["queue.admissionCheck.searchBudget"] == ("tessera-admission-check", "--search-budget")
    values = {
        "kubeletPlugin": {"containerEnv": ["A=1"], "containerMounts": ["/x"]},
        "queue": {"admissionCheck": {"enabled": True}},
    }
    objects = render(tmp_path, values, extra=["--api-versions=kueue.x-k8s.io/v1beta2"])
    args = [
        argument
        for o in objects
        if o["kind"] in ("DaemonSet", "Deployment")
        for container in o["spec"]["template"]["spec"]["containers"]
        for argument in container.get("args") or []
    ]
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for value, (_, flag) in mapping.items():
        current = defaults
        for key in value.split("."):
            current = current[key]
        given = [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
        assert given, f"{value}: no {flag}=... in the rendered chart's arguments"
        if not isinstance(current, list):
            assert str(current) in given, (value, flag, given)
