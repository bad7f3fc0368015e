"""Writing a file so that a reader sees either the old content or the new, never half of either.

Limits files, simulated-driver configurations, node records, CDI specs and the driver's checkpoint
are all read by other processes (the shim, the simulator, the sweep, containerd, the driver after a
restart) at moments the writer does not choose.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, mode: int = 0o644, durable: bool = False) -> Path:
    """Write `text` to a temporary file beside `path`, set `mode`, and rename it into place.

    The temporary name starts with a dot, which the kubelet's and containerd's directory watchers
    ignore. With `durable`, the file and the rename are flushed to disk before returning, so the
    new content survives a power loss or reboot, not only a killed process. Returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    if durable:
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return path
