"""Running the pinned, Go-built kubectl against a test-bed cluster."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tessera.testbed.binaries import binary


def kubectl(
    kubeconfig: Path, *args: str, check: bool = True, capture: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run kubectl with the given kubeconfig. With check, a failure raises with kubectl's stderr."""
    result = subprocess.run(
        [str(binary("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        capture_output=capture,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} exited with {result.returncode}: {result.stderr}")
    return result
