"""Writes docs/configuration.md, the configuration reference, from what the code and the chart declare.

Two sources, so the page cannot say something they do not:

- the chart's values: every key of ``charts/tessera/values.schema.json`` (its type and constraints), with
  its default from ``values.yaml`` and its description from the schema's ``description`` and from the
  comment above the key in ``values.yaml``;
- the daemons' flags: the argparse parsers behind ``tessera-driver``, ``tessera-exporter``,
  ``tessera-webhook`` and ``tessera-admission-check --help`` (flag, environment variable, default,
  choices, help), built with an empty environment so that the defaults are the programs' own, not
  this shell's.

    .venv/bin/python -m tools.docs_reference           # rewrite docs/configuration.md
    .venv/bin/python -m tools.docs_reference --check   # exit 1 if the page differs from what it would write

``tests/unit/docs/test_docs_reference.py`` runs the check, so a changed schema, values file or flag
fails the tests until the page is regenerated.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "tessera"
PAGE = REPO / "docs" / "configuration.md"
COMMAND = ".venv/bin/python -m tools.docs_reference"


@dataclass(frozen=True)
class Value:
    """One key of the chart's values."""

    path: str
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Flag:
    """One flag of a daemon."""

    flags: tuple[str, ...]
    metavar: str
    env: str
    default: str
    description: str


# ---------------------------------------------------------------------------------------------------
# Chart values


def values_comments(text: str) -> dict[str, str]:
    """Dotted key path -> the comment block right above that key in a values file (blank lines end a
    block; separator lines of dashes are dropped)."""
    comments: dict[str, str] = {}
    pending: list[str] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            if body and set(body) != {"-"}:
                pending.append(body)
            continue
        match = re.match(r"^(\s*)([^\s#:-][^:]*?|\"[^\"]+\"):(\s|$)", line)
        if match is None:  # a list item or a continuation: not a key of its own
            pending = []
            continue
        indent, key = len(match.group(1)), match.group(2).strip('"')
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if pending:
            comments[".".join(k for _, k in stack)] = " ".join(pending)
        pending = []
    return comments


def _type_of(node: Mapping[str, Any]) -> str:
    kind = node.get("type")
    if isinstance(kind, list):
        text = " or ".join(kind)
    elif kind == "array":
        items = node.get("items") or {}
        text = f"array of {_type_of(items)}s" if items.get("type") else "array"
    elif kind == "object" and isinstance(node.get("additionalProperties"), dict):
        text = f"map of {_type_of(node['additionalProperties'])}"
    else:
        text = str(kind or "any")
    return text


def _constraints(node: Mapping[str, Any]) -> list[str]:
    out = []
    if "enum" in node:
        out.append("one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"]))
    if "minimum" in node:
        out.append(f"at least {node['minimum']}")
    if "exclusiveMinimum" in node:
        out.append(f"more than {node['exclusiveMinimum']}")
    if "maximum" in node:
        out.append(f"at most {node['maximum']}")
    if node.get("minLength"):
        out.append("not empty")
    if "pattern" in node:
        out.append(f"matches `{node['pattern']}`")
    items = node.get("items")
    if isinstance(items, dict) and "pattern" in items:
        out.append(f"each matches `{items['pattern']}`")
    return out


def _default(values: Any, path: Sequence[str]) -> tuple[bool, Any]:
    node = values
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _show(value: Any) -> str:
    text = value if isinstance(value, str) and value == "" else None
    if text is not None:
        return '`""`'
    return "`" + json.dumps(value, separators=(", ", ": ")) + "`"


def _cell(text: str) -> str:
    """``text`` for a table cell: one line, pipes escaped, and outside code spans ``<`` escaped so that
    a placeholder like <release> is not taken for an HTML tag."""
    pieces = re.split(r"(`[^`]*`)", re.sub(r"\s+", " ", text).strip())
    return "".join(
        piece if piece.startswith("`") else piece.replace("<", "\\<").replace(">", "\\>") for piece in pieces
    ).replace("|", "\\|")


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def _merged(description: str, comment: str) -> list[str]:
    """The schema's description and the values file's comment, as sentences; the shorter one is left
    out when nearly all of its words are in the other."""
    texts = [t.strip() for t in (description, comment) if t.strip()]
    if len(texts) == 2:
        short, long = sorted(texts, key=len)
        if len(_words(short) - _words(long)) <= len(_words(short)) // 5:
            texts = [long]
    return [_sentence(t) for t in texts]


def _sentence(text: str) -> str:
    """``text`` with a capital (unless it starts with a name like spec.field or a path) and a full stop."""
    if re.match(r"[a-z]+\b(?![./])", text):
        text = text[:1].upper() + text[1:]
    return text + ("" if text.endswith(".") else ".")


