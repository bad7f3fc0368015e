/* NVML: initialisation, system queries, device handles and static device properties. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "nvml_internal.h"

struct sim_nvml sim_nvml = {.mu = PTHREAD_MUTEX_INITIALIZER};

#define NVML_INIT_FLAG_NO_GPUS 1u
#define NVML_INIT_FLAG_NO_ATTACH 2u

SIMGPU_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    if ((flags & ~(NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH)) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_nvml.mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!sim_nvml.loaded) {
        switch (sim_runtime_open(&sim_nvml.rt)) {
        case SIM_OPEN_NO_CONFIG:
            rc = NVML_ERROR_DRIVER_NOT_LOADED; /* what NVML says on a machine without a driver */
            break;
        case SIM_OPEN_FAILED:
            rc = NVML_ERROR_UNKNOWN;
            break;
        case SIM_OPEN_OK:
            for (int i = 0; i < SIM_MAX_GPUS; i++) {
                sim_nvml.devices[i] = (struct nvmlDevice_st){.index = i, .mig = -1};
                for (int k = 0; k < SIM_MAX_MIG; k++)
                    sim_nvml.mig_devices[i][k] = (struct nvmlDevice_st){.index = i, .mig = k};
            }
            sim_nvml.loaded = true;
            break;
        }
    }
    if (rc == NVML_SUCCESS)
        sim_nvml.refs++;
    pthread_mutex_unlock(&sim_nvml.mu);
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

SIMGPU_API nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

SIMGPU_API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&sim_nvml.mu);
    nvmlReturn_t rc = NVML_ERROR_UNINITIALIZED;
    if (sim_nvml.refs > 0) {
        /* The state file stays mapped and open: closing any descriptor of it would drop the
         * liveness lock libcuda holds in this process (POSIX record-lock semantics). */
        sim_nvml.refs--;
        rc = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&sim_nvml.mu);
    return rc;
}

nvmlReturn_t sim_nvml_enter(void)
{
    pthread_mutex_lock(&sim_nvml.mu);
    bool up = sim_nvml.refs > 0;
    pthread_mutex_unlock(&sim_nvml.mu);
    if (!up)
        return NVML_ERROR_UNINITIALIZED;
    sim_faults_on_call(&sim_nvml.rt);
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvml_device(nvmlDevice_t device, int *index)
{
    nvmlReturn_t rc = sim_nvml_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (device < &sim_nvml.devices[0] || device >= &sim_nvml.devices[sim_nvml.rt.cfg.gpu_count])
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_fault_nvml_hang(&sim_nvml.rt, device->index);
    if (sim_fault_gpu_lost(&sim_nvml.rt, device->index))
        return NVML_ERROR_GPU_IS_LOST;
    *index = device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvml_any_device(nvmlDevice_t device, int *index, int *mig)
{
    const struct nvmlDevice_st *first = &sim_nvml.mig_devices[0][0];
    if (device < first || device >= first + SIM_MAX_GPUS * SIM_MAX_MIG) {
        *mig = -1;
        return sim_nvml_device(device, index);
    }
    nvmlReturn_t rc = sim_nvml_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (device->index >= sim_nvml.rt.cfg.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_fault_nvml_hang(&sim_nvml.rt, device->index);
    if (sim_fault_gpu_lost(&sim_nvml.rt, device->index))
        return NVML_ERROR_GPU_IS_LOST;
    /* A handle of an instance that is gone (MIG switched off since) names nothing now. */
    if (!sim_mig_mode(&sim_nvml.rt, device->index) ||
        device->mig >= sim_nvml.rt.cfg.gpus[device->index].mig_count)
        return NVML_ERROR_NOT_FOUND;
    *index = device->index;
    *mig = device->mig;
    return NVML_SUCCESS;
}

static const struct sim_gpu_config *gpu(int index)
{
    return &sim_nvml.rt.cfg.gpus[index];
}

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *text)
{
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, text);
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = sim_nvml_enter();
    return rc != NVML_SUCCESS ? rc : copy_out(version, length, sim_nvml.rt.cfg.driver_version);
}

SIMGPU_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = sim_nvml_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    char text[SIM_VERSION_LEN + 16];
    snprintf(text, sizeof text, "%d.%s", sim_nvml.rt.cfg.cuda_driver_version / 1000,
             sim_nvml.rt.cfg.driver_version);
    return copy_out(version, length, text);
}

