"""The pinned versions of the third-party programs the test bed runs, read from versions.env.

versions.env is the one place versions are written down; the shell build script sources it and this
module parses it, so the two can never disagree.
"""

from __future__ import annotations

import functools
from pathlib import Path

VERSIONS_FILE = Path(__file__).with_name("versions.env")


@functools.cache
def pinned_versions() -> dict[str, str]:
    """Return KEY -> value for every assignment in versions.env."""
    versions: dict[str, str] = {}
    for number, raw in enumerate(VERSIONS_FILE.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"{VERSIONS_FILE}:{number}: expected KEY=value, got {raw!r}")
        versions[key] = value
    return versions


def version_of(key: str) -> str:
    """Return the pinned version named KEY (for example KUBERNETES_VERSION)."""
    try:
        return pinned_versions()[key]
    except KeyError:
        raise KeyError(f"{key} is not pinned in {VERSIONS_FILE}") from None
