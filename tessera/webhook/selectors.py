"""A pod's GPU selection (tessera/gpu_request.py reads it from the four HAMi annotations) compiled
into CEL selectors, with quoting done once here.

Annotation values are user input that ends up inside a CEL expression the scheduler evaluates; every
value becomes a CEL string literal through :func:`cel_string` and nothing else, so no value can add
an operator, close a string or call a function.
"""

from __future__ import annotations

from tessera.gpu_request import AnnotationError, Selection
from tessera.names import DRIVER_NAME, PRODUCT_ATTRIBUTE, UUID_ATTRIBUTE

_UUID_ATTRIBUTE = f'device.attributes["{DRIVER_NAME}"].{UUID_ATTRIBUTE}'
_PRODUCT_ATTRIBUTE = f'device.attributes["{DRIVER_NAME}"].{PRODUCT_ATTRIBUTE}'
_PRODUCT_MATCH = f"{_PRODUCT_ATTRIBUTE}.lowerAscii().contains(t)"


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


def _cel_list(entries: tuple[str, ...]) -> str:
    return "[" + ", ".join(cel_string(entry) for entry in entries) + "]"


def selection_cel(selection: Selection) -> list[str]:
    """CEL expressions, all of which a GPU must satisfy, that say what :meth:`Selection.matches` says.

    UUID lists match exactly; type lists match when an entry is part of the product name, ignoring
    case ("a100" matches "NVIDIA A100-SXM4-80GB"), as HAMi does."""
    expressions: list[str] = []
    if selection.use_uuids is not None:
        expressions.append(f"{_UUID_ATTRIBUTE} in {_cel_list(selection.use_uuids)}")
    if selection.nouse_uuids is not None:
        expressions.append(f"!({_UUID_ATTRIBUTE} in {_cel_list(selection.nouse_uuids)})")
    if selection.use_types is not None:
        expressions.append(f"{_cel_list(selection.use_types)}.exists(t, {_PRODUCT_MATCH})")
    if selection.nouse_types is not None:
        expressions.append(f"!{_cel_list(selection.nouse_types)}.exists(t, {_PRODUCT_MATCH})")
    return expressions
