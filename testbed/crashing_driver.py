"""The node daemon, made to kill itself at one step of its next prepare: for the crash tests.

``python -m testbed.crashing_driver STEP [daemon flags...]`` runs ``tessera-driver`` with
:meth:`DeviceState.reached` replaced by a SIGKILL at ``STEP`` (one of
:data:`tessera.driver.state.PREPARE_STEPS`). The switch lives here, in the test bed, so the product's
daemon has none to be flipped by its environment.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from tessera.driver import cli
from tessera.driver.state import PREPARE_STEPS, DeviceState

log = logging.getLogger(__name__)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in PREPARE_STEPS:
        print(f"usage: {sys.argv[0]} {{{','.join(PREPARE_STEPS)}}} [tessera-driver flags]", file=sys.stderr)
        return 2
    crash_at = sys.argv[1]

    def reached(self: DeviceState, step: str) -> None:
        if step == crash_at:
            log.warning("prepare reached %s: killing the daemon, as the crash test asks", step)
            os.kill(os.getpid(), signal.SIGKILL)

    DeviceState.reached = reached  # type: ignore[method-assign]
    return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
