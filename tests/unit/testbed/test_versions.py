"""versions.env is the one source of pinned versions; malformed lines are rejected with their place."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import versions
from testbed.binaries import COMPONENTS


def test_every_component_version_is_pinned() -> None:
    """Each component the test bed builds has a v-prefixed version in versions.env."""
    pinned = versions.pinned_versions()
    for component in COMPONENTS.values():
        assert pinned[component.version_key].startswith("v"), f"{component.version_key} is not pinned"


def test_unknown_key_names_the_file() -> None:
    with pytest.raises(KeyError, match=r"NOPE_VERSION is not pinned in .*versions\.env"):
        versions.version_of("NOPE_VERSION")


def test_malformed_line_is_reported_with_its_line_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "versions.env"
    bad.write_text("# comment\nKUBERNETES_VERSION=v1.37.2\nthis is not an assignment\n")
    monkeypatch.setattr(versions, "VERSIONS_FILE", bad)
    versions.pinned_versions.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"versions.env:3: expected KEY=value"):
            versions.pinned_versions()
    finally:
        versions.pinned_versions.cache_clear()
