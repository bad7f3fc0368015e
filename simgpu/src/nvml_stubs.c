/*
 * Real NVML entry points the simulator does not implement: present, and answering
 * NVML_ERROR_NOT_SUPPORTED, which is what NVML itself says for a feature a GPU lacks, so callers
 * such as pynvml-based discovery take their "not supported" path instead of failing to load a
 * symbol. Each is an alias of one argument-ignoring function (safe under the C ABI: the caller
 * owns its arguments).
 */
#include "nvml_internal.h"

#define SIM_NVML_STUBS(X)                                                                         \
    X(nvmlDeviceGetClockInfo) X(nvmlDeviceGetMaxClockInfo) X(nvmlDeviceGetEccMode)                \
    X(nvmlDeviceGetFanSpeed) X(nvmlDeviceGetPerformanceState) X(nvmlDeviceGetSerial)              \
    X(nvmlDeviceGetPersistenceMode) X(nvmlDeviceGetTotalEnergyConsumption)                        \
    X(nvmlDeviceGetBAR1MemoryInfo)                                                                \
    X(nvmlDeviceGetEncoderUtilization) X(nvmlDeviceGetDecoderUtilization)                         \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3) X(nvmlDeviceGetNvLinkState)                     \
    X(nvmlEventSetCreate) X(nvmlDeviceRegisterEvents) X(nvmlEventSetWait_v2) X(nvmlEventSetFree)  \
    X(nvmlDeviceGetSupportedEventTypes) X(nvmlDeviceGetVbiosVersion)                              \
    X(nvmlDeviceGetBoardPartNumber) X(nvmlDeviceGetInforomVersion) X(nvmlDeviceGetDisplayMode)    \
    X(nvmlDeviceGetDisplayActive) X(nvmlDeviceGetCurrPcieLinkGeneration)                          \
    X(nvmlDeviceGetCurrPcieLinkWidth) X(nvmlDeviceGetPcieThroughput)                              \
    X(nvmlDeviceGetTemperatureThreshold) X(nvmlDeviceGetTemperatureV) X(nvmlDeviceGetPowerState)  \
    X(nvmlDeviceGetPowerManagementMode) X(nvmlDeviceGetPowerManagementLimitConstraints)           \
    X(nvmlDeviceGetPowerManagementDefaultLimit) X(nvmlDeviceGetCurrentClocksThrottleReasons)      \
    X(nvmlDeviceGetCurrentClocksEventReasons) X(nvmlDeviceGetRetiredPages)                        \
    X(nvmlDeviceGetRemappedRows) X(nvmlDeviceGetTotalEccErrors) X(nvmlDeviceGetMemoryErrorCounter) \
    X(nvmlDeviceGetFieldValues) X(nvmlDeviceGetSamples) X(nvmlDeviceGetNumaNodeId)                \
    X(nvmlDeviceGetCpuAffinity)                                                                   \
    X(nvmlDeviceGetMemoryAffinity) X(nvmlDeviceGetTopologyCommonAncestor)                         \
    X(nvmlDeviceGetP2PStatus) X(nvmlDeviceGetBoardId) X(nvmlDeviceGetMultiGpuBoard)               \
    X(nvmlDeviceGetAccountingMode) X(nvmlDeviceGetProcessesUtilizationInfo)                       \
    X(nvmlDeviceGetGpuFabricInfo) X(nvmlDeviceGetHandleBySerial) X(nvmlUnitGetCount)              \
    X(nvmlSystemGetProcessName) X(nvmlDeviceGetGraphicsRunningProcesses)                          \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2) X(nvmlDeviceGetModuleId)

static nvmlReturn_t not_supported(void)
{
    return NVML_ERROR_NOT_SUPPORTED;
}

#define DEFINE_STUB(name)                                                                         \
    extern __typeof__(not_supported) name                                                         \
        __attribute__((alias("not_supported"), visibility("default")));
SIM_NVML_STUBS(DEFINE_STUB)
