/* Device enumeration and static device properties, all taken from the configuration. */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

static const struct sim_gpu_config *gpu(CUdevice dev)
{
    return &sim_cuda.rt.cfg.gpus[dev];
}

/* Static properties stay readable on a lost GPU (the driver cached them at init); only calls
 * that need the device itself fail. */
static CUresult check_ordinal(CUdevice dev)
{
    return dev >= 0 && dev < sim_cuda.rt.cfg.gpu_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

SIMGPU_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    SIM_ENTER();
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_ordinal(ordinal) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetCount(int *count)
{
    SIM_ENTER();
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = sim_cuda.rt.cfg.gpu_count;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    SIM_ENTER();
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_ordinal(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", gpu(dev)->name);
    return CUDA_SUCCESS;
}

static int hexval(char c)
{
    return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

/* `text` after its GPU-/MIG- prefix (validated by the parser: 8-4-4-4-12 hex) as 16 bytes. */
static void uuid_bytes(CUuuid *uuid, const char *text)
{
    text += 4;
    int out = 0;
    for (int i = 0; text[i] != '\0' && out < 16; i++) {
        if (text[i] == '-')
            continue;
        uuid->bytes[out++] = (char)(hexval(text[i]) << 4 | hexval(text[i + 1]));
        i++;
    }
}

/* The GPU's UUID; for a MIG instance, its parent GPU's (as v1 does on NVIDIA's driver). */
SIMGPU_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    SIM_ENTER();
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_ordinal(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    uuid_bytes(uuid, gpu(dev)->uuid);
    return CUDA_SUCCESS;
}

/* v2 differs only for MIG instances: it gives the instance's own UUID. */
SIMGPU_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    SIM_ENTER();
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_ordinal(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    const struct sim_gpu_config *g = gpu(dev);
    uuid_bytes(uuid, g->mig_index >= 0 ? g->mig[g->mig_index].uuid : g->uuid);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    SIM_ENTER();
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_ordinal(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)gpu(dev)->memory_bytes;
    return CUDA_SUCCESS;
}

static int attribute_value(const struct sim_gpu_config *g, CUdevice_attribute attrib)
{
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
        return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
        return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
        return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
        return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
        return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
        return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
        return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
        return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
        return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
        return 512;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        return g->sm_count;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        return (int)g->pci_bus;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
        return (int)g->pci_device;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
        return (int)g->pci_domain;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
        return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
        return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
        return 50331648;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
        return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
        return 3;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        return g->cc_major;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        return g->cc_minor;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
        return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
        return 232448;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
        return 32;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
        return 1;
    default:
        return 0; /* features the simulator does not model read as absent, as on older parts */
    }
}

SIMGPU_API CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    SIM_ENTER();
    if (value == NULL || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_SIMGPU_LIMIT)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_ordinal(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *value = attribute_value(gpu(dev), attrib);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    SIM_ENTER();
    if (major == NULL || minor == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_ordinal(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *major = gpu(dev)->cc_major;
    *minor = gpu(dev)->cc_minor;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    SIM_ENTER();
    if (pciBusId == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_ordinal(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    const struct sim_gpu_config *g = gpu(dev);
    /* CUDA's form has a 4-digit domain; NVML's has 8. */
    snprintf(pciBusId, (size_t)len, "%04X:%02X:%02X.%X", g->pci_domain, g->pci_bus,
             g->pci_device, g->pci_function);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    SIM_ENTER();
    unsigned int d = 0, b = 0, v = 0, f = 0;
    if (dev == NULL || pciBusId == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_parse_pci_bus_id(pciBusId, &d, &b, &v, &f) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < sim_cuda.rt.cfg.gpu_count; i++) {
        const struct sim_gpu_config *g = gpu(i);
        if (g->pci_domain == d && g->pci_bus == b && g->pci_device == v && g->pci_function == f) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}