SIMGPU_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    nvmlReturn_t rc = sim_nvml_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = sim_nvml.rt.cfg.cuda_driver_version;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    return nvmlSystemGetCudaDriverVersion(version);
}

/* The release branch a driver version belongs to, as NVIDIA names it: "r580_00" for 580.65.06
 * (the branch is the version's major number). */
SIMGPU_API nvmlReturn_t nvmlSystemGetDriverBranch(nvmlSystemDriverBranchInfo_t *branchInfo,
                                                  unsigned int length)
{
    nvmlReturn_t rc = sim_nvml_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (branchInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (branchInfo->version != nvmlSystemDriverBranchInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    char text[SIM_VERSION_LEN + 8];
    snprintf(text, sizeof text, "r%.*s_00",
             (int)strcspn(sim_nvml.rt.cfg.driver_version, "."), sim_nvml.rt.cfg.driver_version);
    if (length > sizeof branchInfo->branch)
        length = sizeof branchInfo->branch;
    return copy_out(branchInfo->branch, length, text);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    nvmlReturn_t rc = sim_nvml_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)sim_nvml.rt.cfg.gpu_count;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    return nvmlDeviceGetCount_v2(count);
}

/* Handle lookups fail for a lost GPU too: nvidia-smi then reports "GPU is lost". */
static nvmlReturn_t handle_for(int index, nvmlDevice_t *device)
{
    sim_fault_nvml_hang(&sim_nvml.rt, index);
    if (sim_fault_gpu_lost(&sim_nvml.rt, index))
        return NVML_ERROR_GPU_IS_LOST;
    *device = &sim_nvml.devices[index];
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc = sim_nvml_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (device == NULL || index >= (unsigned int)sim_nvml.rt.cfg.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    return handle_for((int)index, device);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t rc = sim_nvml_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < sim_nvml.rt.cfg.gpu_count; i++) {
        if (strcasecmp(gpu(i)->uuid, uuid) == 0)
            return handle_for(i, device);
    }
    return NVML_ERROR_NOT_FOUND;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId,
                                                        nvmlDevice_t *device)
{
    nvmlReturn_t rc = sim_nvml_enter();
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned int d = 0, b = 0, v = 0, f = 0;
    if (pciBusId == NULL || device == NULL || sim_parse_pci_bus_id(pciBusId, &d, &b, &v, &f) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < sim_nvml.rt.cfg.gpu_count; i++) {
        const struct sim_gpu_config *g = gpu(i);
        if (g->pci_domain == d && g->pci_bus == b && g->pci_device == v && g->pci_function == f)
            return handle_for(i, device);
    }
    return NVML_ERROR_NOT_FOUND;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && index == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *index = (unsigned int)i;
    return rc;
}

/* A MIG device's name is its GPU's with the profile, as NVIDIA's NVML writes it:
 * "NVIDIA H100 80GB HBM3 MIG 1g.10gb". */
SIMGPU_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    int i = 0, mig = -1;
    nvmlReturn_t rc = sim_nvml_any_device(device, &i, &mig);
    if (rc != NVML_SUCCESS || mig < 0)
        return rc != NVML_SUCCESS ? rc : copy_out(name, length, gpu(i)->name);
    char text[SIM_NAME_LEN + SIM_PROFILE_LEN + 8];
    snprintf(text, sizeof text, "%s MIG %s", gpu(i)->name, gpu(i)->mig[mig].profile);
    return copy_out(name, length, text);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    int i = 0, mig = -1;
    nvmlReturn_t rc = sim_nvml_any_device(device, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    return copy_out(uuid, length, mig < 0 ? gpu(i)->uuid : gpu(i)->mig[mig].uuid);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && type == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *type = (nvmlBrandType_t)gpu(i)->brand;
    return rc;
}

static nvmlDeviceArchitecture_t architecture(int major, int minor)
{
    switch (major) {
    case 3:
        return NVML_DEVICE_ARCH_KEPLER;
    case 5:
        return NVML_DEVICE_ARCH_MAXWELL;
    case 6:
        return NVML_DEVICE_ARCH_PASCAL;
    case 7:
        return minor >= 5 ? NVML_DEVICE_ARCH_TURING : NVML_DEVICE_ARCH_VOLTA;
    case 8:
        return minor == 9 ? NVML_DEVICE_ARCH_ADA : NVML_DEVICE_ARCH_AMPERE;
    case 9:
        return NVML_DEVICE_ARCH_HOPPER;
    case 10:
    case 12:
        return NVML_DEVICE_ARCH_BLACKWELL;
    default:
        return NVML_DEVICE_ARCH_UNKNOWN;
    }
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device,
                                                  nvmlDeviceArchitecture_t *arch)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && arch == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *arch = architecture(gpu(i)->cc_major, gpu(i)->cc_minor);
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                           int *minor)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && (major == NULL || minor == NULL))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        *major = gpu(i)->cc_major;
        *minor = gpu(i)->cc_minor;
    }
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && minorNumber == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *minorNumber = gpu(i)->minor;
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && pci == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_gpu_config *g = gpu(i);
    memset(pci, 0, sizeof *pci);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", g->pci_domain, g->pci_bus,
             g->pci_device, g->pci_function);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X",
             g->pci_domain & 0xffffu, g->pci_bus, g->pci_device, g->pci_function);
    return NVML_SUCCESS;
}

