"""``kubectl-tessera`` (run as ``kubectl tessera``): flags, the kubeconfig as kubectl reads it, and
the four read-only commands, ``gpus``, ``pods``, ``why POD`` and ``queue`` (docs/kubectl-tessera.md).

A one-shot command, unlike the daemons: it reads, prints and exits (0 when it could say what it was
asked, 1 with one line on stderr when it could not, 2 for flags that make no sense), so it does not
run on the daemons' skeleton (tessera/command.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client, config
from kubernetes.client import ApiException
from kubernetes.config import ConfigException
from urllib3.exceptions import HTTPError

from tessera.kube import api_client, raw_json
from tessera.kubectl import queue, render, snapshot, usage, views, why
from tessera.kubectl.text import as_json, as_yaml, clean

PROG = "kubectl tessera"


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)"
    )
    common.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    common.add_argument(
        "-n", "--namespace", help="namespace of pods and claims (default: the context's, else 'default')"
    )
    common.add_argument(
        "-A", "--all-namespaces", action="store_true", help="pods and claims of every namespace"
    )
    common.add_argument("-o", "--output", choices=("json", "yaml"), help="print the data instead of a table")
    common.add_argument(
        "--no-usage",
        action="store_true",
        help="do not ask the exporters for live figures (through the API server's pod proxy)",
    )
    common.add_argument(
        "--exporter-namespace",
        help="the namespace of Tessera's release, where its exporters run (default: the one Helm "
        "recorded on the DeviceClass gpu.tessera.dev); exporters are read there only",
    )
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Tessera's fractional GPUs: who has which share of which GPU, and why a pod waits. "
        "Read-only; uses the same kubeconfig, context and namespace as kubectl. Flags follow the "
        "command: kubectl tessera pods -A.",
    )
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "gpus",
        parents=[common],
        help="every GPU per node: product, memory and cores allocated and in use, shares, taints, "
        "cordons, MIG instances",
    )
    commands.add_parser(
        "pods",
        parents=[common],
        help="each GPU share of the namespace's pods (-A: all): its GPU, limits and live usage",
    )
    why_command = commands.add_parser(
        "why",
        parents=[common],
        help="why a pod with Tessera claims waits: each GPU judged against what its claims ask",
    )
    why_command.add_argument("pod", metavar="POD", help="the pod's name, in the namespace of -n")
    commands.add_parser(
        "queue", parents=[common], help="Kueue Workloads the GPU fit check holds, with its reason"
    )
    return p


def kubeconfig_path(args: argparse.Namespace) -> str | None:
    """The kubeconfig as kubectl picks it: --kubeconfig, else $KUBECONFIG (a list of files),
    else ~/.kube/config when it exists; None in a pod with no kubeconfig (its service account)."""
    if args.kubeconfig:
        return str(args.kubeconfig)
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    default = Path.home() / ".kube" / "config"
    return str(default) if default.exists() else None


def namespace_of(args: argparse.Namespace, path: str | None) -> str | None:
    """The namespace to read: None for -A, -n when given, else the context's own, else 'default'."""
    if args.all_namespaces:
        return None
    if args.namespace:
        return str(args.namespace)
    if path is None:
        return "default"
    contexts, current = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    chosen = next((c for c in contexts if c["name"] == args.context), current) if args.context else current
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def _print_data(data: Any, fmt: str, out: TextIO) -> None:
    out.write(as_json(data) + "\n" if fmt == "json" else as_yaml(data))


def _note_missing(found: snapshot.Snapshot, err: TextIO) -> None:
    for what in found.missing:
        err.write(f"note: {what} could not be read (forbidden, or not served by this cluster)\n")


def _live(api: client.ApiClient, args: argparse.Namespace, err: TextIO) -> usage.Usage:
    """The exporters' figures; a note when it is not known where they run."""
    figures = usage.scrape(api, args.exporter_namespace)
    if figures.namespace is None:
        err.write(
            "note: no live figures: the DeviceClass gpu.tessera.dev does not say which namespace "
            "Tessera's release is in; name it with --exporter-namespace\n"
        )
    return figures


def run_gpus(api: client.ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    found = snapshot.read(api, None, frozenset({"slices"}))
    _note_missing(found, err)
    rows = views.gpu_rows(found)
    migs = views.mig_rows(found)
    if not args.no_usage:
        usage.add_to_gpus(rows, _live(api, args, err))
    if args.output:
        _print_data({"gpus": rows, "migInstances": migs}, args.output, out)
    elif not rows and not migs:
        out.write("no Tessera GPU is published in this cluster\n")
    else:
        out.write((render.gpus_bars(rows, migs) if out.isatty() else render.gpus_columns(rows, migs)) + "\n")
    return 0


def run_pods(
    api: client.ApiClient, args: argparse.Namespace, namespace: str | None, out: TextIO, err: TextIO
) -> int:
    found = snapshot.read(api, namespace, frozenset({"slices"}))
    _note_missing(found, err)
    rows = views.share_rows(found, namespace)
    if not args.no_usage:
        usage.add_to_shares(rows, _live(api, args, err))
    if args.output:
        _print_data({"shares": rows}, args.output, out)
    elif not rows:
        where = "any namespace" if namespace is None else f"namespace {clean(namespace)}"
        out.write(f"no GPU share is allocated in {where}\n")
    else:
        out.write(render.pods_columns(rows) + "\n")
    return 0


def run_why(
    api: client.ApiClient, args: argparse.Namespace, namespace: str | None, out: TextIO, err: TextIO
) -> int:
    namespace = namespace or "default"
    try:
        pod = raw_json(client.CoreV1Api(api).read_namespaced_pod(args.pod, namespace, _preload_content=False))
    except ApiException as error:
        if error.status != 404:
            raise
        err.write(f"{PROG}: pod {clean(args.pod)} not found in namespace {clean(namespace)}\n")
        return 1
    found = snapshot.read(api, namespace, frozenset({"slices", "templates"}))
    _note_missing(found, err)
    data = why.as_data(why.judge(pod, found))
    if args.output:
        _print_data({"pod": f"{namespace}/{args.pod}", **data}, args.output, out)
    else:
        out.write(render.why_text(f"{namespace}/{args.pod}", data) + "\n")
    return 0


def run_queue(
    api: client.ApiClient, args: argparse.Namespace, namespace: str | None, out: TextIO, err: TextIO
) -> int:
    found = snapshot.read(api, namespace, frozenset({"workloads"}))
    if found.missing:
        _note_missing(found, err)
    rows = queue.held(found.workloads, queue.our_checks(found.admission_checks))
    if args.output:
        _print_data({"workloads": rows}, args.output, out)
    elif not rows:
        out.write("the GPU fit check holds no Workload\n")
    else:
        out.write(render.queue_columns(rows) + "\n")
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    args = parser().parse_args(argv)
    try:
        path = kubeconfig_path(args)
        namespace = namespace_of(args, path)
        api = api_client(Path(path) if path else None, context=args.context)
    except (ConfigException, RuntimeError, OSError) as error:
        err.write(f"{PROG}: no usable kubeconfig: {clean(error, limit=512)}\n")
        return 1
    try:
        if args.command == "gpus":
            return run_gpus(api, args, out, err)
        if args.command == "pods":
            return run_pods(api, args, namespace, out, err)
        if args.command == "why":
            return run_why(api, args, namespace, out, err)
        return run_queue(api, args, namespace, out, err)
    except ApiException as error:
        err.write(f"{PROG}: the API server answered {error.status} {clean(error.reason)}\n")
        return 1
    except HTTPError as error:
        err.write(f"{PROG}: the API server could not be reached: {clean(error, limit=512)}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
