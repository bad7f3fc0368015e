"""docs/troubleshooting.md quotes messages the code still emits.

The page quotes each message in a code span on a line that starts with ``>``, writing ``<...>`` for
whatever the program fills in. A quoted message passes when some message template in the sources —
a Python string or f-string (names of module constants filled in), or a C string literal — produces
it: the template's literal text must be there, in order, with nothing else between them but what the
template fills in. So a reworded or deleted message fails here, naming the quote to update.

And the other way round: every message a user meets — the webhook's denials, the node daemon's
prepare errors (pod events, the claim's Ready condition), the admission check's reasons, and what the
shim writes at warn and error level or stops a process with — must be quoted on the page, so a new
message fails here until the page explains it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "docs" / "troubleshooting.md"
PYTHON_SOURCES = ("tessera",)
C_SOURCES = ("tessera/shim/src", "tessera/shim/include")
SHIM_PREFIX = re.compile(r"^tessera-shim\[<pid>\]: (error|warn|info|debug): ")

HOLE = "\x00"
"""What a template fills in, in the template's text."""
QUOTE_HOLE = "\x01"
"""A ``<...>`` of the page, in the quote's text."""

PRINTF = re.compile(r"%[-#0 +]*(\d+|\*)?(\.(\d+|\*))?(hh|h|ll|l|z|j|t|L)?[sdiouxXfFgGcpr]")


def quoted_messages(text: str) -> list[str]:
    """Every code span on a ``>`` line of the page."""
    out = []
    for line in text.splitlines():
        if line.startswith(">"):
            out += re.findall(r"`([^`]+)`", line)
    return out


def _python_constants(tree: ast.Module) -> dict[str, str]:
    constants = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            constants[node.targets[0].id] = node.value.value
    return constants


def _python_files() -> Iterator[Path]:
    for folder in PYTHON_SOURCES:
        yield from (REPO / folder).rglob("*.py")


def _c_literals(source: str) -> Iterator[str]:
    """Adjacent C string literals joined (a macro between two, like PRIu64, is a hole)."""
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    literal = r'"(?:[^"\\\n]|\\.)*"'
    for match in re.finditer(rf"{literal}(?:\s*(?:[A-Za-z_][A-Za-z0-9_]*\s*)?{literal})*", source):
        pieces = re.split(rf"({literal})", match.group(0))
        text = ""
        for piece in pieces:
            if piece.startswith('"'):
                text += bytes(piece[1:-1], "utf-8").decode("unicode_escape")
            elif piece.strip():
                text += HOLE
        yield text.replace("%" + HOLE, HOLE)  # "%" PRIu64: one conversion


@cache
def templates() -> tuple[str, ...]:
    """Every message template of the sources, holes marked with HOLE."""
    trees = {path: ast.parse(path.read_text()) for path in _python_files()}
    constants: dict[str, str] = {}
    for tree in trees.values():
        constants.update(_python_constants(tree))
    out: list[str] = []
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.expr) and (text := _render(node, constants)) is not None:
                out.append(text)
    for folder in C_SOURCES:
        for path in sorted((REPO / folder).glob("*.[ch]")):
            out += _c_literals(path.read_text())
    holes = re.compile(HOLE + "+")
    out = [holes.sub(HOLE, PRINTF.sub(HOLE, t)).strip() for t in out]
    return tuple(t for t in out if len(t.replace(HOLE, "").strip()) >= 4)


def _literal(piece: str) -> str:
    """A template's literal text as a pattern; a ``<...>`` the template itself writes (a format
    description like ``<bytes|none>``) also matches the page's placeholder."""
    parts = re.split(r"(<[^<>]+>)", piece)
    return "".join(
        f"(?:{re.escape(p)}|{QUOTE_HOLE})" if p.startswith("<") else re.escape(p) for p in parts if p
    )


@cache
def _pattern(template: str) -> re.Pattern[str]:
    return re.compile(".+?".join(_literal(piece) for piece in template.split(HOLE)), re.S)


def produced_by_some_template(quote: str) -> bool:
    text = re.sub(r"<[^<>]+>", QUOTE_HOLE, quote)
    for template in templates():
        longest = re.sub(r"<[^<>]+>", QUOTE_HOLE, max(template.split(HOLE), key=len))
        if longest.split(QUOTE_HOLE)[0] in text and _pattern(template).fullmatch(text):
            return True
    return False


# ---------------------------------------------------------------------------------------------------
# The other way round: every message a user meets is on the page

USER_FACING_EXCEPTIONS = {
    "Refusal",  # the webhook's denials (and the admission check's Rejected reasons)
    "AnnotationError",
    "AllocationError",  # the node daemon's prepare errors: pod events and the claim's Ready condition
    "ClaimNotFound",
    "DriverSourceError",
    "Undecidable",  # the admission check's waiting reasons
}
C_CALLS = re.compile(
    r"\b(SHIM_WARN|SHIM_ERROR|stop_process|tessera_fail)\(\s*(?:err\s*,\s*errlen\s*,\s*)?"
    r'("(?:[^"\\\n]|\\.)*"(?:\s*(?:[A-Za-z_]\w*\s*)?"(?:[^"\\\n]|\\.)*")*)'
)
NOT_FOR_USERS = {
    # The limits-file writer's checks (tessera_limits_format): on what the driver writes, never on
    # a file a user could hand the shim.
    "buffer too small",
    f"GPU {HOLE}: '{HOLE}' is not a GPU UUID",
    f"GPU {HOLE}: cores must be 0-100",
    f"GPU {HOLE} listed twice",
    f"more than {HOLE} GPUs",
    "out of memory",
}
NOT_FOR_USERS_C = {"region_read.c"}
"""C files whose tessera_fail reasons no user meets: the exporter's reader of usage regions, whose
errors count as the claim's region scrape error."""


