/*
 * NULL arguments and invalid handles across the CUDA driver API and NVML: one row per call,
 * each with the error code NVIDIA's libraries return. Exit status 0 and "PASS" when every row
 * holds; each failed row is reported on stderr. Runs unchanged against a real GPU's libraries.
 */
#include "simgpu_test.h"

#define ROW(call, want) {#call, (int)(call), (int)(want)}

struct row {
    const char *call;
    int got, want;
};

static void check(const struct row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (rows[i].got != rows[i].want) {
            fprintf(stderr, "%s = %d, expected %d\n", rows[i].call, rows[i].got, rows[i].want);
            test_failures++;
        }
    }
}

static void cuda(void)
{
    void *lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    LOAD(lib, cuInit);
    LOAD(lib, cuDriverGetVersion);
    LOAD(lib, cuGetErrorName);
    LOAD(lib, cuGetErrorString);
    LOAD(lib, cuDeviceGetCount);
    LOAD(lib, cuDeviceGet);
    LOAD(lib, cuDeviceGetName);
    LOAD(lib, cuDeviceGetUuid);
    LOAD(lib, cuDeviceTotalMem_v2);
    LOAD(lib, cuDeviceGetAttribute);
    LOAD(lib, cuDeviceComputeCapability);
    LOAD(lib, cuDeviceGetPCIBusId);
    LOAD(lib, cuDeviceGetByPCIBusId);
    LOAD(lib, cuDevicePrimaryCtxRetain);
    LOAD(lib, cuDevicePrimaryCtxGetState);
    LOAD(lib, cuCtxCreate_v2);
    LOAD(lib, cuCtxGetCurrent);
    LOAD(lib, cuCtxSetCurrent);
    LOAD(lib, cuCtxGetDevice);
    LOAD(lib, cuCtxSynchronize);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemGetInfo_v2);
    LOAD(lib, cuMemAllocHost_v2);
    LOAD(lib, cuMemAllocPitch_v2);
    LOAD(lib, cuMemAllocManaged);
    LOAD(lib, cuMemcpyHtoD_v2);
    LOAD(lib, cuMemcpyDtoH_v2);
    LOAD(lib, cuMemAllocAsync);
    LOAD(lib, cuMemPoolCreate);
    LOAD(lib, cuDeviceGetDefaultMemPool);
    LOAD(lib, cuMemGetAllocationGranularity);
    LOAD(lib, cuMemCreate);
    LOAD(lib, cuArrayCreate_v2);
    LOAD(lib, cuArray3DCreate_v2);
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuStreamDestroy_v2);
    LOAD(lib, cuStreamGetCtx);
    LOAD(lib, cuStreamIsCapturing);
    LOAD(lib, cuStreamBeginCapture_v2);
    LOAD(lib, cuStreamEndCapture);
    LOAD(lib, cuEventCreate);
    LOAD(lib, cuEventRecord);
    LOAD(lib, cuEventQuery);
    LOAD(lib, cuEventSynchronize);
    LOAD(lib, cuEventElapsedTime);
    LOAD(lib, cuEventDestroy_v2);
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuFuncGetAttribute);
    LOAD(lib, cuGraphCreate);
    LOAD(lib, cuGraphAddMemAllocNode);
    LOAD(lib, cuGraphAddMemFreeNode);
    LOAD(lib, cuGraphMemAllocNodeGetParams);
    LOAD(lib, cuGraphMemFreeNodeGetParams);
    LOAD(lib, cuGraphAddNode);
    LOAD(lib, cuGraphAddNode_v2);
    LOAD(lib, cuGraphAddNode_v3);
    LOAD(lib, cuGraphGetNodes);
    LOAD(lib, cuGraphNodeGetType);
    LOAD(lib, cuGetProcAddress);
    LOAD(lib, cuCtxGetStreamPriorityRange);
    LOAD(lib, cuCtxGetId);
    LOAD(lib, cuStreamGetPriority);
    LOAD(lib, cuStreamGetFlags);
    LOAD(lib, cuStreamGetId);
    LOAD(lib, cuLibraryLoadData);
    LOAD(lib, cuLibraryLoadFromFile);
    LOAD(lib, cuLibraryUnload);
    LOAD(lib, cuLibraryGetKernel);
    LOAD(lib, cuLibraryGetModule);
    LOAD(lib, cuKernelGetFunction);
    LOAD(lib, cuKernelGetName);
    LOAD(lib, cuFuncGetName);
    LOAD(lib, cuFuncGetModule);
    LOAD(lib, cuOccupancyMaxActiveBlocksPerMultiprocessor);
    LOAD(lib, cuOccupancyMaxPotentialBlockSize);
    LOAD(lib, cuPointerGetAttribute);
    LOAD(lib, cuPointerGetAttributes);

    int n = 0, major = 0, minor = 0;
    unsigned int flags = 0;
    size_t size = 0, pitch = 0;
    char text[64];
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    CUdeviceptr dptr = 0;
    void *fn = NULL;
    CUstream stream = NULL;
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    CUevent event = NULL;
    CUmodule module = NULL;
    CUfunction func = NULL;
    CUmemoryPool pool = NULL;
    CUmemGenericAllocationHandle handle = 0;
    CUarray array = NULL;
    CUgraph graph = NULL;
    CUgraphNode node = NULL;
    CUgraphNodeType node_type = CU_GRAPH_NODE_TYPE_KERNEL;
    CUDA_MEM_ALLOC_NODE_PARAMS alloc_node;
    CUgraphNodeParams node_params;
    memset(&alloc_node, 0, sizeof alloc_node);
    memset(&node_params, 0, sizeof node_params);
    float ms = 0;
    int least = 0, greatest = 0;
    unsigned long long id = 0;
    CUlibrary library = NULL;
    CUkernel kernel = NULL;
    const char *name = NULL;
    CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    void *attr_data[] = {&flags};
    CUmemPoolProps pool_props;
    CUmemAllocationProp alloc_prop;
    memset(&pool_props, 0, sizeof pool_props);
    memset(&alloc_prop, 0, sizeof alloc_prop);
    pool_props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pool_props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    alloc_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    alloc_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUDA_ARRAY_DESCRIPTOR desc2 = {64, 64, CU_AD_FORMAT_FLOAT, 1};
    CUDA_ARRAY3D_DESCRIPTOR desc3 = {64, 64, 4, CU_AD_FORMAT_FLOAT, 1, 0};

    const struct row before_init[] = {
        ROW(p_cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED),
        ROW(p_cuDeviceGet(&dev, 0), CUDA_ERROR_NOT_INITIALIZED),
        ROW(p_cuCtxGetCurrent(&ctx), CUDA_ERROR_NOT_INITIALIZED),
        ROW(p_cuMemAlloc_v2(&dptr, 16), CUDA_ERROR_NOT_INITIALIZED),
        ROW(p_cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGetErrorName(CUDA_SUCCESS, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGetErrorString(CUDA_SUCCESS, NULL), CUDA_ERROR_INVALID_VALUE),
    };
    check(before_init, sizeof before_init / sizeof before_init[0]);
    EXPECT_EQ(p_cuInit(0), CUDA_SUCCESS);

    /* No context is current yet. */
    const struct row no_context[] = {
        ROW(p_cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuMemAlloc_v2(&dptr, 16), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuMemGetInfo_v2(&size, &size), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuStreamCreate(&stream, 0), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuStreamIsCapturing(NULL, &capture), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuStreamBeginCapture_v2(NULL, 0), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuStreamEndCapture(NULL, &graph), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuEventCreate(&event, 0), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuCtxGetStreamPriorityRange(&least, &greatest), CUDA_ERROR_INVALID_CONTEXT),
        ROW(p_cuCtxGetId(NULL, &id), CUDA_ERROR_INVALID_CONTEXT),
    };
    check(no_context, sizeof no_context / sizeof no_context[0]);

    const struct row devices[] = {
        ROW(p_cuDeviceGetCount(NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE),
        ROW(p_cuDeviceGetName(NULL, sizeof text, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceGetName(text, sizeof text, -1), CUDA_ERROR_INVALID_DEVICE),
        ROW(p_cuDeviceGetUuid(NULL, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceTotalMem_v2(NULL, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceTotalMem_v2(&size, 999), CUDA_ERROR_INVALID_DEVICE),
        ROW(p_cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 999),
            CUDA_ERROR_INVALID_DEVICE),
        ROW(p_cuDeviceComputeCapability(&major, &minor, 999), CUDA_ERROR_INVALID_DEVICE),
        ROW(p_cuDeviceGetPCIBusId(NULL, 32, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceGetByPCIBusId(NULL, "0000:01:00.0"), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceGetByPCIBusId(&dev, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDevicePrimaryCtxRetain(NULL, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDevicePrimaryCtxRetain(&ctx, 999), CUDA_ERROR_INVALID_DEVICE),
        ROW(p_cuDevicePrimaryCtxGetState(999, &flags, &n), CUDA_ERROR_INVALID_DEVICE),
        ROW(p_cuCtxCreate_v2(NULL, 0, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuCtxCreate_v2(&ctx, 0, 999), CUDA_ERROR_INVALID_DEVICE),
        ROW(p_cuCtxGetCurrent(NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGetProcAddress(NULL, &fn, 12000, 0), CUDA_ERROR_INVALID_VALUE),
    };
    check(devices, sizeof devices / sizeof devices[0]);

    EXPECT_EQ(p_cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAlloc_v2(&dptr, 4096), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleLoadData(&module, sleep_kernel_ptx), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&func, module, "simgpu_sleep_ns"), CUDA_SUCCESS);

    const struct row in_context[] = {
        ROW(p_cuCtxGetDevice(NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemAlloc_v2(NULL, 16), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemGetInfo_v2(NULL, &size), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemGetInfo_v2(&size, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemAllocHost_v2(NULL, 16), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemAllocPitch_v2(NULL, &pitch, 64, 64, 4), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemAllocManaged(NULL, 16, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemcpyHtoD_v2(dptr, NULL, 16), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemcpyDtoH_v2(NULL, dptr, 16), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemAllocAsync(NULL, 16, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemPoolCreate(NULL, &pool_props), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemPoolCreate(&pool, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceGetDefaultMemPool(NULL, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuDeviceGetDefaultMemPool(&pool, 999), CUDA_ERROR_INVALID_DEVICE),
        ROW(p_cuMemGetAllocationGranularity(NULL, &alloc_prop,
                                            CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemGetAllocationGranularity(&size, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemCreate(NULL, 2 << 20, &alloc_prop, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuMemCreate(&handle, 2 << 20, NULL, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuArrayCreate_v2(NULL, &desc2), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuArrayCreate_v2(&array, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuArray3DCreate_v2(NULL, &desc3), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuArray3DCreate_v2(&array, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuStreamCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuStreamDestroy_v2(NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuStreamGetCtx(NULL, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuStreamIsCapturing(NULL, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuStreamBeginCapture_v2(CU_STREAM_PER_THREAD, 3), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuStreamBeginCapture_v2(NULL, 0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
        ROW(p_cuStreamBeginCapture_v2(CU_STREAM_LEGACY, 0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
        ROW(p_cuStreamEndCapture(CU_STREAM_PER_THREAD, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuStreamEndCapture(CU_STREAM_PER_THREAD, &graph), CUDA_ERROR_ILLEGAL_STATE),
        ROW(p_cuEventCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuEventRecord(NULL, NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuEventQuery(NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuEventSynchronize(NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuEventElapsedTime(&ms, NULL, NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuEventDestroy_v2(NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuModuleLoadData(NULL, sleep_kernel_ptx), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuModuleGetFunction(NULL, module, "simgpu_sleep_ns"), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuModuleGetFunction(&func, module, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuFuncGetAttribute(NULL, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, func),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphCreate(&graph, 1), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphAddMemAllocNode(&node, NULL, NULL, 0, &alloc_node), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphAddMemFreeNode(&node, NULL, NULL, 0, dptr), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphMemAllocNodeGetParams(NULL, &alloc_node), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphMemFreeNodeGetParams(NULL, &dptr), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphAddNode(&node, NULL, NULL, 0, &node_params), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphAddNode_v2(&node, NULL, NULL, NULL, 0, &node_params),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphAddNode_v3(&node, NULL, NULL, NULL, 0, &node_params),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphGetNodes(NULL, NULL, &size), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuGraphNodeGetType(NULL, &node_type), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuCtxGetId(NULL, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuStreamGetPriority(NULL, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuStreamGetFlags(NULL, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuStreamGetId(NULL, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuLibraryLoadData(NULL, sleep_kernel_ptx, NULL, NULL, 0, NULL, NULL, 0),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuLibraryLoadData(&library, NULL, NULL, NULL, 0, NULL, NULL, 0),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuLibraryLoadData(&library, sleep_kernel_ptx, NULL, NULL, 1, NULL, NULL, 0),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuLibraryLoadFromFile(&library, NULL, NULL, NULL, 0, NULL, NULL, 0),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuLibraryUnload(NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuLibraryGetKernel(&kernel, NULL, "simgpu_sleep_ns"), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuLibraryGetModule(NULL, NULL), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuKernelGetFunction(&func, NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuKernelGetName(&name, NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuFuncGetName(NULL, func), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuFuncGetName(&name, NULL), CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuFuncGetModule(NULL, func), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuOccupancyMaxActiveBlocksPerMultiprocessor(NULL, func, 128, 0),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, NULL, 128, 0),
            CUDA_ERROR_INVALID_HANDLE),
        ROW(p_cuOccupancyMaxPotentialBlockSize(NULL, &n, func, NULL, 0, 0),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuPointerGetAttribute(&flags, (CUpointer_attribute)999, dptr),
            CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuPointerGetAttributes(0, &attr, attr_data, dptr), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuPointerGetAttributes(1, NULL, attr_data, dptr), CUDA_ERROR_INVALID_VALUE),
        ROW(p_cuPointerGetAttributes(1, &attr, NULL, dptr), CUDA_ERROR_INVALID_VALUE),
    };
    check(in_context, sizeof in_context / sizeof in_context[0]);
}

static void nvml(void)
{
    void *lib = test_open("TEST_LIBNVML", "libnvidia-ml.so.1");
    LOAD(lib, nvmlInit_v2);
    LOAD(lib, nvmlShutdown);
    LOAD(lib, nvmlSystemGetDriverVersion);
    LOAD(lib, nvmlSystemGetNVMLVersion);
    LOAD(lib, nvmlSystemGetCudaDriverVersion);
    LOAD(lib, nvmlDeviceGetCount_v2);
    LOAD(lib, nvmlDeviceGetHandleByIndex_v2);
    LOAD(lib, nvmlDeviceGetHandleByUUID);
    LOAD(lib, nvmlDeviceGetHandleByPciBusId_v2);
    LOAD(lib, nvmlDeviceGetIndex);
    LOAD(lib, nvmlDeviceGetName);
    LOAD(lib, nvmlDeviceGetUUID);
    LOAD(lib, nvmlDeviceGetBrand);
    LOAD(lib, nvmlDeviceGetArchitecture);
    LOAD(lib, nvmlDeviceGetCudaComputeCapability);
    LOAD(lib, nvmlDeviceGetMinorNumber);
    LOAD(lib, nvmlDeviceGetPciInfo_v3);
    LOAD(lib, nvmlDeviceGetTemperature);
    LOAD(lib, nvmlDeviceGetPowerUsage);
    LOAD(lib, nvmlDeviceGetPowerManagementLimit);
    LOAD(lib, nvmlDeviceGetEnforcedPowerLimit);
    LOAD(lib, nvmlDeviceGetComputeMode);
    LOAD(lib, nvmlDeviceGetMemoryInfo);
    LOAD(lib, nvmlDeviceGetMemoryInfo_v2);
    LOAD(lib, nvmlDeviceGetUtilizationRates);
    LOAD(lib, nvmlDeviceGetComputeRunningProcesses_v3);
    LOAD(lib, nvmlDeviceGetProcessUtilization);
    LOAD(lib, nvmlDeviceGetMigMode);
    LOAD(lib, nvmlDeviceGetMaxMigDeviceCount);
    LOAD(lib, nvmlDeviceGetMigDeviceHandleByIndex);
    LOAD(lib, nvmlDeviceIsMigDeviceHandle);
    LOAD(lib, nvmlDeviceGetDeviceHandleFromMigDeviceHandle);
    LOAD(lib, nvmlDeviceGetGpuInstanceId);
    LOAD(lib, nvmlDeviceGetComputeInstanceId);

    unsigned int count = 0, value = 0;
    int major = 0, minor = 0;
    char text[96];
    nvmlDevice_t dev = NULL;
    nvmlPciInfo_t pci;
    nvmlMemory_t mem;
    nvmlMemory_v2_t mem2;
    nvmlUtilization_t util;
    nvmlBrandType_t brand;
    nvmlDeviceArchitecture_t arch;
    nvmlComputeMode_t mode;
    mem2.version = nvmlMemory_v2;

    const struct row before_init[] = {
        ROW(p_nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED),
        ROW(p_nvmlDeviceGetHandleByIndex_v2(0, &dev), NVML_ERROR_UNINITIALIZED),
        ROW(p_nvmlShutdown(), NVML_ERROR_UNINITIALIZED),
    };
    check(before_init, sizeof before_init / sizeof before_init[0]);
    EXPECT_EQ(p_nvmlInit_v2(), NVML_SUCCESS);
    EXPECT_EQ(p_nvmlDeviceGetHandleByIndex_v2(0, &dev), NVML_SUCCESS);

    const struct row null_args[] = {
        ROW(p_nvmlSystemGetDriverVersion(NULL, sizeof text), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlSystemGetNVMLVersion(NULL, sizeof text), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlSystemGetCudaDriverVersion(NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetCount_v2(NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetHandleByIndex_v2(0, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetHandleByUUID(NULL, &dev), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetHandleByPciBusId_v2(NULL, &dev), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetIndex(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetName(dev, NULL, sizeof text), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetUUID(dev, NULL, sizeof text), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetBrand(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetArchitecture(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetCudaComputeCapability(dev, NULL, &minor), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetCudaComputeCapability(dev, &major, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMinorNumber(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetPciInfo_v3(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetTemperature(dev, NVML_TEMPERATURE_GPU, NULL),
            NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetPowerUsage(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetPowerManagementLimit(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetEnforcedPowerLimit(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetComputeMode(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMemoryInfo(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMemoryInfo_v2(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetUtilizationRates(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetComputeRunningProcesses_v3(dev, NULL, NULL),
            NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetProcessUtilization(dev, NULL, NULL, 0), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMigMode(dev, NULL, &value), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMigMode(dev, &value, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMaxMigDeviceCount(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMigDeviceHandleByIndex(dev, 0, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceIsMigDeviceHandle(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetGpuInstanceId(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetComputeInstanceId(dev, NULL), NVML_ERROR_INVALID_ARGUMENT),
    };
    check(null_args, sizeof null_args / sizeof null_args[0]);

    /* MIG queries on a GPU that is not in MIG mode, and MIG-device queries on a GPU handle. */
    nvmlDevice_t other = NULL;
    const struct row not_mig[] = {
        ROW(p_nvmlDeviceGetMigDeviceHandleByIndex(dev, 0, &other), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(dev, &other), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetGpuInstanceId(dev, &value), NVML_ERROR_NOT_SUPPORTED),
        ROW(p_nvmlDeviceGetComputeInstanceId(dev, &value), NVML_ERROR_NOT_SUPPORTED),
    };
    check(not_mig, sizeof not_mig / sizeof not_mig[0]);

    /* A NULL device handle is an invalid argument to every device query. */
    const struct row null_device[] = {
        ROW(p_nvmlDeviceGetIndex(NULL, &value), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetName(NULL, text, sizeof text), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetUUID(NULL, text, sizeof text), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetBrand(NULL, &brand), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetArchitecture(NULL, &arch), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetCudaComputeCapability(NULL, &major, &minor),
            NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMinorNumber(NULL, &value), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetPciInfo_v3(NULL, &pci), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetTemperature(NULL, NVML_TEMPERATURE_GPU, &value),
            NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetPowerUsage(NULL, &value), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetComputeMode(NULL, &mode), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMemoryInfo(NULL, &mem), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMemoryInfo_v2(NULL, &mem2), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetUtilizationRates(NULL, &util), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetComputeRunningProcesses_v3(NULL, &value, NULL),
            NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMigMode(NULL, &value, &value), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMaxMigDeviceCount(NULL, &value), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetMigDeviceHandleByIndex(NULL, 0, &dev), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceIsMigDeviceHandle(NULL, &value), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(NULL, &dev),
            NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetGpuInstanceId(NULL, &value), NVML_ERROR_INVALID_ARGUMENT),
        ROW(p_nvmlDeviceGetComputeInstanceId(NULL, &value), NVML_ERROR_INVALID_ARGUMENT),
    };
    check(null_device, sizeof null_device / sizeof null_device[0]);
    EXPECT_EQ(p_nvmlShutdown(), NVML_SUCCESS);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuda();
    nvml();
    if (test_failures > 0) {
        printf("FAIL %d\n", test_failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
