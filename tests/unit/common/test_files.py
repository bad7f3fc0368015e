"""write_atomically replaces a file whole, with the asked mode, and leaves no temporary behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.files import write_atomically


def test_replaces_the_file_whole_with_the_mode_asked(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "limits"
    write_atomically(target, "old\n")
    assert write_atomically(target, "new\n", mode=0o444) == target
    assert target.read_text() == "new\n"
    assert target.stat().st_mode & 0o777 == 0o444
    assert [p.name for p in target.parent.iterdir()] == ["limits"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "config"
    write_atomically(target, "old\n")
    with pytest.raises(TypeError):
        write_atomically(target, b"not text")  # type: ignore[arg-type]
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config"]