def _render(node: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    text = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            text += str(part.value)
        elif (
            isinstance(part, ast.FormattedValue)
            and isinstance(part.value, ast.Name)
            and part.value.id in constants
            and part.conversion == -1
        ):
            text += constants[part.value.id]
        else:
            text += HOLE
    return text


def user_facing_messages() -> list[tuple[str, str]]:
    """(file, template) of every message a user of the webhook, the node daemon, the admission check
    or the shim meets: what the webhook denies with, what a prepare fails with, what the admission
    check tells a Workload, and what the shim writes at warn and error level or stops a process with."""
    trees = {path: ast.parse(path.read_text()) for path in _python_files()}
    constants: dict[str, str] = {}
    for tree in trees.values():
        constants.update(_python_constants(tree))
    found: list[tuple[str, str | None]] = []
    for path, tree in trees.items():
        where = str(path.relative_to(REPO))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", "")
                if name in USER_FACING_EXCEPTIONS:
                    found.append((where, _render(node.args[0], constants)))
                elif name == "Decision" and len(node.args) > 1 and path.parent.name == "admissioncheck":
                    found.append((where, _render(node.args[1], constants)))
                elif name in ("_failed", "deny") and len(node.args) > 1:
                    found.append((where, _render(node.args[-1], constants)))
            elif (
                isinstance(node, ast.Assign)
                and path.parent.name == "webhook"
                and any(isinstance(t, ast.Name) and t.id == "message" for t in node.targets)
            ):
                found.append((where, _render(node.value, constants)))
    for folder in C_SOURCES:
        for path in sorted((REPO / folder).glob("*.c")):
            if path.name in NOT_FOR_USERS_C:
                continue
            source = re.sub(r"/\*.*?\*/", " ", path.read_text(), flags=re.S)
            for match in C_CALLS.finditer(source):
                found += [(str(path.relative_to(REPO)), t) for t in _c_literals(match.group(2))]
    holes = re.compile(HOLE + "+")
    out = []
    for where, template in found:
        if template is None:
            continue
        template = holes.sub(HOLE, PRINTF.sub(HOLE, template)).strip()
        if template.replace(HOLE, "").strip() and template not in NOT_FOR_USERS:
            out.append((where, template))
    return out


def undocumented(page_text: str) -> list[str]:
    """The user-facing messages that no quote of ``page_text`` stands for."""
    quotes = [re.sub(r"<[^<>]+>", QUOTE_HOLE, SHIM_PREFIX.sub("", q)) for q in quoted_messages(page_text)]
    return [
        f"{where}: {template.replace(HOLE, '<...>')}"
        for where, template in user_facing_messages()
        if not any(_pattern(template).fullmatch(q) for q in quotes)
    ]


def test_every_message_a_user_meets_is_on_the_page() -> None:
    assert len(user_facing_messages()) >= 40
    missing = undocumented(PAGE.read_text())
    assert not missing, (
        f"messages users meet that {PAGE.name} does not explain; quote each (in a `code span` on a `>` "
        "line, <...> for what the program fills in) and say what it means and what to do:\n"
        + "\n".join(missing)
    )


def test_a_message_left_off_the_page_is_caught() -> None:
    quote = '> `container "<name>": nvidia.com/gpucores is <n>; it must be between 1 and 100.`\n'
    page = PAGE.read_text()
    assert quote in page
    assert undocumented(page.replace(quote, "")) == [
        "tessera/gpu_request.py: <...>: nvidia.com/gpucores is <...>; it must be between 1 and 100."
    ]


def test_the_page_quotes_messages() -> None:
    assert len(quoted_messages(PAGE.read_text())) >= 20


@pytest.mark.parametrize("quote", quoted_messages(PAGE.read_text()))
def test_each_quoted_message_is_still_emitted(quote: str) -> None:
    message = SHIM_PREFIX.sub("", quote)
    if message != quote:  # the shim's log prefix, which shim/src/log.c writes before every line
        assert f"tessera-shim[{HOLE}]: {HOLE}:" in templates()
    assert produced_by_some_template(quote) or produced_by_some_template(message), (
        f"{PAGE.name} quotes a message no source file produces any more: {quote!r}; "
        "update the quote (and what the page says about it) to the current wording"
    )


def test_a_reworded_message_is_caught() -> None:
    assert produced_by_some_template(
        'container "<name>": nvidia.com/gpucores is <n>; it must be between 1 and 100.'
    )
    assert not produced_by_some_template(
        'container "<name>": nvidia.com/gpucores is <n>; it must be between 0 and 100.'
    )
    assert not produced_by_some_template("<anything>")