/* The versioned PCI query of newer clients (cuda.core's Device.pci_bus_id): the v3 fields and the
 * PCI class, a 3D controller (0x0302) like NVIDIA's data-centre GPUs. */
SIMGPU_API nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && pci == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && pci->version != nvmlPciInfoExt_v1)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlPciInfo_t v3;
    if (rc == NVML_SUCCESS)
        rc = nvmlDeviceGetPciInfo_v3(device, &v3);
    if (rc != NVML_SUCCESS)
        return rc;
    pci->domain = v3.domain;
    pci->bus = v3.bus;
    pci->device = v3.device;
    pci->pciDeviceId = v3.pciDeviceId;
    pci->pciSubSystemId = v3.pciSubSystemId;
    pci->baseClass = 0x03;
    pci->subClass = 0x02;
    memcpy(pci->busId, v3.busId, sizeof pci->busId);
    return NVML_SUCCESS;
}

/* Neither HMM nor ATS: the simulator's device memory is not the host's address space as far as
 * a client may rely on (docs/simgpu.md). */
SIMGPU_API nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t device,
                                                    nvmlDeviceAddressingMode_t *mode)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && mode == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && mode->version != nvmlDeviceAddressingMode_v1)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (rc == NVML_SUCCESS)
        mode->value = NVML_DEVICE_ADDRESSING_MODE_NONE;
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                                 nvmlTemperatureSensors_t sensor,
                                                 unsigned int *temp)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && (temp == NULL || sensor != NVML_TEMPERATURE_GPU))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *temp = gpu(i)->temperature_c;
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && power == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *power = gpu(i)->power_mw;
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device,
                                                          unsigned int *limit)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && limit == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *limit = gpu(i)->power_limit_mw;
    return rc;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return nvmlDeviceGetPowerManagementLimit(device, limit);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && mode == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *mode = NVML_COMPUTEMODE_DEFAULT;
    return rc;
}

static const struct {
    nvmlReturn_t code;
    const char *text;
} error_texts[] = {
    {NVML_SUCCESS, "Success"},
    {NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {NVML_ERROR_ALREADY_INITIALIZED, "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {NVML_ERROR_INSUFFICIENT_POWER, "Insufficient External Power"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "Timeout"},
    {NVML_ERROR_IRQ_ISSUE, "Interrupt Request Issue"},
    {NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"},
    {NVML_ERROR_CORRUPTED_INFOROM, "Corrupted infoROM"},
    {NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {NVML_ERROR_RESET_REQUIRED, "GPU requires restart"},
    {NVML_ERROR_OPERATING_SYSTEM, "The operating system has blocked the request."},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "RM has detected an NVML/RM version mismatch."},
    {NVML_ERROR_IN_USE, "In use by another client"},
    {NVML_ERROR_MEMORY, "Insufficient Memory"},
    {NVML_ERROR_NO_DATA, "No data"},
    {NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "ECC is not supported on vGPU"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "Insufficient resources"},
    {NVML_ERROR_FREQ_NOT_SUPPORTED, "Frequency not supported"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"},
    {NVML_ERROR_DEPRECATED, "Deprecated"},
    {NVML_ERROR_NOT_READY, "Not ready"},
    {NVML_ERROR_GPU_NOT_FOUND, "GPU not found"},
    {NVML_ERROR_INVALID_STATE, "Invalid state"},
};

SIMGPU_API const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof error_texts / sizeof error_texts[0]; i++) {
        if (error_texts[i].code == result)
            return error_texts[i].text;
    }
    return "Unknown Error";
}
