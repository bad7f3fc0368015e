"""The names every Tessera component agrees on: the one place they are spelled.

The driver publishes them, the webhook and the admission check write claims that use them, and the
tests and the demo look for them; a second spelling anywhere is a bug waiting for a rename.
"""

from __future__ import annotations

DRIVER_NAME = "gpu.tessera.dev"
"""The DRA driver name, also the name of the DeviceClass that selects every Tessera GPU."""

DEVICE_CLASS = DRIVER_NAME

MEMORY_CAPACITY = "memory"
"""Consumable capacity: device memory in bytes (steps of 1Mi)."""

CORES_CAPACITY = "cores"
"""Consumable capacity: percent of the GPU's time, 0-100 (steps of 1)."""

UNHEALTHY_TAINT = f"{DRIVER_NAME}/unhealthy"
"""Device taint key the driver sets on a GPU while NVML reports it lost or failing."""

METRICS_PORT = 31995
