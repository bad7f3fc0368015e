"""The four views as text: bars for a person at a terminal, plain columns for a pipe; every value
through :func:`tessera.kubectl.text.clean`. Rows are the plain data of :mod:`views`, :mod:`why`
and :mod:`queue`, with the live figures of :mod:`usage` added where an exporter answered."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tessera.kubectl.text import bar, clean, columns, size

Row = Mapping[str, Any]


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def _taints(row: Row) -> str:
    marks = list(row["taints"])
    if row.get("nodeCordoned"):
        marks.append("node cordoned")
    return ", ".join(marks) or "-"


def gpus_columns(gpus: Sequence[Row], migs: Sequence[Row]) -> str:
    """Plain columns: a table of GPUs, one of their shares, one of MIG instances (when any)."""
    out = [
        columns(
            [
                "node",
                "gpu",
                "uuid",
                "product",
                "mem alloc",
                "mem total",
                "mem used",
                "cores alloc",
                "busy",
                "taints",
                "shares",
            ],
            [
                [
                    g["node"],
                    g["device"],
                    g["uuid"],
                    g["product"],
                    size(g["memory"]["allocated"]),
                    size(g["memory"]["capacity"]),
                    size(g.get("memoryUsed")),
                    f"{g['cores']['allocated']}/{g['cores']['capacity']}",
                    _percent(g.get("busy")),
                    _taints(g),
                    len(g["shares"]),
                ]
                for g in gpus
            ],
        )
    ]
    shares = [(g, s) for g in gpus for s in g["shares"]]
    if shares:
        out.append(
            columns(
                ["node", "gpu", "namespace", "pod", "claim", "memory", "cores", "mem used", "busy"],
                [
                    [
                        g["node"],
                        g["device"],
                        s["namespace"],
                        s["pod"] or "-",
                        s["claim"],
                        size(s["memory"]),
                        s["cores"] or "-",
                        size(s.get("memoryUsed")),
                        _percent(s.get("busy")),
                    ]
                    for g, s in shares
                ],
            )
        )
    if migs:
        out.append(_mig_columns(migs))
    return "\n\n".join(out)


def _mig_columns(migs: Sequence[Row]) -> str:
    return columns(
        ["node", "mig instance", "profile", "parent gpu", "memory", "claim", "pod"],
        [
            [
                m["node"],
                m["device"],
                m["profile"],
                m["parent"],
                size(m["memory"]),
                m["claim"] or "-",
                m["pod"] or "-",
            ]
            for m in migs
        ],
    )


def gpus_bars(gpus: Sequence[Row], migs: Sequence[Row]) -> str:
    """For a terminal: each node, its GPUs with memory and cores as bars, their shares beneath."""
    lines: list[str] = []
    node = None
    for g in gpus:
        if g["node"] != node:
            node = g["node"]
            lines.append(f"{clean(node)}{'  (node cordoned)' if g.get('nodeCordoned') else ''}")
        memory, cores = g["memory"], g["cores"]
        lines.append(f"  {clean(g['device'])}  {clean(g['uuid'])}  {clean(g['product'])}")
        used = g.get("memoryUsed")
        in_use = f", {size(used)} in use" if used is not None else ""
        lines.append(
            f"    memory {bar(memory['allocated'], memory['capacity'])} "
            f"{size(memory['allocated'])} of {size(memory['capacity'])} allocated{in_use}"
        )
        busy = g.get("busy")
        lines.append(
            f"    cores  {bar(cores['allocated'], cores['capacity'])} "
            f"{cores['allocated']} of {cores['capacity']} allocated"
            + (f", {_percent(busy)} busy" if busy is not None else "")
        )
        if g["taints"]:
            lines.append(f"    taints {clean(', '.join(g['taints']))}")
        for s in g["shares"]:
            live = f"  in use {size(s['memoryUsed'])}" if s.get("memoryUsed") is not None else ""
            lines.append(
                f"    share  {clean(s['namespace'])}/{clean(s['pod'] or '-')}  claim {clean(s['claim'])}  "
                f"{size(s['memory'])}  {s['cores'] or '-'} cores{live}"
            )
    if migs:
        lines.extend(["", _mig_columns(migs)])
    return "\n".join(lines)


def pods_columns(shares: Sequence[Row]) -> str:
    return columns(
        ["namespace", "pod", "claim", "node", "gpu", "uuid", "memory", "cores", "mem used", "busy"],
        [
            [
                s["namespace"],
                s["pod"] or "-",
                s["claim"],
                s["node"],
                s["device"],
                s["uuid"] or "-",
                size(s["memoryLimit"]),
                s["coresLimit"] or "-",
                size(s.get("memoryUsed")),
                _percent(s.get("busy")),
            ]
            for s in shares
        ],
    )


def why_text(pod: str, verdict: Row) -> str:
    """The reasons, one sentence a line, then each GPU's free capacity and what stops it."""
    head = "its GPU shares fit" if verdict["fits"] else "waits"
    lines = [f"pod {clean(pod)}: {head}"]
    lines.extend(f"- {clean(reason, limit=2048)}" for reason in verdict["reasons"])
    if verdict["gpus"]:
        lines.append("")
        lines.append(
            columns(
                ["node", "gpu", "uuid", "free memory", "free cores", "verdict"],
                [
                    [g["node"], g["device"], g["uuid"], size(g["freeMemory"]), g["freeCores"], g["verdict"]]
                    for g in verdict["gpus"]
                ],
                limit=256,
            )
        )
    return "\n".join(lines)


def queue_columns(rows: Sequence[Row]) -> str:
    return columns(
        ["namespace", "workload", "state", "message"],
        [[r["namespace"], r["workload"], r["state"], r["message"]] for r in rows],
        limit=512,
    )
