"""Units and Kubernetes quantities: the one place they convert.

The API hands capacities back as quantity strings ("80Gi", "30", "1536Mi"); the driver, the webhook
and the tests need exact integers of bytes and percent, never floats.
"""

from __future__ import annotations

from decimal import Decimal

from kubernetes.utils import parse_quantity

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def quantity_to_int(value: str | int) -> int:
    """An integer quantity ("80Gi" -> 85899345920), refusing fractions (which no Tessera capacity
    allows) with ValueError."""
    if isinstance(value, int):
        return value
    parsed: Decimal = parse_quantity(value)  # type: ignore[no-untyped-call]
    if parsed != parsed.to_integral_value():
        raise ValueError(f"quantity {value!r} is not a whole number")
    return int(parsed)


def round_down(value: int, step: int) -> int:
    """``value`` rounded down to a multiple of ``step``."""
    return value - value % step
