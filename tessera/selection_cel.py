"""A pod's GPU selection (tessera/gpu_request.py reads it from the four HAMi annotations) compiled
into CEL selectors, with quoting done once here.

In the shared core because both sides need the same text: the webhook writes these selectors into
the templates it makes, and the admission check trusts a template's recorded request only when the
template's selectors are exactly these (tessera/admissioncheck/podsets.py).

Annotation values are user input that ends up inside a CEL expression the scheduler evaluates; every
value becomes a CEL string literal through :func:`cel_string` and nothing else, so no value can add
an operator, close a string or call a function.

Escaping makes a literal up to ten times as long as its value (a character outside the basic
plane is a ten-character escape), so a value within the annotations' own bound can still make an
expression past the API's bound on a CEL selector; such a selection is refused here in one
sentence, before the API server would refuse the template with a generic error.
"""

from __future__ import annotations

from tessera.gpu_request import AnnotationError, Selection
from tessera.names import (
    DEVICE_CLASS,
    DRIVER_NAME,
    HAMI_NOUSE_TYPE,
    HAMI_NOUSE_UUID,
    HAMI_USE_TYPE,
    HAMI_USE_UUID,
    MEMORY_CAPACITY,
    PRODUCT_ATTRIBUTE,
    UUID_ATTRIBUTE,
)

CEL_EXPRESSION_MAX_LENGTH = 10 * 1024
"""The API's bound on one CEL selector expression (resource.k8s.io/v1, 10 KiB). It counts bytes;
every expression here is plain ASCII (:func:`cel_string` escapes the rest), so its length is its
size."""

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
    case ("a100" matches "NVIDIA A100-SXM4-80GB"), as HAMi does. AnnotationError when an expression
    would be longer than the API takes."""
    expressions: list[tuple[str, str]] = []
    if selection.use_uuids is not None:
        expressions.append((HAMI_USE_UUID, f"{_UUID_ATTRIBUTE} in {_cel_list(selection.use_uuids)}"))
    if selection.nouse_uuids is not None:
        expressions.append((HAMI_NOUSE_UUID, f"!({_UUID_ATTRIBUTE} in {_cel_list(selection.nouse_uuids)})"))
    if selection.use_types is not None:
        expressions.append((HAMI_USE_TYPE, f"{_cel_list(selection.use_types)}.exists(t, {_PRODUCT_MATCH})"))
    if selection.nouse_types is not None:
        listed = _cel_list(selection.nouse_types)
        expressions.append((HAMI_NOUSE_TYPE, f"!{listed}.exists(t, {_PRODUCT_MATCH})"))
    for annotation, expression in expressions:
        if len(expression) > CEL_EXPRESSION_MAX_LENGTH:
            raise AnnotationError(
                f"annotation {annotation} makes a GPU selector of {len(expression)} characters, more than "
                f"the {CEL_EXPRESSION_MAX_LENGTH} the API takes; list fewer entries or fewer characters "
                "outside plain ASCII."
            )
    return [expression for _, expression in expressions]


def size_selector(memory_bytes: int) -> str:
    """CEL matching GPUs whose published memory is exactly ``memory_bytes``."""
    return f'device.capacity["{DEVICE_CLASS}"].{MEMORY_CAPACITY}.compareTo(quantity("{memory_bytes}")) == 0'
