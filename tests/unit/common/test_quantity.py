"""The one quantity parser: exact values in Kubernetes' grammar, and every input from outside bounded
before arithmetic, refused in one short sentence that never echoes a huge value back."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tessera.quantity import GiB, MiB, parse_quantity, quantity_to_int, quote


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * GiB),
        ("1536Mi", 1536 * MiB),
        ("30", 30),
        ("+30", 30),
        ("-5", -5),
        ("1.5Gi", 3 * GiB // 2),
        ("500m", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("1k", 1000),
        ("2M", 2_000_000),
        ("1E", 10**18),
        ("1e3", 1000),
        ("1E3", 1000),
        ("25e-1", Fraction(5, 2)),
        ("100n", Fraction(1, 10**7)),
        ("0007", 7),
        (42, 42),
    ],
)
def test_quantities_parse_to_their_exact_value(text: str | int, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


def test_the_largest_quantity_the_api_allows_parses() -> None:
    assert quantity_to_int("9223372036854775807") == 2**63 - 1
    assert quantity_to_int("7Ei") == 7 * 2**60


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("1e1000000", "has an exponent past ±30."),
        ("1e5000", "has an exponent past ±30."),
        ("1e4299", "has an exponent past ±30."),
        ("1e-31", "has an exponent past ±30."),
        ("Infinity", "is not a number."),
        ("-Infinity", "is not a number."),
        ("NaN", "is not a number."),
        ("inf", "is not a number."),
        ("1" + "0" * 10_000, "is longer than 64 characters."),
        ("9" * 60 + "Ei", "is larger than 9223372036854775807."),
        ("8Ei", "is larger than 9223372036854775807."),
        ("1e30", "is larger than 9223372036854775807."),
        ("", "is not a number."),
        ("Gi", "is not a number."),
        ("1ki", "is not a number."),
        ("1 Gi", "is not a number."),
        ("0x10", "is not a number."),
        ("1_000", "is not a number."),
        ("١٢", "is not a number."),  # digits of another script: Decimal takes them, the API does not
        (2**63, "is larger than 9223372036854775807."),
    ],
)
def test_what_is_not_a_bounded_quantity_is_refused_in_one_short_sentence(
    text: str | int, reason: str
) -> None:
    with pytest.raises(ValueError) as refused:
        parse_quantity(text)
    message = str(refused.value)
    assert message.startswith("quantity ") and message.endswith(reason)
    assert len(message) < 100 and message.count(". ") == 0


def test_a_caller_may_bound_the_magnitude_lower() -> None:
    assert quantity_to_int("100", limit=100) == 100
    with pytest.raises(ValueError, match=r'^quantity "101" is larger than 100\.$'):
        quantity_to_int("101", limit=100)
    with pytest.raises(ValueError, match="is larger than 100"):
        quantity_to_int(-101, limit=100)


@pytest.mark.parametrize("value", [1.5, None, [1], True])
def test_values_that_are_neither_strings_nor_integers_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"is a \w+, not a string or an integer\.$"):
        parse_quantity(value)  # type: ignore[arg-type]


def test_fractions_are_not_integer_quantities() -> None:
    with pytest.raises(ValueError, match=r'^quantity "1\.5" is not a whole number\.$'):
        quantity_to_int("1.5")


def test_quotes_cut_long_values_and_name_their_length() -> None:
    assert quote("80Gi") == '"80Gi"'
    assert quote("9" * 10_000) == '"' + "9" * 24 + '…" (10000 characters)'
