"""Every command in the docs' shell blocks runs as written, or at least as far as can be checked here.

Each fenced block names its language; ``sh``, ``bash``, ``shell`` and ``console`` blocks are commands,
and so is an inline code span in the prose that starts with ``kubectl``, ``helm``, ``make`` or one of
Tessera's programs. Every command is checked by what it runs:

- ``helm install``/``upgrade``/``template``/``lint`` of the repository's chart are run as ``helm
  template``/``helm lint`` (rendering needs no cluster), with a values file the page shows in a
  ``yaml`` block whose first line is ``# <file name>``;
- every other ``helm`` and ``kubectl`` command is checked against the program's ``--help``: the
  subcommand exists and every flag is one it takes; files given with ``-f`` exist;
- Tessera's own programs (``.venv/bin/tessera-*``) the same, against their ``--help``;
- ``make`` targets exist in the Makefile; scripts, test paths and Dockerfile stages exist (``docker``
  and ``buildah`` builds alike);
- ``grep`` and ``curl`` flags are checked against their ``--help``.

A program with no checker here fails the test: add one. ``<...>`` in a command is a placeholder
for the reader to fill in.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from testbed.binaries import binary
from tests.chart_helm import CHART, helm, kube_version
from tests.unit.docs.docs_pages import REPO, Fence, fences_of, page_id, pages, split

SHELL = {"sh", "bash", "shell", "console"}
PLACEHOLDER = re.compile(r"<([A-Za-z][A-Za-z0-9 _.-]*)>")
VENV_BIN = Path(sys.executable).parent
OPTIONAL_APIS = ("kueue.x-k8s.io/v1beta2", "monitoring.coreos.com/v1", "cert-manager.io/v1")


@dataclass(frozen=True)
class Command:
    fence: Fence
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{page_id(self.fence.page)}:{self.fence.line}: {shlex.join(self.argv)}"


def commands_of(fence: Fence) -> Iterator[Command]:
    """Each simple command of a shell block (pipelines and lists split, comments dropped)."""
    text = re.sub(r"\\\n", " ", fence.body)
    if fence.language == "console":
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ "))
    for line in text.splitlines():
        # Placeholders would read as redirections: keep them as words.
        line = PLACEHOLDER.sub(lambda m: "PLACEHOLDER_" + re.sub(r"\W", "_", m.group(1)), line)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in (";", "&&", "||", "|", "&"):
                while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                    words.pop(0)  # VAR=value before a command
                if words and words[0] == "sudo":
                    words.pop(0)
                if words:
                    yield Command(fence, tuple(words))
                words = []
            else:
                words.append(token)


def all_fences() -> list[Fence]:
    return [fence for page in pages() for fence in fences_of(page)]


INLINE = re.compile(r"`((?:kubectl|helm|make|\.venv/bin/[a-z-]+|tessera-[a-z-]+) [^`\n]+)`")
"""An inline code span in the prose that is a command of a program the docs tests know."""


def inline_commands(page: Path) -> list[Command]:
    prose, _ = split(page.read_text())
    out: list[Command] = []
    for match in INLINE.finditer(prose):
        line = prose.count("\n", 0, match.start()) + 1
        out += commands_of(Fence(page, line, "inline", match.group(1)))
    return out


def all_commands() -> list[Command]:
    blocks = [c for f in all_fences() if f.language in SHELL for c in commands_of(f)]
    return blocks + [c for page in pages() for c in inline_commands(page)]


# ---------------------------------------------------------------------------------------------------
# Flags from --help


def help_flags(text: str) -> set[str]:
    """Every long and short flag a --help text names."""
    flags = set(re.findall(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9-]*)", text))
    flags |= set(re.findall(r"(?<![\w-])(-[A-Za-z0-9])(?=[,\s=\[])", text))
    return flags


def used_flags(words: tuple[str, ...]) -> list[str]:
    out = []
    for word in words:
        if word == "--":
            break
        if word.startswith("--") and len(word) > 2:
            out.append(word.split("=", 1)[0])
        elif re.fullmatch(r"-[A-Za-z0-9]+(=.*)?", word):
            out.extend(f"-{c}" for c in word[1:].split("=", 1)[0])
    return out


def check_flags(command: Command, words: tuple[str, ...], allowed: set[str]) -> None:
    unknown = [f for f in used_flags(words) if f not in allowed]
    assert not unknown, f"{command}: {unknown} not in the program's --help"


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    return result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------------
# Checkers, by program


def positionals(words: tuple[str, ...], takes_value: set[str]) -> list[str]:
    """The words that are not flags or flag values (``takes_value``: flags whose value is the next word)."""
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = "=" not in word and word in takes_value
        else:
            out.append(word)
    return out


@cache
def _kubectl() -> Path:
    try:
        return binary("kubectl")
    except FileNotFoundError as error:
        pytest.skip(f"kubectl is not built here ({error})")


@cache
def _kubectl_help(path: tuple[str, ...]) -> str:
    return _run([str(_kubectl()), *path, "--help"])


@cache
def _kubectl_global_flags() -> set[str]:
    return help_flags(_run([str(_kubectl()), "options"]))


@cache
def _plugin_help(sub: tuple[str, ...]) -> str:
    """``kubectl tessera``'s help, from the module its command runs (the shared venv may not have
    this tree's console scripts)."""
    result = subprocess.run(
        [sys.executable, "-m", "tessera.kubectl.cli", *sub, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.stdout + result.stderr


def check_kubectl_plugin(command: Command) -> None:
    """``kubectl tessera ...``: Tessera's own plugin, checked against its --help as kubectl would
    run it (``kubectl-tessera`` with the words after ``tessera``)."""
    words = command.argv[2:]
    sub = tuple(positionals(words, {"-n", "--namespace", "-o", "--output", "--context", "--kubeconfig"})[:1])
    text = _plugin_help(sub)
    assert "usage:" in text, f"{command}: kubectl tessera {shlex.join(sub)} --help failed:\n{text}"
    check_flags(command, words, help_flags(text))


def check_kubectl(command: Command, home: Path) -> None:
    words = command.argv[1:]
    path = tuple(w for w in positionals(words, {"-n", "--namespace", "-o", "-f", "-l", "-c"})[:2])
    if path[:1] == ("tessera",):
        check_kubectl_plugin(command)
        return
    text = _kubectl_help(path[:1])
    if len(path) == 2 and re.search(rf"^\s+{re.escape(path[1])}\s", text, re.M):
        text = _kubectl_help(path)  # a subcommand, like "rollout status"
    assert "Usage:" in text, f"{command}: kubectl has no command {path[:1]}"
    check_flags(command, words, help_flags(text) | _kubectl_global_flags())
    for i, word in enumerate(words):
        if word in ("-f", "--filename") and i + 1 < len(words):
            assert (REPO / words[i + 1]).exists(), f"{command}: {words[i + 1]} does not exist"


@cache
def _helm_help(sub: str, home: Path) -> str:
    result = helm(home, sub, "--help", check=False)
    return result.stdout + result.stderr


def _values_file(command: Command, name: str, home: Path) -> Path:
    """A values file the same page shows as a yaml block starting ``# name``."""
    if (REPO / name).exists():
        return REPO / name
    for fence in fences_of(command.fence.page):
        if fence.language in ("yaml", "yml") and fence.body.lstrip().startswith(f"# {name}\n"):
            path = home / name
            path.write_text(fence.body)
            return path
    raise AssertionError(f"{command}: {name} is neither in the repository nor a '# {name}' yaml block")


def check_helm(command: Command, home: Path) -> None:
    words = command.argv[1:]
    sub = words[0]
    text = _helm_help(sub, home)
    assert "Usage:" in text, f"{command}: helm has no command {sub}"
    check_flags(command, words, help_flags(text))
    args = positionals(words[1:], {"-n", "--namespace", "-f", "--values", "--set", "--version", "--timeout"})
    if sub not in ("install", "upgrade", "template", "lint"):
        return
    chart = args[-1] if args else ""
    if not (REPO / chart).resolve().is_relative_to(CHART):
        return
    rendered = [w if w != chart else str(CHART) for w in words[1:]]
    for i, word in enumerate(rendered[:-1]):
        if word in ("-f", "--values"):
            rendered[i + 1] = str(_values_file(command, rendered[i + 1], home))
    if sub == "lint":
        result = helm(home, "lint", *rendered, check=False)
    else:
        # As a cluster with the optional APIs the chart can use (Kueue, the Prometheus Operator).
        extra = ["--kube-version", kube_version(), *(f"--api-versions={api}" for api in OPTIONAL_APIS)]
        rendered = [
            w for w in rendered if w not in ("--create-namespace", "--wait", "--atomic", "--install", "-i")
        ]
        result = helm(home, "template", *rendered, *extra, check=False)
    assert result.returncode == 0, f"{command}: helm {sub} as helm template failed:\n{result.stderr}"


@cache
def _own_help(program: Path, sub: tuple[str, ...]) -> str:
    return _run([str(program), *sub, "--help"])


def check_own_program(command: Command, home: Path) -> None:
    name = Path(command.argv[0]).name
    program = VENV_BIN / name
    assert program.exists(), f"{command}: {name} is not a command of this project"
    sub = tuple(w for w in command.argv[1:2] if not w.startswith("-"))
    text = _own_help(program, sub)
    assert "usage:" in text, f"{command}: {shlex.join([name, *sub])} --help failed:\n{text}"
    check_flags(command, command.argv[1:], help_flags(text))


def check_python(command: Command, home: Path) -> None:
    words = command.argv[1:]
    if words[:1] != ("-m",):
        assert (REPO / words[0]).is_file(), f"{command}: {words[0]} does not exist"
        return
    module = words[1]
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)",
        ],
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, f"{command}: no module {module}"