# What a key that neither the schema nor values.yaml describes means when it is one of the usual
# Kubernetes pod settings every component has; matched on the key's last one or two path parts.
STANDARD = {
    "global": "Helm's values shared with subcharts; Tessera reads none.",
    "imagePullSecrets": "Secrets for pulling images, as `[{name: <secret>}]`, for every pod the chart makes.",
    "affinity": "The pods' Kubernetes affinity.",
    "nodeSelector": "Node labels the pods must match.",
    "tolerations": "Taints the pods tolerate (Kubernetes tolerations).",
    "priorityClassName": "The pods' PriorityClass; empty: none.",
    "rollingUpdate.maxSurge": "Pods started above the desired number during a rollout.",
    "rollingUpdate.maxUnavailable": "Pods that may be missing during a rollout.",
    "podDisruptionBudget.maxUnavailable": "Pods a voluntary disruption (a node drain) may take at once.",
    "requests": "The container's resource requests.",
    "limits": "The container's resource limits.",
    "claims": "The container's resource claims (Kubernetes `resources.claims`); normally unset.",
    "podAnnotations": "Annotations added to the pods.",
    "podLabels": "Labels added to the pods.",
    "enabled": "Whether the chart installs this part.",
    "labels": "Labels added to the object.",
    "annotations": "Annotations added to the object.",
    "pullPolicy": "When the kubelet pulls the image (`imagePullPolicy`).",
    "logLevel": "How much the daemon logs.",
    "logFormat": "`text`: one readable line per message; `json`: one JSON object per line.",
    "replicas": "Number of pods.",
    "port": "Port the daemon serves on.",
    "service.nodePort": "The port every node answers on when `type` is NodePort.",
    "updateStrategy.type": "The DaemonSet's update strategy.",
    "interval": "How often Prometheus scrapes.",
    "certManager.duration": "Lifetime of the certificate cert-manager issues.",
    "certManager.renewBefore": "How long before it expires cert-manager renews it.",
    "tests.cores": "Percent of the GPU's time each test pod asks for.",
    "resourceFlavor.name": "Name of the ResourceFlavor.",
    "queueingStrategy": "Kueue's queueing strategy of each ClusterQueue.",
    "preemption.withinClusterQueue": "Kueue's preemption policy inside a ClusterQueue.",
    "preemption.reclaimWithinCohort": "Kueue's policy for reclaiming lent quota from the cohort.",
    "borrowWithinCohort.policy": "Kueue's preemption policy while borrowing within the cohort.",
    "borrowWithinCohort.maxPriorityThreshold": "Kueue's threshold: a borrowing Workload may preempt only "
    "Workloads of this priority or lower.",
    "issuerRef.name": "Name of the existing cert-manager issuer.",
    "issuerRef.kind": "Kind of the existing issuer: `Issuer` (in the release namespace) or `ClusterIssuer`.",
    "issuerRef.group": "API group of the existing issuer (cert-manager's own: `cert-manager.io`).",
}


def _standard(path: Sequence[str]) -> str:
    return STANDARD.get(".".join(path[-2:])) or STANDARD.get(path[-1], "")


def chart_values(
    schema: Mapping[str, Any],
    values: Any,
    comments: Mapping[str, str],
    flags: Mapping[str, tuple[str, Flag]] | None = None,
) -> list[Value]:
    """Every key the schema declares, depth first in the schema's order; ``flags`` maps a value to the
    daemon flag the chart passes it as (program, flag)."""
    flags = flags or {}
    out: list[Value] = []

    def walk(node: Mapping[str, Any], path: list[str]) -> None:
        for key, child in (node.get("properties") or {}).items():
            here = [*path, key]
            dotted = ".".join(here)
            parts = _merged(str(child.get("description") or ""), comments.get(dotted, ""))
            if not parts and not child.get("properties"):
                parts = _merged(_standard(here), "")
            if dotted in flags:
                program, flag = flags[dotted]
                if not parts:
                    parts = [_sentence(flag.description)]
                parts.append(f"Passed as `{program} {flag.flags[0]}`.")
            parts.extend(_sentence(c) for c in _constraints(child))
            has_children = bool(child.get("properties"))
            found, default = _default(values, here)
            shown = "" if has_children else (_show(default) if found else "unset")
            out.append(Value(dotted, _type_of(child), shown, " ".join(parts)))
            if has_children:
                walk(child, here)

    walk(schema, [])
    return out


# ---------------------------------------------------------------------------------------------------
# Which value becomes which flag

TEMPLATES = {
    "kubeletplugin.yaml": "tessera-driver",
    "webhook-deployment.yaml": "tessera-webhook",
    "admissioncheck-deployment.yaml": "tessera-admission-check",
}
"""The chart's template that runs each daemon."""


