"""Command-line flags that fall back to environment variables: the one place that pattern lives.

Every Tessera daemon can be configured by flags or, as a DaemonSet or Deployment usually is, by its
environment. Declaring both through one call keeps `--help` true: the variable a flag reads is the
variable its help names, and a malformed value in the environment stops the program at start with
the variable's name, as a malformed flag does.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def setting(
    parser: argparse.ArgumentParser,
    flag: str,
    env: str,
    default: Any,
    help: str,
    parse: Callable[[str], Any] = str,
    **kwargs: Any,
) -> None:
    """``flag`` taking one value (converted by ``parse``), default ``$env``, else ``default``."""
    raw = os.environ.get(env)
    value = default
    if raw is not None:
        try:
            value = parse(raw)
        except (ValueError, argparse.ArgumentTypeError) as error:
            parser.error(f"${env}={raw!r} is not valid: {error}")
    if parse is not str:
        kwargs.setdefault("type", parse)
    parser.add_argument(flag, default=value, help=f"{help} [env {env}]".lstrip(), **kwargs)


def seconds(text: str) -> float:
    """A duration in seconds, above 0 and finite: a bound that can never pass (0, a negative, NaN)
    would make every call fail at once, and an infinite one is no bound."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def switch(parser: argparse.ArgumentParser, flag: str, env: str, default: bool, help: str) -> None:
    """``flag`` / ``--no-...``, default ``$env`` (1/true/yes/on or 0/false/no/off), else ``default``."""
    raw = os.environ.get(env)
    value = default
    if raw is not None:
        if raw.lower() not in (*_TRUE, *_FALSE):
            parser.error(f"${env}={raw!r} is not valid: say true or false")
        value = raw.lower() in _TRUE
    parser.add_argument(
        flag, action=argparse.BooleanOptionalAction, default=value, help=f"{help} [env {env}]"
    )


def repeated(parser: argparse.ArgumentParser, flag: str, env: str, help: str, metavar: str) -> None:
    """``flag`` given any number of times; ``$env`` holds a comma-separated list of the same."""
    values = [item.strip() for item in os.environ.get(env, "").split(",") if item.strip()]
    parser.add_argument(
        flag, action="append", default=values, metavar=metavar, help=f"{help}; repeatable [env {env}, a,b]"
    )
