"""versions.env is the one source of pinned versions; malformed lines are rejected with their place."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.testbed import versions


def test_every_component_version_is_pinned() -> None:
    pinned = versions.pinned_versions()
    for key in ("KUBERNETES_VERSION", "ETCD_VERSION", "HELM_VERSION"):
        assert pinned[key].startswith("v"), f"{key} should be a v-prefixed version"


def test_unknown_key_names_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
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