def value_flags() -> dict[str, tuple[str, str]]:
    """Chart value -> (program, flag), read from the templates' ``- --flag={{ $v.path }}`` arguments
    (and ``{{- range $v.list }} - --flag={{ . }}``), with ``$v := .Values.x`` bindings followed."""
    out: dict[str, tuple[str, str]] = {}
    for name, program in TEMPLATES.items():
        path = CHART / "templates" / name
        if not path.exists():
            continue
        text = path.read_text()
        bound = {"": "", ".Values": ""}
        for var, expression in re.findall(r"\{\{-?\s*\$(\w+)\s*:=\s*([$.\w]+)\s*-?\}\}", text):
            head, _, rest = expression.partition(".") if expression.startswith("$") else ("", "", expression)
            base = bound.get(head.lstrip("$")) if head else ""
            if expression.startswith(".Values."):
                bound[var] = expression[len(".Values.") :]
            elif base is not None and head:
                bound[var] = f"{base}.{rest}" if rest else base
        arguments = r"-\s+(--[a-z][a-z-]*)=\{\{\s*(?:\w+\s+)?\$(\w+)\.([\w.]+)\s*\}\}"
        for flag, var, rest in re.findall(arguments, text):
            if var in bound:
                out[f"{bound[var]}.{rest}"] = (program, flag)
        ranges = r"range\s+\$(\w+)\.([\w.]+)\s*\}\}\s*-\s+(--[a-z][a-z-]*)=\{\{\s*\.\s*\}\}"
        for var, rest, flag in re.findall(ranges, text):
            if var in bound:
                out[f"{bound[var]}.{rest}"] = (program, flag)
    return out


# ---------------------------------------------------------------------------------------------------
# Daemon flags

_ENV = re.compile(r"\s*\[env (?P<env>[A-Z_][A-Z0-9_]*)(?P<list>, a,b)?\]")


def _parsers() -> list[tuple[str, Callable[[], argparse.ArgumentParser]]]:
    from tessera.admissioncheck import cli as admission_cli
    from tessera.driver import cli as driver_cli
    from tessera.exporter import cli as exporter_cli
    from tessera.webhook import cli as webhook_cli
    from tessera.webview import cli as webview_cli

    return [
        ("tessera-driver", driver_cli.parser),
        ("tessera-exporter", exporter_cli.parser),
        ("tessera-webhook", webhook_cli.parser),
        ("tessera-admission-check", admission_cli.parser),
        ("tessera-webview", webview_cli.parser),
    ]


def _flag_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, list):
        return "none" if not value else "`" + ",".join(map(str, value)) + "`"
    if value == "":
        return "empty"
    return f"`{value}`"


FLAG_STANDARD = {
    "--log-level": "how much the daemon logs",
    "--log-format": "`text`: one readable line per message; `json`: one JSON object per line",
}
"""What a flag whose --help says nothing but its choices means."""


def flags_of(make_parser: Callable[[], argparse.ArgumentParser]) -> tuple[str, list[Flag]]:
    """The parser's description and every flag but --help, with the programs' own defaults."""
    with mock.patch.dict(os.environ, {}, clear=True):
        parser = make_parser()
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        help_text = action.help or ""
        match = _ENV.search(help_text)
        env = match.group("env") if match else ""
        if match and match.group("list"):
            env += " (comma-separated)"
        text = _ENV.sub("", help_text).strip() or FLAG_STANDARD.get(action.option_strings[0], "")
        if action.choices:
            choices = ", ".join(f"`{c}`" for c in action.choices)
            text = f"{text}; one of {choices}" if text else f"One of {choices}"
        if isinstance(action, argparse._AppendAction):
            text += "" if "repeatable" in text else "; repeatable"
        metavar = ""
        if action.nargs != 0:
            metavar = str(action.metavar or action.dest.upper())
            if action.choices and not action.metavar:
                metavar = "{" + ",".join(map(str, action.choices)) + "}"
        text = _sentence(text)
        flags = tuple(s for s in action.option_strings if s.startswith("--"))
        out.append(Flag(flags, metavar, env, _flag_default(action.default), text))
    return parser.description or "", out


# ---------------------------------------------------------------------------------------------------
# The shim's environment

SHIM_HEADER = REPO / "tessera" / "shim" / "include" / "tessera_shim.h"

