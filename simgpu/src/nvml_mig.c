/*
 * NVML's MIG queries: a GPU's MIG mode and the MIG devices (one GPU instance with one compute
 * instance each) configured under it. Instances exist only while their GPU is in MIG mode, which
 * a test switches live through the configuration file (mig_mode, like a fault).
 */
#include "nvml_internal.h"

/* MIG needs an Ampere or newer data-centre GPU; the simulator offers it from compute capability
 * 8.0 on. */
static bool mig_capable(int index)
{
    return sim_nvml.rt.cfg.gpus[index].cc_major >= 8;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                             unsigned int *pendingMode)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && (currentMode == NULL || pendingMode == NULL))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && !mig_capable(i))
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc != NVML_SUCCESS)
        return rc;
    /* A switch takes effect at once here; a real GPU holds it pending until it is reset. */
    *currentMode = sim_mig_mode(&sim_nvml.rt, i) ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = *currentMode;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && count == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *count = mig_capable(i) && sim_mig_mode(&sim_nvml.rt, i) ? SIM_MAX_MIG : 0;
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device,
                                                            unsigned int index,
                                                            nvmlDevice_t *migDevice)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (migDevice == NULL || index >= SIM_MAX_MIG || !sim_mig_mode(&sim_nvml.rt, i))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned int)sim_nvml.rt.cfg.gpus[i].mig_count)
        return NVML_ERROR_NOT_FOUND; /* no instance in that slot */
    *migDevice = &sim_nvml.mig_devices[i][index];
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    int i = 0, mig = -1;
    nvmlReturn_t rc = sim_nvml_any_device(device, &i, &mig);
    if (rc == NVML_SUCCESS && isMigDevice == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *isMigDevice = mig >= 0;
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                     nvmlDevice_t *device)
{
    int i = 0, mig = -1;
    nvmlReturn_t rc = sim_nvml_any_device(migDevice, &i, &mig);
    if (rc == NVML_SUCCESS && (device == NULL || mig < 0))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *device = &sim_nvml.devices[i];
    return rc;
}

/* GPU instance ids count from 1 in configuration order; each holds compute instance 0. */
SIMGPU_API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    int i = 0, mig = -1;
    nvmlReturn_t rc = sim_nvml_any_device(device, &i, &mig);
    if (rc == NVML_SUCCESS && id == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && mig < 0)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS)
        *id = (unsigned int)mig + 1;
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    int i = 0, mig = -1;
    nvmlReturn_t rc = sim_nvml_any_device(device, &i, &mig);
    if (rc == NVML_SUCCESS && id == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && mig < 0)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS)
        *id = 0;
    return rc;
}
