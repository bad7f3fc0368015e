"""The four HAMi GPU-choice annotations compiled into CEL selectors, with quoting done once here.

Annotation values are user input that ends up inside a CEL expression the scheduler evaluates; every
value becomes a CEL string literal through :func:`cel_string` and nothing else, so no value can add
an operator, close a string or call a function.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tessera.names import (
    DRIVER_NAME,
    HAMI_NOUSE_TYPE,
    HAMI_NOUSE_UUID,
    HAMI_USE_TYPE,
    HAMI_USE_UUID,
)

MAX_ANNOTATION_LENGTH = 2048
"""Longest annotation value accepted: keeps every selector far below CEL's 10 KiB expression limit."""

_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
"""What a GPU UUID looks like (``GPU-8a1f...``, ``MIG-...``); anything else is a typo worth refusing."""

_UUID_ATTRIBUTE = f'device.attributes["{DRIVER_NAME}"].uuid'
_PRODUCT_ATTRIBUTE = f'device.attributes["{DRIVER_NAME}"].productName'


class AnnotationError(ValueError):
    """An annotation that cannot be turned into a selector; the message is one sentence for the user."""


def cel_string(value: str) -> str:
    """``value`` as a double-quoted CEL string literal that evaluates to exactly ``value``.

    Backslash and double quote are escaped, and every character outside printable ASCII becomes a
    ``\\u``/``\\U`` escape, so the literal is plain ASCII and cannot end early whatever the input."""
    out = ['"']
    for char in value:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFFFF:
            if 0xD800 <= code <= 0xDFFF:  # a lone surrogate is not a valid CEL string character
                raise AnnotationError(f"value {value!r} contains an invalid character.")
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def split_list(annotation: str, value: str) -> list[str]:
    """The comma-separated entries of an annotation, trimmed; refuses empty entries and empty lists."""
    if len(value) > MAX_ANNOTATION_LENGTH:
        raise AnnotationError(f"annotation {annotation} is longer than {MAX_ANNOTATION_LENGTH} characters.")
    entries = [entry.strip() for entry in value.split(",")]
    if not any(entries):
        raise AnnotationError(f"annotation {annotation} names no value.")
    if not all(entries):
        raise AnnotationError(f"annotation {annotation} has an empty entry in {value!r}.")
    return entries


def _uuids(annotation: str, value: str) -> str:
    entries = split_list(annotation, value)
    for entry in entries:
        if not _UUID.match(entry):
            raise AnnotationError(f"annotation {annotation} has {entry!r}, which is not a GPU UUID.")
    return "[" + ", ".join(cel_string(entry) for entry in dict.fromkeys(entries)) + "]"


def _types(annotation: str, value: str) -> str:
    entries = [entry.lower() for entry in split_list(annotation, value)]
    return "[" + ", ".join(cel_string(entry) for entry in dict.fromkeys(entries)) + "]"


def selectors_for(annotations: Mapping[str, str]) -> list[str]:
    """CEL expressions, all of which a GPU must satisfy, for the HAMi annotations among ``annotations``.

    UUID lists match exactly; type lists match when an entry is part of the product name, ignoring
    case ("a100" matches "NVIDIA A100-SXM4-80GB"), as HAMi does."""
    expressions: list[str] = []
    if HAMI_USE_UUID in annotations:
        expressions.append(f"{_UUID_ATTRIBUTE} in {_uuids(HAMI_USE_UUID, annotations[HAMI_USE_UUID])}")
    if HAMI_NOUSE_UUID in annotations:
        expressions.append(f"!({_UUID_ATTRIBUTE} in {_uuids(HAMI_NOUSE_UUID, annotations[HAMI_NOUSE_UUID])})")
    if HAMI_USE_TYPE in annotations:
        types = _types(HAMI_USE_TYPE, annotations[HAMI_USE_TYPE])
        expressions.append(f"{types}.exists(t, {_PRODUCT_ATTRIBUTE}.lowerAscii().contains(t))")
    if HAMI_NOUSE_TYPE in annotations:
        types = _types(HAMI_NOUSE_TYPE, annotations[HAMI_NOUSE_TYPE])
        expressions.append(f"!{types}.exists(t, {_PRODUCT_ATTRIBUTE}.lowerAscii().contains(t))")
    return expressions
