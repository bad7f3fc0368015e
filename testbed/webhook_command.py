"""The command line of a ``tessera-webhook`` serving on loopback, as the test bed and the benchmarks
start it outside the cluster: one spelling, so a flag the daemon renames breaks every caller alike."""

from __future__ import annotations

import sys
from pathlib import Path


def loopback_webhook_command(
    kubeconfig: str | Path,
    port: int,
    metrics_port: int,
    configuration: str,
    client_ca: Path,
    *extra: str,
) -> list[str]:
    """``tessera-webhook`` of this virtual environment on 127.0.0.1:``port``, its certificate for
    127.0.0.1, keeping the CA of the webhook configuration ``configuration`` up to date and accepting
    only clients signed by ``client_ca``; ``extra`` flags follow. No probe port (several replicas
    share the loopback address; the callers probe the metrics port) unless ``extra`` gives one."""
    return [
        str(Path(sys.executable).parent / "tessera-webhook"),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--port={port}",
        f"--metrics-port={metrics_port}",
        "--probe-port=-1",
        "--ip-addresses=127.0.0.1",
        f"--webhook-configuration={configuration}",
        f"--client-ca-file={client_ca}",
        *extra,
    ]
