/*
 * Modules and functions. The simulator never runs device code: it reads an image only for the
 * names of its entry functions (cuda_image.c), and a function only needs to know how long a
 * launch of it occupies the GPU, which the configuration's [kernels] section says (a fixed
 * duration, or "param0": the first kernel parameter, a uint64 of nanoseconds), defaulting to
 * default_kernel_ns. Attributes and occupancy describe an H100-class multiprocessor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_module.h"

/* The multiprocessor the function attributes and occupancy figures describe. */
#define SM_MAX_WARPS 64
#define SM_MAX_BLOCKS 32
#define SM_REGISTERS 65536
#define SM_SHARED_BYTES 233472    /* 228 KiB usable by blocks */
#define BLOCK_RESERVED_SHARED 1024 /* the driver's share of each block's shared memory */
#define BLOCK_MAX_SHARED 232448    /* 227 KiB: the most one block may opt in to */
#define DEFAULT_DYNAMIC_SHARED 49152
#define FUNC_REGISTERS 32

const struct sim_func_attrs sim_default_func_attrs = {DEFAULT_DYNAMIC_SHARED, -1};

static int device_cc(CUdevice dev)
{
    const struct sim_gpu_config *g = &sim_cuda.rt.cfg.gpus[dev];
    return g->cc_major * 10 + g->cc_minor;
}

CUresult sim_module_load(CUcontext ctx, const void *image, size_t size, CUmodule *out)
{
    CUmodule m = calloc(1, sizeof *m);
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = sim_image_read(image, size, device_cc(ctx->device), &m->image);
    if (rc != CUDA_SUCCESS) {
        free(m);
        return rc;
    }
    m->tag = TAG_MODULE;
    m->ctx = ctx;
    *out = m;
    return CUDA_SUCCESS;
}

static CUresult load(CUmodule *module, const void *image, size_t size)
{
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_module_load(ctx, image, size, module);
}

SIMGPU_API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    SIM_ENTER();
    return load(module, image, SIM_IMAGE_SIZE_UNKNOWN);
}

