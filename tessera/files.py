"""Writing a file so that a reader sees either the old content or the new, never half of either.

Limits files, simulated-driver configurations, node records and CDI specs are all read by other
processes (the shim, the simulator, the sweep, containerd) at moments the writer does not choose.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, mode: int = 0o644) -> Path:
    """Write `text` to a temporary file beside `path`, set `mode`, and rename it into place.

    The temporary name starts with a dot, which the kubelet's and containerd's directory watchers
    ignore. Returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
