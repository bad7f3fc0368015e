"""The use/nouse annotations become CEL selectors; no annotation value can change an expression,
and none makes one longer than the API takes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.gpu_request import AnnotationError, selection_for
from tessera.names import HAMI_NOUSE_TYPE, HAMI_NOUSE_UUID, HAMI_USE_TYPE, HAMI_USE_UUID
from tessera.selection_cel import cel_string, selection_cel

UUID_ATTR = 'device.attributes["gpu.tessera.dev"].uuid'
PRODUCT_ATTR = 'device.attributes["gpu.tessera.dev"].productName'

# A CEL double-quoted string literal: any escaped character or anything but a quote or backslash.
_LITERAL = re.compile(r'"(?:\\.|[^"\\])*"')


def selectors_for(annotations: dict[str, str]) -> list[str]:
    """The CEL the webhook writes for a pod with ``annotations``."""
    return selection_cel(selection_for(annotations))


def skeleton(expression: str) -> str:
    """The expression with every string literal replaced by S: what user input must not change."""
    return _LITERAL.sub("S", expression)


def unquote(literal: str) -> str:
    """Decode a literal produced by cel_string (the escapes it uses), to prove it round-trips."""
    body = literal[1:-1]
    return re.sub(
        r"\\(u[0-9a-f]{4}|U[0-9a-f]{8}|.)",
        lambda m: (
            chr(int(m.group(1)[1:], 16)) if m.group(1)[0] in "uU" and len(m.group(1)) > 1 else m.group(1)
        ),
        body,
    )


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({HAMI_USE_UUID: "GPU-a1,GPU-b2"}, [f'{UUID_ATTR} in ["GPU-a1", "GPU-b2"]']),
        ({HAMI_USE_UUID: " GPU-a1 , GPU-a1 "}, [f'{UUID_ATTR} in ["GPU-a1"]']),
        ({HAMI_NOUSE_UUID: "GPU-a1"}, [f'!({UUID_ATTR} in ["GPU-a1"])']),
        (
            {HAMI_USE_TYPE: "A100,H100"},
            [f'["a100", "h100"].exists(t, {PRODUCT_ATTR}.lowerAscii().contains(t))'],
        ),
        ({HAMI_NOUSE_TYPE: "T4"}, [f'!["t4"].exists(t, {PRODUCT_ATTR}.lowerAscii().contains(t))']),
        ({"other.example/annotation": "x"}, []),
    ],
)
def test_annotations_compile_to_the_documented_selectors(
    annotations: dict[str, str], expected: list[str]
) -> None:
    assert selectors_for(annotations) == expected


def test_all_four_annotations_together_give_four_selectors_in_a_fixed_order() -> None:
    expressions = selectors_for(
        {HAMI_NOUSE_TYPE: "t4", HAMI_USE_TYPE: "a100", HAMI_NOUSE_UUID: "GPU-x", HAMI_USE_UUID: "GPU-y"}
    )
    assert [e.split("(")[0][:12] for e in expressions] == [
        f"{UUID_ATTR}"[:12],
        "!",
        '["a100"].exi',
        '!["t4"].exis',
    ]


@pytest.mark.parametrize(
    ("annotation", "value", "phrase"),
    [
        (HAMI_USE_UUID, "", "names no value"),
        (HAMI_USE_UUID, " , ", "names no value"),
        (HAMI_USE_UUID, "GPU-a,,GPU-b", "empty entry"),
        (HAMI_NOUSE_UUID, 'GPU-a" || true', "not a GPU UUID"),
        (HAMI_USE_TYPE, "x" * 3000, "longer than"),
        (HAMI_NOUSE_TYPE, "a100,", "empty entry"),
    ],
)
def test_malformed_annotations_are_refused_with_the_annotation_named(
    annotation: str, value: str, phrase: str
) -> None:
    with pytest.raises(AnnotationError, match=re.escape(annotation)) as refused:
        selectors_for({annotation: value})
    assert phrase in str(refused.value)


@pytest.mark.parametrize(
    "hostile",
    [
        'a100") || true || ("',
        "a100\\",
        '\\"',
        "a100' + '",
        "x\n|| true",
        "}{][)(!&&||==",
        "ünïcode😀",
        "size(x) > 0 ? true : false",
    ],
)
def test_hostile_type_values_stay_inside_one_string_literal(hostile: str) -> None:
    [expression] = selectors_for({HAMI_USE_TYPE: hostile})
    assert skeleton(expression) == f"[S].exists(t, {skeleton(PRODUCT_ATTR)}.lowerAscii().contains(t))"
    user_literal = _LITERAL.findall(expression)[0]  # the attribute's driver name comes after it
    assert unquote(user_literal) == hostile.strip().lower()


@given(st.text(min_size=1, max_size=64).filter(lambda s: s.strip() and "," not in s))
def test_no_type_value_changes_the_shape_of_the_expression(value: str) -> None:
    try:
        [expression] = selectors_for({HAMI_NOUSE_TYPE: value})
    except AnnotationError:
        return  # lone surrogates are refused, never passed through
    assert skeleton(expression) == f"![S].exists(t, {skeleton(PRODUCT_ATTR)}.lowerAscii().contains(t))"
    assert expression.isascii()


@given(st.text(max_size=40))
def test_cel_string_round_trips_every_string_it_accepts(value: str) -> None:
    try:
        literal = cel_string(value)
    except AnnotationError:
        assert any(0xD800 <= ord(c) <= 0xDFFF for c in value)
        return
    assert _LITERAL.fullmatch(literal)
    assert unquote(literal) == value


def test_a_selection_whose_selector_would_pass_the_apis_bound_is_refused_in_one_sentence() -> None:
    """2048 characters outside the basic plane (within the annotation's own bound) escape to over
    20 000 characters of CEL; the API takes 10 KiB per expression."""
    with pytest.raises(AnnotationError) as refused:
        selectors_for({HAMI_USE_TYPE: "\U0001f600" * 2048})
    assert str(refused.value) == (
        "annotation nvidia.com/use-gputype makes a GPU selector of 20569 characters, more than the "
        "10240 the API takes; list fewer entries or fewer characters outside plain ASCII."
    )


def test_a_selector_up_to_the_apis_bound_is_kept_and_one_character_more_is_refused() -> None:
    """Each "é" is a six-character escape: the longest value kept makes an expression within six
    characters of the bound, and one more "é" is refused."""
    kept: list[str] = []
    count = 0
    while True:
        try:
            kept = selectors_for({HAMI_NOUSE_TYPE: "é" * (count + 1)})
        except AnnotationError as refused:
            assert str(refused).startswith(f"annotation {HAMI_NOUSE_TYPE} makes a GPU selector of ")
            break
        count += 1
    (expression,) = kept
    assert 10240 - 6 < len(expression) <= 10240