def check_make(command: Command, home: Path) -> None:
    words = list(command.argv[1:])
    folder = REPO
    if words[:1] == ["-C"]:
        folder = REPO / words[1]
        words = words[2:]
    makefile = (folder / "Makefile").read_text()
    for target in words:
        if "=" in target:
            continue  # a variable
        assert re.search(rf"^{re.escape(target)}\s*:", makefile, re.M), f"{command}: no make target {target}"


def check_paths(command: Command, home: Path) -> None:
    for word in command.argv[1:]:
        if not word.startswith("-"):
            assert (REPO / word).exists(), f"{command}: {word} does not exist"


def check_docker(command: Command, home: Path) -> None:
    words = command.argv[1:]
    if words[0] != "build":
        assert words[0] == "push", f"{command}: only docker build and push are checked"
        return
    dockerfile = REPO / words[words.index("-f") + 1]
    assert dockerfile.exists(), f"{command}: {dockerfile} does not exist"
    target = words[words.index("--target") + 1]
    assert re.search(rf"^FROM .* AS {re.escape(target)}$", dockerfile.read_text(), re.M | re.I), (
        f"{command}: {dockerfile.name} has no stage {target}"
    )
    assert words[-1] == ".", f"{command}: the build context is the repository root"


def check_system_tool(command: Command, home: Path) -> None:
    program = shutil.which(command.argv[0])
    if program is None:
        pytest.skip(f"{command.argv[0]} is not installed here")
    text = _run([program, "--help", "all"] if command.argv[0] == "curl" else [program, "--help"])
    check_flags(command, command.argv[1:], help_flags(text))


