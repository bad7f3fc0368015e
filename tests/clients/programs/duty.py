"""Keep the GPU busy through one of NVIDIA's Python CUDA clients, as ``shim_probe duty`` does
through the driver API, and report the share of wall time its kernels took.

    python duty.py LIBRARY KERNEL_NS SECONDS DEPTH

LIBRARY: cuda.core (a kernel compiled with NVRTC by cuda.core's Program, run by cuda.core's
``launch``) or numba (a ``@cuda.jit`` kernel). KERNEL_NS: how long one kernel takes on the GPU
(the simulated node's ``default_kernel_ns``: the kernel is empty, so on the simulator its duration
is the node's). Up to DEPTH kernels are queued at once on a stream of the program's own, each
followed by an event the program waits on DEPTH launches later, for SECONDS.

Prints ``launched= elapsed_ns= share= run_delay_ns=`` (the keys ``shim_probe duty`` prints):
share is launched x KERNEL_NS over the elapsed wall time, in percent; run_delay_ns the time the
launching thread was runnable but waiting for a CPU meanwhile (what a busy machine can have cost
it).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def run_delay_ns() -> int:
    """The second field of /proc/thread-self/schedstat: ns runnable but waiting for a CPU."""
    with open("/proc/thread-self/schedstat") as schedstat:
        return int(schedstat.read().split()[1])


@dataclass(frozen=True)
class Launcher:
    """One library's way to launch the kernel on a stream of the program's own, record an event
    after it, wait for such an event, and wait for the stream."""

    launch: Callable[[], object]
    record: Callable[[], Any]
    wait: Callable[[Any], object]
    synchronize: Callable[[], object]


def core_launcher() -> Launcher:
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    program = Program(
        'extern "C" __global__ void tessera_duty() {}',
        code_type="c++",
        options=ProgramOptions(arch=f"sm_{device.arch}"),
    )
    kernel = program.compile("ptx").get_kernel("tessera_duty")
    config = LaunchConfig(grid=1, block=1)
    return Launcher(
        lambda: launch(stream, config, kernel), stream.record, lambda event: event.sync(), stream.sync
    )


def tessera_duty() -> None:
    """The kernel: empty, so that its duration is the simulated node's."""


def numba_launcher() -> Launcher:
    from numba import cuda

    kernel = cuda.jit(tessera_duty)
    stream = cuda.stream()

    def record() -> Any:
        event = cuda.event(timing=False)
        event.record(stream)
        return event

    return Launcher(
        lambda: kernel[1, 1, stream](), record, lambda event: event.synchronize(), stream.synchronize
    )


def main() -> None:
    library, kernel_ns, seconds, depth = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    launcher = core_launcher() if library == "cuda.core" else numba_launcher()
    # Compiling and loading the kernel happen at its first launch: not part of the measured time.
    launcher.launch()
    launcher.synchronize()
    queued: list[Any] = []
    delay_before = run_delay_ns()
    start = time.monotonic_ns()
    end = start + int(seconds * 1e9)
    launched = 0
    while time.monotonic_ns() < end:
        if len(queued) >= depth:
            launcher.wait(queued.pop(0))
        launcher.launch()
        queued.append(launcher.record())
        launched += 1
    launcher.synchronize()
    elapsed = time.monotonic_ns() - start
    delay = run_delay_ns() - delay_before
    share = 100.0 * launched * kernel_ns / elapsed
    print(f"launched={launched} elapsed_ns={elapsed} share={share:.2f} run_delay_ns={delay}", flush=True)


if __name__ == "__main__":
    main()