# What each variable the shim reads means: keyed by its macro in tessera_shim.h, so a new variable there
# without a line here fails the page's test (``shim_env`` raises).
SHIM_ENV = {
    "TESSERA_LIMITS_ENV": "A limits file, for processes outside a prepared container (tests, the shim run by "
    "hand): unset or empty, the shim limits nothing; naming a missing file stops the process. Ignored in a "
    "prepared container, whose limits are always `/run/tessera/limits`.",
    "TESSERA_REGION_ENV": "A usage region shared by the processes that name it, outside a prepared "
    "container; unset: limits apply to each process on its own (with a warning). Ignored in a prepared "
    "container, whose region is always `/run/tessera/usage`.",
    "TESSERA_PRIORITY_ENV": "The folder of the GPUs' priority boards (one file per GPU UUID), outside a "
    "prepared container; unset: priority plays no part. Ignored in a prepared container, whose boards are "
    "always under `/run/tessera/priority`.",
    "TESSERA_LOG_ENV": "What the shim prints on stderr: `error`, `warn` (default), `info` (one line per "
    "process with the limits in force) or `debug`. Set it in the pod's container `env`.",
}


def shim_env() -> list[tuple[str, str]]:
    """(variable, meaning) for every ``#define TESSERA_*_ENV "NAME"`` of the shim's header."""
    out = []
    for macro, name in re.findall(r'#define (TESSERA_\w+_ENV) "([^"]+)"', SHIM_HEADER.read_text()):
        if macro not in SHIM_ENV:
            raise KeyError(f"{macro} ({name}) in {SHIM_HEADER.name} has no description in SHIM_ENV")
        out.append((name, SHIM_ENV[macro]))
    return out


# ---------------------------------------------------------------------------------------------------
# The page


def _value_rows(values: Sequence[Value]) -> Iterator[str]:
    yield "| value | type | default | description |"
    yield "|---|---|---|---|"
    for v in values:
        yield f"| `{v.path}` | {_cell(v.type)} | {_cell(v.default)} | {_cell(v.description)} |"


def render() -> str:
    """The whole page, as the current schema, values file and parsers give it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values_text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    programs = {program: flags_of(make_parser) for program, make_parser in _parsers()}
    by_flag = {(program, f.flags[0]): f for program, (_, flags) in programs.items() for f in flags}
    value_to_flag = {value: (p, by_flag[(p, flag)]) for value, (p, flag) in value_flags().items()}
    rows = chart_values(schema, values, values_comments(values_text), value_to_flag)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `" + COMMAND + "` from charts/tessera/values.schema.json, "
        "charts/tessera/values.yaml and the daemons' flags. Do not edit by hand: change those and run it "
        "again; tests/unit/docs/test_docs_reference.py fails while this page differs. -->",
        "",
        "Everything Tessera can be configured with: the Helm chart's values (set them with `--set` or a "
        "values file, see [install.md](install.md)) and the flags of the three daemons the chart runs. "
        "Every flag can also be given as the environment variable next to it; a flag on the command line "
        "wins over the variable.",
        "",
        "## Chart values",
        "",
        "`values.schema.json` refuses unknown keys and wrong types; `templates/validation.yaml` refuses "
        "combinations that cannot work. A default of `unset` means the key is absent from `values.yaml`; "
        "an object's keys follow it.",
    ]
    tops = list(schema.get("properties") or {})
    general = [t for t in tops if not schema["properties"][t].get("properties")]
    lines += ["", "### General", "", *_value_rows([v for v in rows if v.path in general])]
    for top in (t for t in tops if t not in general):
        group = [v for v in rows if v.path == top or v.path.startswith(top + ".")]
        lines += ["", f"### {top}", "", *_value_rows(group)]
    lines += [
        "",
        "## Daemon flags",
        "",
        "The chart sets these from the values above; `extraArgs` and `env` of `kubeletPlugin` reach the "
        "ones it does not set.",
    ]
    for program, (description, flags) in programs.items():
        lines += ["", f"### {program}", "", _cell(description), ""]
        lines += ["| flag | environment variable | default | description |", "|---|---|---|---|"]
        for f in flags:
            flag = " / ".join(f"`{s}`" for s in f.flags)
            if f.metavar:
                flag = f"`{f.flags[0]} {f.metavar}`" + "".join(f" / `{s}`" for s in f.flags[1:])
            env = f"`{f.env.split(' ')[0]}`{f.env[len(f.env.split(' ')[0]) :]}" if f.env else "none"
            lines.append(f"| {_cell(flag)} | {_cell(env)} | {_cell(f.default)} | {_cell(f.description)} |")
    lines += [
        "",
        "## The shim's environment",
        "",
        "Read by the enforcement shim in every process of a prepared container ([shim.md](shim.md)).",
        "",
        "| variable | meaning |",
        "|---|---|",
        *(f"| `{name}` | {_cell(text)} |" for name, text in shim_env()),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.docs_reference", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is out of date")
    args = p.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE.relative_to(REPO)} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
