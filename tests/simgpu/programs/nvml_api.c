/*
 * Conformance of the NVML subset discovery and the exporter use: results and error codes,
 * including the two-call buffer protocol and versioned structs. Exit status 0 and "PASS" when
 * every check holds. Runs unchanged against a real GPU's libnvidia-ml.
 */
#include "simgpu_test.h"

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *lib = test_open("TEST_LIBNVML", "libnvidia-ml.so.1");
    LOAD(lib, nvmlInit_v2);
    LOAD(lib, nvmlShutdown);
    LOAD(lib, nvmlErrorString);
    LOAD(lib, nvmlDeviceGetCount_v2);
    LOAD(lib, nvmlDeviceGetHandleByIndex_v2);
    LOAD(lib, nvmlDeviceGetHandleByUUID);
    LOAD(lib, nvmlDeviceGetHandleByPciBusId_v2);
    LOAD(lib, nvmlDeviceGetName);
    LOAD(lib, nvmlDeviceGetUUID);
    LOAD(lib, nvmlDeviceGetPciInfo_v3);
    LOAD(lib, nvmlDeviceGetMemoryInfo);
    LOAD(lib, nvmlDeviceGetMemoryInfo_v2);
    LOAD(lib, nvmlDeviceGetUtilizationRates);
    LOAD(lib, nvmlDeviceGetComputeRunningProcesses_v3);
    LOAD(lib, nvmlDeviceGetTemperature);
    LOAD(lib, nvmlSystemGetDriverVersion);
    unsigned int count = 0;
    nvmlDevice_t dev = NULL, again = NULL;
    char text[96], tiny[4];
    nvmlPciInfo_t pci;
    nvmlMemory_t mem;
    nvmlMemory_v2_t mem2;
    nvmlUtilization_t util;
    unsigned int temp = 0;

    EXPECT_EQ(p_nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
    EXPECT_EQ(p_nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    EXPECT_TRUE(strcmp(p_nvmlErrorString(NVML_ERROR_GPU_IS_LOST), "GPU is lost") == 0);
    EXPECT_EQ(p_nvmlInit_v2(), NVML_SUCCESS);
    EXPECT_EQ(p_nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
    EXPECT_TRUE(count >= 1);
    EXPECT_EQ(p_nvmlDeviceGetHandleByIndex_v2(count, &dev), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(p_nvmlDeviceGetHandleByIndex_v2(0, &dev), NVML_SUCCESS);
    EXPECT_EQ(p_nvmlDeviceGetName(dev, text, sizeof text), NVML_SUCCESS);
    EXPECT_EQ(p_nvmlDeviceGetName(dev, tiny, sizeof tiny), NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT_EQ(p_nvmlDeviceGetUUID(dev, text, sizeof text), NVML_SUCCESS);
    EXPECT_EQ(p_nvmlDeviceGetHandleByUUID(text, &again), NVML_SUCCESS);
    EXPECT_TRUE(again == dev);
    EXPECT_EQ(p_nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000", &again),
              NVML_ERROR_NOT_FOUND);
    EXPECT_EQ(p_nvmlDeviceGetPciInfo_v3(dev, &pci), NVML_SUCCESS);
    EXPECT_EQ(pci.pciDeviceId & 0xffff, 0x10de);
    EXPECT_EQ(p_nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &again), NVML_SUCCESS);
    EXPECT_TRUE(again == dev);
    EXPECT_EQ(p_nvmlDeviceGetMemoryInfo(dev, &mem), NVML_SUCCESS);
    EXPECT_EQ(mem.free + mem.used, mem.total);
    mem2.version = 1;
    EXPECT_EQ(p_nvmlDeviceGetMemoryInfo_v2(dev, &mem2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    mem2.version = nvmlMemory_v2;
    EXPECT_EQ(p_nvmlDeviceGetMemoryInfo_v2(dev, &mem2), NVML_SUCCESS);
    EXPECT_EQ(mem2.total, mem.total);
    EXPECT_EQ(p_nvmlDeviceGetUtilizationRates(dev, &util), NVML_SUCCESS);
    EXPECT_TRUE(util.gpu <= 100);
    EXPECT_EQ(p_nvmlDeviceGetUtilizationRates(dev, NULL), NVML_ERROR_INVALID_ARGUMENT);
    unsigned int procs = 0;
    nvmlReturn_t rc = p_nvmlDeviceGetComputeRunningProcesses_v3(dev, &procs, NULL);
    EXPECT_TRUE(rc == NVML_SUCCESS || rc == NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT_EQ(p_nvmlDeviceGetTemperature(dev, NVML_TEMPERATURE_GPU, &temp), NVML_SUCCESS);
    EXPECT_TRUE(temp > 0 && temp < 150);
    EXPECT_EQ(p_nvmlSystemGetDriverVersion(tiny, sizeof tiny), NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT_EQ(p_nvmlSystemGetDriverVersion(text, sizeof text), NVML_SUCCESS);
    EXPECT_EQ(p_nvmlShutdown(), NVML_SUCCESS);
    EXPECT_EQ(p_nvmlDeviceGetMemoryInfo(dev, &mem), NVML_ERROR_UNINITIALIZED);
    if (test_failures > 0) {
        printf("FAIL %d\n", test_failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