CHECKERS: dict[str, Callable[[Command, Path], None]] = {
    "kubectl": check_kubectl,
    "helm": check_helm,
    ".venv/bin/python": check_python,
    "make": check_make,
    "bash": check_paths,
    ".venv/bin/pytest": check_paths,
    "docker": check_docker,
    "buildah": check_docker,
    "grep": check_system_tool,
    "curl": check_system_tool,
}


def checker(command: Command) -> Callable[[Command, Path], None]:
    program = command.argv[0]
    if re.fullmatch(r"(\.venv/bin/)?tessera-[a-z-]+", program):
        return check_own_program
    assert program in CHECKERS, f"{command}: no checker for {program}; add one to {Path(__file__).name}"
    return CHECKERS[program]


# ---------------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("fence", all_fences(), ids=lambda f: f"{page_id(f.page)}:{f.line}")
def test_every_fenced_block_names_its_language(fence: Fence) -> None:
    assert fence.language, (
        f"{page_id(fence.page)}:{fence.line}: say what the block is (sh for commands, text for output "
        "and pictures, yaml, ...), so that the command checks know which blocks are commands"
    )


@pytest.mark.parametrize("command", all_commands(), ids=str)
def test_every_command_runs_as_written(command: Command, tmp_path: Path) -> None:
    checker(command)(command, tmp_path)


def test_the_docs_have_commands_to_check() -> None:
    programs = {c.argv[0] for c in all_commands()}
    assert {"helm", "kubectl", "make"} <= programs, programs


def test_a_wrong_flag_or_target_is_caught(tmp_path: Path) -> None:
    fence = Fence(REPO / "docs" / "sample.md", 1, "sh", "")
    for line in (
        "make no-such-target",
        ".venv/bin/tessera-driver --no-such-flag",
        "helm install tessera charts/tessera --set kubeletPlugin.noSuchValue=1",
        "grep --no-such-flag x",
    ):
        (command,) = commands_of(Fence(fence.page, 1, "sh", line))
        with pytest.raises(AssertionError):
            checker(command)(command, tmp_path)


def test_commands_are_split_as_the_shell_would(tmp_path: Path) -> None:
    fence = Fence(REPO / "docs" / "sample.md", 1, "sh", "A=1 sudo make x && curl -s <url> | grep -e y # z\n")
    assert [c.argv for c in commands_of(fence)] == [
        ("make", "x"),
        ("curl", "-s", "PLACEHOLDER_url"),
        ("grep", "-e", "y"),
    ]
