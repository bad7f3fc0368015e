"""Everything ``kubectl tessera`` prints passes through here: escaped, bounded, laid out.

Names, labels and annotations are anyone's input. A value may carry terminal escape sequences (which
would recolour, move the cursor or retitle the terminal of whoever reads the output), bidirectional
overrides (which reorder what is shown), markup, or ten kilobytes; printed raw, any of those lets a
pod's author decide what an operator sees. :func:`clean` makes every value one line of visible
characters of bounded length, and every table cell and sentence is built from cleaned values.
Machine output (``-o json|yaml``) keeps values as data but bounds their length (:func:`bounded`):
the serialisers escape control characters themselves.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from tessera.quantity import GiB, MiB

TEXT_LIMIT = 96
"""Characters of one value shown in a table cell or a sentence; the rest is cut and counted."""

DATA_LIMIT = 1024
"""Characters of one string value kept in JSON or YAML output."""

_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})
"""Control, format (bidirectional overrides, zero-width), line and paragraph separators, private
and unassigned code points: none is a visible character of its own."""


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with how many were left off."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…(+{len(text) - limit} chars)"


def clean(value: object, limit: int = TEXT_LIMIT) -> str:
    """``value`` as one line of visible characters, at most ``limit`` of them before a cut mark:
    invisible and control characters (and the backslash, so an escape cannot be forged) become
    backslash escapes."""
    text = cut(str(value), limit)
    return "".join(
        _escape(c) if c == "\\" or unicodedata.category(c) in _ESCAPED_CATEGORIES else c for c in text
    )


def bounded(data: Any, limit: int = DATA_LIMIT) -> Any:
    """``data`` (JSON-like) with every string, keys included, cut to ``limit`` characters."""
    if isinstance(data, str):
        return cut(data, limit)
    if isinstance(data, Mapping):
        return {bounded(k, limit): bounded(v, limit) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [bounded(v, limit) for v in data]
    return data


def as_json(data: Any) -> str:
    """Bounded data as JSON, every character outside ASCII escaped."""
    return json.dumps(bounded(data), indent=2, ensure_ascii=True, sort_keys=True)


def as_yaml(data: Any) -> str:
    """Bounded data as YAML; the safe dumper quotes and escapes what is not printable."""
    return str(yaml.safe_dump(bounded(data), sort_keys=True, allow_unicode=False))


def size(value: int | float | None) -> str:
    """12Gi, 1.5Gi, 512Mi: memory as a person reads it; '-' when unknown."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if value >= GiB:
        gib = value / GiB
        return f"{gib:.0f}Gi" if gib == int(gib) else f"{gib:.1f}Gi"
    return f"{value / MiB:.0f}Mi"


def bar(part: float, whole: float, width: int = 12) -> str:
    """``[#####-------]``: ``part`` of ``whole``, for a terminal."""
    filled = 0 if whole <= 0 else round(width * min(max(part / whole, 0.0), 1.0))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def columns(headers: Sequence[str], rows: Sequence[Sequence[object]], limit: int = TEXT_LIMIT) -> str:
    """A plain table (kubectl's style: upper-case headers, columns padded with spaces), every cell
    cleaned and cut at ``limit``."""
    cells = [[h.upper() for h in headers], *[[clean(c, limit) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )
