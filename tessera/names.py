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

MIG_DEVICE_CLASS = "mig.tessera.dev"
"""The DeviceClass that selects MIG instances (whole, exclusive devices) of GPUs in MIG mode."""

DEVICE_TYPE_ATTRIBUTE = "type"
"""Device attribute: "gpu" for a shareable GPU, "mig" for a MIG instance (slices written before MIG
support have no type: their devices are GPUs)."""

MIG_PROFILE_ATTRIBUTE = "profile"
"""Device attribute of a MIG instance: its profile ("1g.10gb"), what HAMi's nvidia.com/mig-<profile>
resource names."""

PARENT_UUID_ATTRIBUTE = "parentUUID"
"""Device attribute of a MIG instance: the UUID of the GPU it is part of."""

UUID_ATTRIBUTE = "uuid"
"""Device attribute: the GPU's UUID as NVML gives it ("GPU-..."), what HAMi's UUID annotations name."""

PRODUCT_ATTRIBUTE = "productName"
"""Device attribute: the GPU's product name ("NVIDIA A100-SXM4-80GB"), what HAMi's type annotations
match a part of."""

UNHEALTHY_TAINT = f"{DRIVER_NAME}/unhealthy"
"""Device taint key the driver sets on a GPU while NVML reports it lost or failing."""

UNMONITORED_TAINT = f"{DRIVER_NAME}/unmonitored"
"""Device taint key the driver sets on every GPU while NVML does not answer at all: their health is
unknown, which is not the same as unhealthy (nothing says the GPUs themselves failed)."""

CORDONED_TAINT = f"{DRIVER_NAME}/cordoned"
"""Device taint key the driver sets on a GPU that its node's ``hami.io/device-cordon`` annotation names."""

HAMI_DEVICE_CORDON = "hami.io/device-cordon"
"""Node annotation (HAMi v2.10): comma-separated GPU UUIDs that take no new allocation."""

METRICS_PORT = 31995

# HAMi's spellings, which users' manifests already carry: the webhook converts them into claims.
HAMI_GPU = "nvidia.com/gpu"
"""Number of GPUs a container asks for."""

HAMI_GPUMEM = "nvidia.com/gpumem"
"""Device memory per GPU, in MiB."""

HAMI_GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
"""Device memory per GPU, as a percentage (1-100) of that GPU's memory."""

HAMI_GPUCORES = "nvidia.com/gpucores"
"""Percent of each GPU's time (1-100)."""

HAMI_RESOURCES = (HAMI_GPU, HAMI_GPUMEM, HAMI_GPUMEM_PERCENTAGE, HAMI_GPUCORES)

HAMI_PRIORITY = "nvidia.com/priority"
"""Task priority on a shared GPU: 0 high, 1 low (HAMi's default)."""

HAMI_MIG_PREFIX = "nvidia.com/mig-"
"""``nvidia.com/mig-<profile>: N`` asks for N MIG instances of that profile (static MIG)."""

HAMI_VGPU_MODE = "nvidia.com/vgpu-mode"
"""Pod annotation: HAMi's sharing mode; "mig" asks for dynamic MIG, which Tessera does not do."""

HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
"""Pod annotation: how HAMi picks GPUs within a node (binpack, spread, mutex, topology-aware, numa)."""

HAMI_NODE_POLICY = "hami.io/node-scheduler-policy"
"""Pod annotation: how HAMi picks the node (binpack, spread)."""

HAMI_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
"""Pod annotation: HAMi's weights of its GPU score ("slot=1,core=1,memory=3")."""

HAMI_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"
"""Container environment variable: "true" switches HAMi's enforcement off for the container."""

HAMI_USE_UUID = "nvidia.com/use-gpuuuid"
"""Pod annotation: comma-separated GPU UUIDs the pod may use."""

HAMI_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
"""Pod annotation: comma-separated GPU UUIDs the pod must not use."""

HAMI_USE_TYPE = "nvidia.com/use-gputype"
"""Pod annotation: comma-separated parts of product names (case-insensitive) the pod may use."""

HAMI_NOUSE_TYPE = "nvidia.com/nouse-gputype"
"""Pod annotation: comma-separated parts of product names (case-insensitive) the pod must not use."""

HAMI_ANNOTATIONS = (HAMI_USE_UUID, HAMI_NOUSE_UUID, HAMI_USE_TYPE, HAMI_NOUSE_TYPE)

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
"""The label that marks the templates the webhook writes (value ``WEBHOOK_MANAGED_BY``): the webhook
uses an existing template only if it carries it, and the admission check trusts a template's
recorded request only then."""

WEBHOOK_MANAGED_BY = "tessera-webhook"
"""Value of app.kubernetes.io/managed-by on the ResourceClaimTemplates the webhook creates."""

GPU_REQUEST_ANNOTATION = f"{DRIVER_NAME}/gpu-request"
"""Annotation on the claim metadata of the ResourceClaimTemplates the webhook writes (copied onto every
ResourceClaim made from them): the GPU request it converted, as JSON (see tessera/gpu_request.py), which
the admission check reads instead of the CEL."""
