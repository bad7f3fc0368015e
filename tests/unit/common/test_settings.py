"""Flags with environment fallbacks: the variable a flag's help names is the one it reads, and a bad
value there stops the program at start, naming the variable."""

from __future__ import annotations

import argparse

import pytest

from tessera.settings import repeated, seconds, setting, switch


def parse(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str]) -> argparse.Namespace:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    p = argparse.ArgumentParser(prog="t")
    setting(p, "--port", "T_PORT", 8443, "a port", int)
    switch(p, "--watch", "T_WATCH", True, "watch or not")
    repeated(p, "--extra", "T_EXTRA", "extras", "X")
    return p.parse_args(argv)


def test_the_default_applies_without_flag_or_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse(monkeypatch, {}, [])
    assert (args.port, args.watch, args.extra) == (8443, True, [])


def test_the_variable_overrides_the_default_and_the_flag_overrides_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"T_PORT": "9443", "T_WATCH": "false", "T_EXTRA": "a, b"}
    assert vars(parse(monkeypatch, env, [])) == {"port": 9443, "watch": False, "extra": ["a", "b"]}
    args = parse(monkeypatch, env, ["--port=1", "--watch", "--extra=c"])
    assert (args.port, args.watch, args.extra) == (1, True, ["a", "b", "c"])


@pytest.mark.parametrize(("name", "value"), [("T_PORT", "eighty"), ("T_WATCH", "maybe")], ids=["int", "bool"])
def test_a_malformed_variable_stops_the_program_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, value: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse(monkeypatch, {name: value}, [])
    assert stopped.value.code == 2
    assert f"${name}='{value}' is not valid" in capsys.readouterr().err


def test_each_help_names_the_variable_the_flag_reads() -> None:
    p = argparse.ArgumentParser(prog="t")
    setting(p, "--port", "T_PORT", 8443, "a port", int)
    switch(p, "--watch", "T_WATCH", True, "watch or not")
    repeated(p, "--extra", "T_EXTRA", "extras", "X")
    helps = {a.dest: a.help for a in p._actions if a.dest != "help"}
    assert helps == {
        "port": "a port [env T_PORT]",
        "watch": "watch or not [env T_WATCH]",
        "extra": "extras; repeatable [env T_EXTRA, a,b]",
    }


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bound_in_seconds_that_could_never_pass_or_never_end_stops_the_program(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    p = argparse.ArgumentParser(prog="t")
    setting(p, "--wait", "T_WAIT", 30.0, "a bound", seconds)
    with pytest.raises(SystemExit):
        p.parse_args([f"--wait={value}"])
    assert "--wait" in capsys.readouterr().err
    monkeypatch.setenv("T_WAIT", value)
    with pytest.raises(SystemExit):
        setting(argparse.ArgumentParser(prog="t"), "--wait", "T_WAIT", 30.0, "a bound", seconds)
    assert f"$T_WAIT='{value}' is not valid" in capsys.readouterr().err
    monkeypatch.setenv("T_WAIT", "2.5")
    p = argparse.ArgumentParser(prog="t")
    setting(p, "--wait", "T_WAIT", 30.0, "a bound", seconds)
    assert p.parse_args([]).wait == 2.5
