"""The four HAMi GPU-choice annotations compiled into CEL selectors, with quoting done once here.

Annotation values are user input that ends up inside a CEL expression the scheduler evaluates; every
value becomes a CEL string literal through :func:`cel_string` and nothing else, so no value can add
an operator, close a string or call a function.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

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
_PRODUCT_MATCH = f"{_PRODUCT_ATTRIBUTE}.lowerAscii().contains(t)"


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


def _uuid_entries(annotation: str, value: str) -> tuple[str, ...]:
    entries = split_list(annotation, value)
    for entry in entries:
        if not _UUID.match(entry):
            raise AnnotationError(f"annotation {annotation} has {entry!r}, which is not a GPU UUID.")
    return tuple(dict.fromkeys(entries))


def _type_entries(annotation: str, value: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(entry.lower() for entry in split_list(annotation, value)))


def _cel_list(entries: tuple[str, ...]) -> str:
    return "[" + ", ".join(cel_string(entry) for entry in entries) + "]"


@dataclass(frozen=True)
class Selection:
    """Which GPUs a pod may use, as the four annotations say: the one structured form, from which
    the webhook writes CEL (:meth:`cel`) and the admission check decides (:meth:`matches`).

    ``None`` means the annotation is absent; type entries are lower-cased."""

    use_uuids: tuple[str, ...] | None = None
    nouse_uuids: tuple[str, ...] | None = None
    use_types: tuple[str, ...] | None = None
    nouse_types: tuple[str, ...] | None = None

    @property
    def names_uuids(self) -> bool:
        return self.use_uuids is not None or self.nouse_uuids is not None

    def matches(self, uuid: str, product_name: str) -> bool:
        """Whether a GPU with this UUID and product name passes every selector, exactly as the CEL
        from :meth:`cel` evaluates on the device's attributes."""
        product = product_name.lower()
        if self.use_uuids is not None and uuid not in self.use_uuids:
            return False
        if self.nouse_uuids is not None and uuid in self.nouse_uuids:
            return False
        if self.use_types is not None and not any(t in product for t in self.use_types):
            return False
        return not (self.nouse_types is not None and any(t in product for t in self.nouse_types))

    def cel(self) -> list[str]:
        """CEL expressions, all of which a GPU must satisfy."""
        expressions: list[str] = []
        if self.use_uuids is not None:
            expressions.append(f"{_UUID_ATTRIBUTE} in {_cel_list(self.use_uuids)}")
        if self.nouse_uuids is not None:
            expressions.append(f"!({_UUID_ATTRIBUTE} in {_cel_list(self.nouse_uuids)})")
        if self.use_types is not None:
            expressions.append(f"{_cel_list(self.use_types)}.exists(t, {_PRODUCT_MATCH})")
        if self.nouse_types is not None:
            expressions.append(f"!{_cel_list(self.nouse_types)}.exists(t, {_PRODUCT_MATCH})")
        return expressions


def selection_for(annotations: Mapping[str, str]) -> Selection:
    """The Selection the HAMi annotations among ``annotations`` ask for; raises AnnotationError."""
    return Selection(
        use_uuids=_uuid_entries(HAMI_USE_UUID, annotations[HAMI_USE_UUID])
        if HAMI_USE_UUID in annotations
        else None,
        nouse_uuids=_uuid_entries(HAMI_NOUSE_UUID, annotations[HAMI_NOUSE_UUID])
        if HAMI_NOUSE_UUID in annotations
        else None,
        use_types=_type_entries(HAMI_USE_TYPE, annotations[HAMI_USE_TYPE])
        if HAMI_USE_TYPE in annotations
        else None,
        nouse_types=_type_entries(HAMI_NOUSE_TYPE, annotations[HAMI_NOUSE_TYPE])
        if HAMI_NOUSE_TYPE in annotations
        else None,
    )


def selectors_for(annotations: Mapping[str, str]) -> list[str]:
    """CEL expressions, all of which a GPU must satisfy, for the HAMi annotations among ``annotations``.

    UUID lists match exactly; type lists match when an entry is part of the product name, ignoring
    case ("a100" matches "NVIDIA A100-SXM4-80GB"), as HAMi does."""
    return selection_for(annotations).cel()


# -- reading back what cel() wrote -----------------------------------------------------------------

_LITERAL = r'"(?:[^"\\]|\\.)*"'
_LIST = rf"\[(?:{_LITERAL}(?:, {_LITERAL})*)?\]"
_FORMS = {
    "use_uuids": re.compile(rf"^{re.escape(_UUID_ATTRIBUTE)} in ({_LIST})$"),
    "nouse_uuids": re.compile(rf"^!\({re.escape(_UUID_ATTRIBUTE)} in ({_LIST})\)$"),
    "use_types": re.compile(rf"^({_LIST})\.exists\(t, {re.escape(_PRODUCT_MATCH)}\)$"),
    "nouse_types": re.compile(rf"^!({_LIST})\.exists\(t, {re.escape(_PRODUCT_MATCH)}\)$"),
}


def _parse_literal(literal: str) -> str:
    """The value of a CEL string literal as :func:`cel_string` writes it."""
    out: list[str] = []
    body = literal[1:-1]
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
        elif body[i + 1] in ('"', "\\"):
            out.append(body[i + 1])
            i += 2
        elif body[i + 1] == "u":
            out.append(chr(int(body[i + 2 : i + 6], 16)))
            i += 6
        else:  # "U"
            out.append(chr(int(body[i + 2 : i + 10], 16)))
            i += 10
    return "".join(out)


def selection_from_cel(expressions: list[str]) -> tuple[Selection, list[str]]:
    """The Selection that :meth:`Selection.cel` wrote as ``expressions``, and the expressions that
    are not of its forms (a user's own CEL), which the caller must judge on its own."""
    found: dict[str, tuple[str, ...]] = {}
    others: list[str] = []
    for expression in expressions:
        for field_name, form in _FORMS.items():
            match = form.match(expression)
            if match and field_name not in found:
                found[field_name] = tuple(_parse_literal(m) for m in re.findall(_LITERAL, match.group(1)))
                break
        else:
            others.append(expression)
    return Selection(**found), others
