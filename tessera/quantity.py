"""Units and Kubernetes quantities: the one place they convert.

The API hands capacities back as quantity strings ("80Gi", "30", "1536Mi"); the driver, the webhook
and the tests need exact integers of bytes and percent, never floats.

Quantities come from outside (a pod's resources, a claim's capacity, a Job's template), so the parser
is bounded before it does any arithmetic: a string of at most ``MAX_LENGTH`` characters in the API's
grammar, an exponent of at most ``MAX_EXPONENT`` in magnitude, and a value of at most the caller's
limit (by default the API's own, 2^63 - 1). ``kubernetes.utils.parse_quantity`` has none of these:
``1e1000000`` kept a webhook replica's CPU busy for 40 s in Decimal arithmetic and ``1e5000`` raised
an error nobody expected. Messages quote at most ``QUOTE_LENGTH`` characters of what they refuse.
"""

from __future__ import annotations

import re
from fractions import Fraction

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

MAX_LENGTH = 64
"""Characters a quantity may have. 2^63 - 1 in plain digits is 19; the API's canonical forms are
shorter still, so 64 leaves room for signs, fractions and exponents without admitting a 4 KB number."""

MAX_EXPONENT = 30
"""Largest decimal exponent written with e/E (``1e30``). Anything larger is past 2^63 with any digit
but zero, so refusing it costs no valid quantity that matters and bounds the integer arithmetic."""

DEFAULT_LIMIT = (1 << 63) - 1
"""The API's own bound: no quantity may exceed 2^63 - 1 in magnitude (apimachinery's Quantity)."""

QUOTE_LENGTH = 24
"""Characters of a refused value a message repeats; longer values are cut and their length named."""

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

_GRAMMAR = re.compile(
    r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:\.(?P<fraction>[0-9]*))?"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))"
)
"""Kubernetes' quantity grammar (apimachinery resource.Quantity): a signed decimal number and a
binary suffix, a decimal exponent, or a decimal SI suffix."""


def quote(value: object) -> str:
    """``value`` for a message: in double quotes, cut to ``QUOTE_LENGTH`` characters with its full
    length named when longer, so a refusal never echoes a huge input back."""
    text = str(value)
    if len(text) <= QUOTE_LENGTH:
        return f'"{text}"'
    return f'"{text[:QUOTE_LENGTH]}…" ({len(text)} characters)'


def parse_quantity(value: str | int, limit: int = DEFAULT_LIMIT) -> Fraction:
    """The exact value of a Kubernetes quantity (``"1.5Gi"`` -> 1610612736); raises ValueError with
    one short sentence for anything that is not a quantity, is longer than ``MAX_LENGTH``, has an
    exponent past ``MAX_EXPONENT`` or a magnitude past ``limit``. Checks length and grammar before
    any arithmetic, and the arithmetic is on small integers only."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"quantity {quote(value)} is a {type(value).__name__}, not a string or an integer.")
    if isinstance(value, int):
        if abs(value) > limit:
            raise ValueError(f"quantity {quote(value)} is larger than {limit}.")
        return Fraction(value)
    if len(value) > MAX_LENGTH:
        raise ValueError(f"quantity {quote(value)} is longer than {MAX_LENGTH} characters.")
    match = _GRAMMAR.fullmatch(value)
    whole, fraction = (match.group("whole"), match.group("fraction") or "") if match else ("", "")
    if match is None or not (whole or fraction):
        raise ValueError(f"quantity {quote(value)} is not a number.")
    if match.group("binary"):
        scale = Fraction(1 << (10 * _BINARY[match.group("binary")]))
    else:
        exponent = match.group("exponent")
        power = int(exponent) if exponent is not None else _DECIMAL[match.group("decimal") or ""]
        if abs(power) > MAX_EXPONENT:
            raise ValueError(f"quantity {quote(value)} has an exponent past ±{MAX_EXPONENT}.")
        scale = Fraction(10) ** power
    digits = (whole + fraction).lstrip("0") or "0"
    mantissa = Fraction(int(digits), 10 ** len(fraction))
    parsed = mantissa * scale * (-1 if match.group("sign") == "-" else 1)
    if abs(parsed) > limit:
        raise ValueError(f"quantity {quote(value)} is larger than {limit}.")
    return parsed


def quantity_to_int(value: str | int, limit: int = DEFAULT_LIMIT) -> int:
    """An integer quantity ("80Gi" -> 85899345920), bounded as :func:`parse_quantity` is, refusing
    fractions (which no Tessera capacity allows) with ValueError."""
    parsed = parse_quantity(value, limit)
    if parsed.denominator != 1:
        raise ValueError(f"quantity {quote(value)} is not a whole number.")
    return int(parsed)


def round_down(value: int, step: int) -> int:
    """``value`` rounded down to a multiple of ``step``."""
    return value - value % step
