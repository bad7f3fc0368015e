"""The table of HAMi inputs in docs/webhook.md, read as data: the unit and integration tests drive
every row through the webhook, so the page and the behaviour cannot drift apart."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[3] / "docs" / "webhook.md"
START, END = "<!-- hami-inputs-table -->", "<!-- end hami-inputs-table -->"
ANSWERS = ("honoured", "warned", "refused")
_CODE = re.compile(r"`([^`]*)`")


@dataclass(frozen=True)
class Row:
    input: str
    limits: dict[str, str]
    annotations: dict[str, str]
    env: dict[str, str]
    security: dict[str, str]
    answer: str
    message: str

    @property
    def id(self) -> str:
        items = [*self.limits.items(), *self.annotations.items(), *self.env.items(), *self.security.items()]
        return ",".join(f"{key}={value}" for key, value in items)


def _row(cells: list[str]) -> Row:
    name, example, answer, _, message = cells
    sections: dict[str, dict[str, str]] = {"limits": {}, "annotation": {}, "env": {}, "securityContext": {}}
    for item in _CODE.findall(example):
        kind, _, assignment = item.partition(" ")
        key, _, value = assignment.partition("=")
        sections[kind][key] = value
    if not sections["limits"]:
        sections["limits"]["nvidia.com/gpu"] = "1"
    codes = _CODE.findall(message)
    return Row(
        name,
        sections["limits"],
        sections["annotation"],
        sections["env"],
        sections["securityContext"],
        answer,
        "".join(codes),
    )


def rows() -> list[Row]:
    """Every row of the table, in page order."""
    text = PAGE.read_text()
    table = text[text.index(START) + len(START) : text.index(END)].strip().splitlines()
    return [_row([cell.strip() for cell in line.strip("|").split(" | ")]) for line in table[2:]]


def pod_of(row: Row, name: str = "hami", node: str | None = None) -> dict[str, Any]:
    """The pod a HAMi user would write for ``row``: one container ``main``."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "tessera.local/none",
        "resources": {"limits": row.limits},
    }
    if row.security:
        container["securityContext"] = {key: value == "true" for key, value in row.security.items()}
    if row.env:
        container["env"] = [{"name": key, "value": value} for key, value in row.env.items()]
    spec: dict[str, Any] = {"containers": [container]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    metadata: dict[str, Any] = {"name": name}
    if row.annotations:
        metadata["annotations"] = dict(row.annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
