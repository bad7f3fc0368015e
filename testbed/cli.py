"""`tessera-cluster`: the test bed by hand — a control plane on loopback, optionally with real nodes.

tessera-cluster up [--nodes N] [--kueue] [--state-dir DIR]   run until SIGINT/SIGTERM, then clean up
tessera-cluster build                              build every pinned binary into the cache
tessera-cluster sweep                              clean real nodes left behind by killed runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from testbed.binaries import ensure_built
from testbed.cluster import LocalCluster
from testbed.interrupts import interrupt_on_sigterm
from testbed.node import RealNode, running_nodes
from testbed.node_runtime import sweep_stale_nodes


def node_summary(node: RealNode) -> str:
    """One JSON line per node: where its DRA plugin sockets and CDI specs go, and what it costs."""
    return json.dumps(
        {
            "node": node.name,
            "address": node.address,
            "started_in_s": round(node.startup_seconds, 1),
            "rss_mib": round(node.rss_bytes() / 2**20),
            "crictl_config": str(node.paths.crictl_config),
            "cdi_dir": str(node.paths.cdi_dir),
            "plugins_registry": str(node.paths.plugins_registry),
            "plugins_dir": str(node.paths.plugins_dir),
            "logs": str(node.paths.log_dir),
        }
    )


def up(state_dir: Path | None, nodes: int, kueue: bool = False) -> None:
    """Start everything, print how to reach it, and wait; Ctrl-C or SIGTERM, even during start-up,
    unwinds through the context managers, which stop and clean up whatever was started."""
    with LocalCluster(state_dir, kueue=kueue) as cluster, running_nodes(cluster, nodes) as started:
        print(f"export KUBECONFIG={cluster.admin_kubeconfig}", flush=True)
        for node in started:
            print(node_summary(node), flush=True)
        while True:
            signal.pause()


def _validate_up(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what would fail later, less clearly, or silently do the wrong thing."""
    if args.nodes < 0:
        parser.error(f"--nodes must be 0 or more, not {args.nodes}")
    if args.nodes > 0 and os.geteuid() != 0:
        parser.error("real nodes (--nodes) need root: they create bridges, cgroups and mounts")
    if args.state_dir is not None and args.state_dir.exists() and any(args.state_dir.iterdir()):
        parser.error(f"--state-dir {args.state_dir} is not empty; give a new or empty folder")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera-cluster",
        description="Run Tessera's test bed by hand: a Kubernetes control plane on loopback, "
        "optionally with real nodes (kubelet + containerd + runc; needs root).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser(
        "up", help="start, print KUBECONFIG (and each node's paths), run until SIGINT/SIGTERM"
    )
    up_parser.add_argument(
        "--state-dir",
        type=Path,
        help="new or empty folder for certs, etcd data, kubeconfig and logs; kept at exit "
        "(default: a new temporary folder, removed at exit)",
    )
    up_parser.add_argument("--nodes", type=int, default=0, help="real nodes to start (default: 0)")
    up_parser.add_argument(
        "--kueue",
        action="store_true",
        help="also install Kueue (CRDs, webhooks on loopback) and run its controller",
    )
    sub.add_parser("build", help="build every pinned binary into the cache (no-op when cached)")
    sub.add_parser("sweep", help="clean real nodes left behind by killed runs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    if args.command == "build":
        ensure_built()
    elif args.command == "sweep":
        print("\n".join(sweep_stale_nodes()) or "nothing to clean")
    else:
        _validate_up(parser, args)
        if args.state_dir is not None:
            args.state_dir.mkdir(parents=True, exist_ok=True)
        interrupt_on_sigterm()
        with contextlib.suppress(KeyboardInterrupt):
            up(args.state_dir, args.nodes, args.kueue)
    return 0


if __name__ == "__main__":
    sys.exit(main())
