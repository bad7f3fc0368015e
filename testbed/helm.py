"""Helm on charts/tessera, as the test bed runs it: the Go-built Helm with its caches kept in a folder
of the caller's own, rendering (no cluster) or talking to a local control plane. The chart's tests
(tests/chart_helm.py) and the demo both install through it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from testbed.binaries import binary, ensure_built

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "tessera"


class HelmError(AssertionError):
    """Helm exited non-zero; the message holds the command and its stderr."""


def helm(
    home: Path, *args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``helm args...`` with its cache, config and data under ``home`` (and ``kubeconfig``, if
    given); with ``check``, a non-zero exit raises :class:`HelmError` naming the command."""
    ensure_built("helm")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    env.pop("KUBECONFIG", None)
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    result = subprocess.run(
        [str(binary("helm")), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def values_file(home: Path, values: Mapping[str, Any], name: str = "values.yaml") -> Path:
    """``values`` written as a values file under ``home`` (for ``-f``)."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / name
    path.write_text(yaml.safe_dump(dict(values)))
    return path
