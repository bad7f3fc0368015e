"""The Tessera demo: `make demo` (and its short CI form, `python -m demo --ci`).

On this machine, without a GPU: a local control plane with Kueue, two real nodes (containerd,
kubelet) with two simulated 80 GiB GPUs each, and Tessera installed with its Helm chart. Then a pod
written for HAMi, a native ResourceClaimTemplate pod and a gang Job in a Kueue queue run, and the
demo shows where each share landed, a memory limit biting while the neighbour on the same GPU is
unaffected, a compute cap holding, the Job waiting with the fit check's reason and then admitted,
and the metrics on each node's port 31995 (demo/story.py). Then it stops everything, unless --keep.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

from demo import story
from testbed.binaries import binary
from testbed.interrupts import interrupt_on_sigterm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the cluster up afterwards, until Ctrl-C or SIGTERM, for exploration",
    )
    parser.add_argument(
        "--ci", action="store_true", help="the short CI form: exit 1 unless every claim of the output holds"
    )
    args = parser.parse_args(argv)
    if args.ci and args.keep:
        parser.error("--ci stops everything at the end; --keep keeps it up")
    if os.geteuid() != 0:
        print("the demo runs real nodes (containerd, kubelet): run it as root", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    interrupt_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="tessera-demo-") as work, story.demo_bed(Path(work)) as bed:
        shown = story.run(bed)
        story.step("Checking each claim above against the figures read back")
        failed = 0
        for claim, holds in story.claims(shown):
            failed += not holds
            story.say(f"    {'ok    ' if holds else 'FAILED'} {claim}")
        if args.keep:
            story.step("The cluster stays up until Ctrl-C (or SIGTERM). In another shell:")
            story.say(f"    export KUBECONFIG={bed.cluster.admin_kubeconfig}")
            story.say(f"    {binary('kubectl')} get pods -A -o wide")
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    if failed:
        print(f"\n{failed} claim(s) did not hold", file=sys.stderr)
        return 1
    print("\nDone: everything the demo started is stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