SIMGPU_API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image,
                                       unsigned int numOptions, void *options,
                                       void **optionValues)
{
    SIM_ENTER();
    if (numOptions > 0 && (options == NULL || optionValues == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return load(module, image, SIM_IMAGE_SIZE_UNKNOWN);
}

SIMGPU_API CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    SIM_ENTER();
    return load(module, fatCubin, SIM_IMAGE_SIZE_UNKNOWN);
}

CUresult sim_read_image_file(const char *path, void **data, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return CUDA_ERROR_FILE_NOT_FOUND;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    CUresult rc = CUDA_SUCCESS;
    for (;;) {
        if (cap - len < 4096) {
            char *grown = realloc(buf, cap = cap * 2 + 8192);
            if (grown == NULL) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            buf = grown;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) {
            if (ferror(f))
                rc = CUDA_ERROR_FILE_NOT_FOUND;
            break;
        }
    }
    fclose(f);
    if (rc != CUDA_SUCCESS) {
        free(buf);
        return rc;
    }
    buf[len] = '\0'; /* PTX text from a file need not end in NUL; the reader needs one */
    *data = buf;
    *size = len + 1;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    SIM_ENTER();
    if (fname == NULL || module == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    void *data = NULL;
    size_t size = 0;
    CUresult rc = sim_read_image_file(fname, &data, &size);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = load(module, data, size);
    free(data);
    return rc;
}

bool sim_module_valid(CUmodule m)
{
    return m != NULL && m->tag == TAG_MODULE;
}

void sim_module_free(CUmodule module)
{
    for (struct CUfunc_st *f = module->functions, *next = NULL; f != NULL; f = next) {
        next = f->next;
        f->tag = 0;
        free(f);
    }
    sim_image_free(&module->image);
    free(module);
}

SIMGPU_API CUresult cuModuleUnload(CUmodule module)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    /* A library's modules go with the library (cuLibraryUnload), not on their own. */
    bool valid = sim_module_valid(module) && module->library == NULL;
    if (valid)
        module->tag = 0;
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_module_free(module);
    return CUDA_SUCCESS;
}

static const struct sim_kernel_config *kernel_config(const char *name)
{
    const struct sim_config *cfg = &sim_cuda.rt.cfg;
    for (int i = 0; i < cfg->kernel_count; i++) {
        if (strcmp(cfg->kernels[i].name, name) == 0)
            return &cfg->kernels[i];
    }
    return NULL;
}

/* Needs mu. */
static CUresult module_function_locked(CUmodule module, const char *name,
                                       const struct sim_func_attrs *attrs, CUfunction *out)
{
    if (!sim_module_valid(module))
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *f = module->functions;
    while (f != NULL && strcmp(f->name, name) != 0)
        f = f->next;
    if (f == NULL) {
        if (!sim_image_defines(&module->image, name))
            return CUDA_ERROR_NOT_FOUND;
        f = calloc(1, sizeof *f + strlen(name) + 1);
        if (f == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        f->tag = TAG_FUNCTION;
        f->module = module;
        f->kernel = kernel_config(name);
        f->attrs = attrs != NULL ? *attrs : sim_default_func_attrs;
        strcpy(f->name, name);
        f->next = module->functions;
        module->functions = f;
    }
    *out = f;
    return CUDA_SUCCESS;
}

CUresult sim_module_function(CUmodule module, const char *name,
                             const struct sim_func_attrs *attrs, CUfunction *out)
{
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = module_function_locked(module, name, attrs, out);
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule module, const char *name)
{
    SIM_ENTER();
    if (hfunc == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_module_function(module, name, NULL, hfunc);
}

bool sim_function_valid(CUfunction f)
{
    return f != NULL && f->tag == TAG_FUNCTION && sim_module_valid(f->module);
}

/* The function a handle names: the calls below take a library's CUkernel in place of a
 * CUfunction, meaning its function in the current context, as CUDA 12 allows. */
static CUresult resolve(CUfunction handle, CUfunction *out)
{
    if (sim_function_valid(handle)) {
        *out = handle;
        return CUDA_SUCCESS;
    }
    if (!sim_kernel_valid((CUkernel)handle))
        return CUDA_ERROR_INVALID_HANDLE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    return rc != CUDA_SUCCESS ? rc : sim_launch_function(handle, ctx, out);
}

SIMGPU_API CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    SIM_ENTER();
    if (name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = resolve(hfunc, &hfunc);
    if (rc != CUDA_SUCCESS)
        return rc;
    *name = hfunc->name;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
    SIM_ENTER();
    if (hmod == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = resolve(hfunc, &hfunc);
    if (rc != CUDA_SUCCESS)
        return rc;
    *hmod = hfunc->module;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                                       size_t *paramSize)
{
    SIM_ENTER();
    CUresult rc = resolve(func, &func);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_entry_param(sim_image_entry(&func->module->image, func->name), paramIndex,
                           paramOffset, paramSize);
}

CUresult sim_func_get_attribute(int *value, CUfunction_attribute attrib,
                                const struct sim_func_attrs *attrs, CUdevice dev)
{
    if (value == NULL || attrib < 0 || attrib >= CU_FUNC_ATTRIBUTE_SIMGPU_LIMIT)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *value = 1024;
        break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
        *value = FUNC_REGISTERS;
        break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
        *value = device_cc(dev);
        break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        *value = attrs->max_dynamic_shared;
        break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        *value = attrs->carveout;
        break;
    default:
        *value = 0;
    }
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attrib, CUfunction hfunc)
{
    SIM_ENTER();
    if (value == NULL || attrib < 0 || attrib >= CU_FUNC_ATTRIBUTE_SIMGPU_LIMIT)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = resolve(hfunc, &hfunc);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_func_get_attribute(value, attrib, &hfunc->attrs, hfunc->module->ctx->device);
}

CUresult sim_func_set_attribute(struct sim_func_attrs *attrs, CUfunction_attribute attrib,
                                int value)
{
    /* Only the attributes CUDA lets programs set; they do not change simulated timing. */
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if (value < 0 || value > BLOCK_MAX_SHARED)
            return CUDA_ERROR_INVALID_VALUE;
        attrs->max_dynamic_shared = value;
        return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        if (value < -1 || value > 100)
            return CUDA_ERROR_INVALID_VALUE;
        attrs->carveout = value;
        return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        return value >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

SIMGPU_API CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    SIM_ENTER();
    CUresult rc = resolve(hfunc, &hfunc);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_func_set_attribute(&hfunc->attrs, attrib, value);
}

SIMGPU_API CUresult cuFuncSetCacheConfig(CUfunction hfunc, int config)
{
    SIM_ENTER();
    CUresult rc = resolve(hfunc, &hfunc);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_check_cache_config(config);
}

/* ---- Occupancy: how many blocks of a size fit on one multiprocessor, by warps, registers,
 * shared memory and the block limit, whichever is tightest. ---- */

static int blocks_per_sm(int block_size, size_t dynamic_shared)
{
    int warps = (block_size + 31) / 32;
    int by_warps = SM_MAX_WARPS / warps;
    int by_regs = SM_REGISTERS / (warps * 32 * FUNC_REGISTERS);
    size_t per_block = dynamic_shared + BLOCK_RESERVED_SHARED;
    int by_shared = dynamic_shared > BLOCK_MAX_SHARED ? 0 : (int)(SM_SHARED_BYTES / per_block);
    int n = SM_MAX_BLOCKS;
    if (by_warps < n)
        n = by_warps;
    if (by_regs < n)
        n = by_regs;
    if (by_shared < n)
        n = by_shared;
    return n;
}

static CUresult occupancy(int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize,
                          unsigned int flags)
{
    SIM_ENTER();
    if (numBlocks == NULL || blockSize <= 0 || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = resolve(func, &func);
    if (rc != CUDA_SUCCESS)
        return rc;
    *numBlocks = blockSize > 1024 ? 0 : blocks_per_sm(blockSize, dynamicSMemSize);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                                int blockSize,
                                                                size_t dynamicSMemSize)
{
    return occupancy(numBlocks, func, blockSize, dynamicSMemSize, 0);
}

SIMGPU_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize, unsigned int flags)
{
    return occupancy(numBlocks, func, blockSize, dynamicSMemSize, flags);
}

/* The block size that keeps most threads resident per multiprocessor (the largest on a tie),
 * and the grid that fills the device with it. */
static CUresult potential_block_size(int *minGridSize, int *blockSize, CUfunction func,
                                     CUoccupancyB2DSize shared_of, size_t dynamicSMemSize,
                                     int blockSizeLimit, unsigned int flags)
{
    SIM_ENTER();
    if (minGridSize == NULL || blockSize == NULL || blockSizeLimit < 0 || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = resolve(func, &func);
    if (rc != CUDA_SUCCESS)
        return rc;
    int limit = blockSizeLimit == 0 || blockSizeLimit > 1024 ? 1024 : blockSizeLimit;
    int best_size = 0, best_blocks = 0;
    for (int size = limit; size > 0; size = size % 32 ? size - size % 32 : size - 32) {
        size_t shared = shared_of != NULL ? shared_of(size) : dynamicSMemSize;
        int blocks = blocks_per_sm(size, shared);
        if (blocks * size > best_blocks * best_size) {
            best_size = size;
            best_blocks = blocks;
        }
    }
    *blockSize = best_size;
    *minGridSize = best_blocks * sim_cuda.rt.cfg.gpus[func->module->ctx->device].sm_count;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize,
                                                     CUfunction func,
                                                     CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                     size_t dynamicSMemSize, int blockSizeLimit)
{
    return potential_block_size(minGridSize, blockSize, func, blockSizeToDynamicSMemSize,
                                dynamicSMemSize, blockSizeLimit, 0);
}

SIMGPU_API CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(
    int *minGridSize, int *blockSize, CUfunction func,
    CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize, int blockSizeLimit,
    unsigned int flags)
{
    return potential_block_size(minGridSize, blockSize, func, blockSizeToDynamicSMemSize,
                                dynamicSMemSize, blockSizeLimit, flags);
}

SIMGPU_API CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize,
                                                            CUfunction func, int numBlocks,
                                                            int blockSize)
{
    SIM_ENTER();
    if (dynamicSmemSize == NULL || numBlocks <= 0 || blockSize <= 0 || blockSize > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = resolve(func, &func);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (numBlocks > blocks_per_sm(blockSize, 0)) {
        *dynamicSmemSize = 0;
        return CUDA_SUCCESS;
    }
    size_t share = SM_SHARED_BYTES / (size_t)numBlocks - BLOCK_RESERVED_SHARED;
    *dynamicSmemSize = share > BLOCK_MAX_SHARED ? BLOCK_MAX_SHARED : share;
    return CUDA_SUCCESS;
}
