/*
 * Contexts: primary contexts (one per device, reference counted) and explicit ones, plus the
 * per-thread stack of current contexts.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "timeline.h"

#define CTX_STACK_DEPTH 64

static __thread CUcontext ctx_stack[CTX_STACK_DEPTH];
static __thread int ctx_depth;

CUcontext sim_current_ctx(void)
{
    return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

bool sim_ctx_valid(CUcontext ctx)
{
    return ctx != NULL && ctx->tag == TAG_CTX;
}

/* `ctx` if it can be used: a live context on a GPU that has not fallen off the bus. */
static CUresult usable_ctx(CUcontext ctx, CUcontext *out)
{
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = sim_ctx_valid(ctx);
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (sim_fault_gpu_lost(&sim_cuda.rt, ctx->device))
        return SIM_CUDA_GPU_LOST;
    *out = ctx;
    return CUDA_SUCCESS;
}

CUresult sim_require_ctx(CUcontext *out)
{
    return usable_ctx(sim_current_ctx(), out);
}

/* The context a CUDA 13 entry point names: NULL means the calling thread's current one. */
static CUresult named_ctx(CUcontext ctx, CUcontext *out)
{
    return usable_ctx(ctx != NULL ? ctx : sim_current_ctx(), out);
}

CUresult sim_ctx_wait(CUcontext ctx)
{
    pthread_mutex_lock(&sim_cuda.mu);
    uint64_t until = ctx->last_end_ns;
    pthread_mutex_unlock(&sim_cuda.mu);
    sim_sleep_until(until);
    /* The device may have fallen off the bus while we waited. */
    return sim_fault_gpu_lost(&sim_cuda.rt, ctx->device) ? SIM_CUDA_GPU_LOST : CUDA_SUCCESS;
}

/* NVML lists a process as running on a GPU (by NVML index) while it holds a context there.
 * Needs mu. */
static void publish_ctx_mask(void)
{
    uint32_t mask = 0;
    for (int i = 0; i < sim_cuda.rt.cfg.gpu_count; i++) {
        if (sim_cuda.primary[i].tag == TAG_CTX)
            mask |= 1u << sim_node_gpu(i);
    }
    for (CUcontext c = sim_cuda.contexts; c != NULL; c = c->next)
        mask |= 1u << sim_node_gpu(c->device);
    struct sim_node *node = &sim_cuda.rt.node;
    sim_node_lock(node);
    node->sh->procs[node->my_slot].ctx_mask = mask;
    sim_node_unlock(node);
}

static void ctx_init(CUcontext ctx, CUdevice dev, unsigned int flags, bool primary)
{
    ctx->tag = TAG_CTX;
    ctx->device = dev;
    ctx->flags = flags;
    ctx->primary = primary;
    ctx->last_end_ns = 0;
    memset(&ctx->null, 0, sizeof ctx->null);
    ctx->null.tag = TAG_STREAM;
    ctx->null.ctx = ctx;
}

/* Free what the context owns and make its handle invalid. Needs mu. */
static void ctx_teardown(CUcontext ctx)
{
    sim_memory_release_context(ctx);
    sim_pools_release_context(ctx);
    sim_arrays_release_context(ctx);
    ctx->tag = 0;
    ctx->null.tag = 0;
}

static void remove_from_thread_stack(CUcontext ctx)
{
    int kept = 0;
    for (int i = 0; i < ctx_depth; i++) {
        if (ctx_stack[i] != ctx)
            ctx_stack[kept++] = ctx_stack[i];
    }
    ctx_depth = kept;
}

static CUresult create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    SIM_ENTER();
    if (pctx == NULL || (flags & ~(unsigned int)CU_CTX_FLAGS_MASK) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_check_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (ctx_depth == CTX_STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&sim_cuda.mu);
    ctx_init(ctx, dev, flags, false);
    ctx->next = sim_cuda.contexts;
    sim_cuda.contexts = ctx;
    publish_ctx_mask();
    pthread_mutex_unlock(&sim_cuda.mu);
    ctx_stack[ctx_depth++] = ctx;
    *pctx = ctx;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return create(pctx, flags, dev);
}

/* Execution-affinity parameters (v3) and creation parameters (v4) only matter for MPS and
 * green contexts, which the simulator does not model. */
SIMGPU_API CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams,
                                   unsigned int flags, CUdevice dev)
{
    if (numParams < 0 || (numParams > 0 && paramsArray == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return create(pctx, flags, dev);
}

SIMGPU_API CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags,
                                   CUdevice dev)
{
    (void)ctxCreateParams;
    return create(pctx, flags, dev);
}

SIMGPU_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    if (!sim_ctx_valid(ctx) || ctx->primary) {
        pthread_mutex_unlock(&sim_cuda.mu);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    for (CUcontext *link = &sim_cuda.contexts; *link != NULL; link = &(*link)->next) {
        if (*link == ctx) {
            *link = ctx->next;
            break;
        }
    }
    ctx_teardown(ctx);
    publish_ctx_mask();
    pthread_mutex_unlock(&sim_cuda.mu);
    remove_from_thread_stack(ctx);
    /* The struct is deliberately not freed: other threads may still hold the handle, and a
     * stale handle must read as invalid rather than as freed memory. */
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = sim_ctx_valid(ctx);
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == CTX_STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    SIM_ENTER();
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext ctx = ctx_stack[--ctx_depth];
    if (pctx != NULL)
        *pctx = ctx;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    SIM_ENTER();
    if (ctx == NULL) {
        if (ctx_depth > 0)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = sim_ctx_valid(ctx);
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    SIM_ENTER();
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = sim_current_ctx();
    return CUDA_SUCCESS;
}

static CUresult ctx_get_device(CUdevice *device, CUcontext ctx)
{
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = named_ctx(ctx, &ctx);
    if (rc == CUDA_SUCCESS)
        *device = ctx->device;
    return rc;
}

SIMGPU_API CUresult cuCtxGetDevice(CUdevice *device)
{
    SIM_ENTER();
    return ctx_get_device(device, NULL);
}

/* CUDA 13.0: the device of any context, not only the current one. */
SIMGPU_API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    SIM_ENTER();
    return ctx_get_device(device, ctx);
}

SIMGPU_API CUresult cuCtxGetFlags(unsigned int *flags)
{
    SIM_ENTER();
    if (flags == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    *flags = ctx->flags;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    SIM_ENTER();
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx == NULL)
        ctx = sim_current_ctx();
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = sim_ctx_valid(ctx);
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020; /* contexts made through the _v2 API, which is all of them today */
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
    static unsigned long long last_id;
    SIM_ENTER();
    if (ctxId == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx == NULL)
        ctx = sim_current_ctx();
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = sim_ctx_valid(ctx);
    if (valid && ctx->id == 0)
        ctx->id = ++last_id;
    if (valid)
        *ctxId = ctx->id;
    pthread_mutex_unlock(&sim_cuda.mu);
    return valid ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* Stream priorities run from 0 (least, the default) to -5 (greatest), as on an H100. */
SIMGPU_API CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    SIM_ENTER();
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (leastPriority != NULL)
        *leastPriority = SIM_STREAM_PRIORITY_LEAST;
    if (greatestPriority != NULL)
        *greatestPriority = SIM_STREAM_PRIORITY_GREATEST;
    return CUDA_SUCCESS;
}

static CUresult ctx_synchronize(CUcontext ctx)
{
    CUresult rc = named_ctx(ctx, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = sim_ctx_wait(ctx);
    if (rc == CUDA_SUCCESS)
        sim_pools_trim_after_sync(ctx->device);
    return rc;
}

SIMGPU_API CUresult cuCtxSynchronize(void)
{
    SIM_ENTER();
    return ctx_synchronize(NULL);
}

/* CUDA 13.0: waits for any context's work, not only the current one's. */
SIMGPU_API CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    SIM_ENTER();
    return ctx_synchronize(ctx);
}

/* CUDA 12.5 (what CUDA 13 clients ask for): a stream's context, and its green context, which
 * the simulator never has. `get` is the legacy or the per-thread default stream's lookup. */
static CUresult stream_get_ctx_v2(CUresult (*get)(CUstream, CUcontext *), CUstream stream,
                                  CUcontext *pctx, CUgreenCtx *pGreenCtx)
{
    if (pctx == NULL || pGreenCtx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = get(stream, pctx);
    if (rc == CUDA_SUCCESS)
        *pGreenCtx = NULL;
    return rc;
}

SIMGPU_API CUresult cuStreamGetCtx_v2(CUstream stream, CUcontext *pctx, CUgreenCtx *pGreenCtx)
{
    return stream_get_ctx_v2(cuStreamGetCtx, stream, pctx, pGreenCtx);
}

SIMGPU_API CUresult cuStreamGetCtx_v2_ptsz(CUstream stream, CUcontext *pctx, CUgreenCtx *pGreenCtx)
{
    return stream_get_ctx_v2(cuStreamGetCtx_ptsz, stream, pctx, pGreenCtx);
}

SIMGPU_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    SIM_ENTER();
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_check_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    CUcontext ctx = &sim_cuda.primary[dev];
    if (ctx->primary_refs == 0) {
        unsigned int flags = ctx->flags; /* kept from cuDevicePrimaryCtxSetFlags */
        ctx_init(ctx, dev, flags, true);
        publish_ctx_mask();
    }
    ctx->primary_refs++;
    pthread_mutex_unlock(&sim_cuda.mu);
    *pctx = ctx;
    return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev)
{
    SIM_ENTER();
    if (dev < 0 || dev >= sim_cuda.rt.cfg.gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&sim_cuda.mu);
    CUcontext ctx = &sim_cuda.primary[dev];
    CUresult rc = CUDA_SUCCESS;
    if (ctx->primary_refs == 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--ctx->primary_refs == 0) {
        ctx_teardown(ctx);
        publish_ctx_mask();
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_release(dev);
}

SIMGPU_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_release(dev);
}

static CUresult primary_reset(CUdevice dev)
{
    SIM_ENTER();
    if (dev < 0 || dev >= sim_cuda.rt.cfg.gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&sim_cuda.mu);
    CUcontext ctx = &sim_cuda.primary[dev];
    if (ctx->primary_refs > 0) {
        ctx_teardown(ctx);
        ctx->primary_refs = 0;
        publish_ctx_mask();
    }
    ctx->flags = 0;
    pthread_mutex_unlock(&sim_cuda.mu);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_reset(dev);
}

SIMGPU_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_reset(dev);
}

SIMGPU_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    SIM_ENTER();
    if (flags == NULL || active == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= sim_cuda.rt.cfg.gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&sim_cuda.mu);
    *flags = sim_cuda.primary[dev].flags;
    *active = sim_cuda.primary[dev].primary_refs > 0;
    pthread_mutex_unlock(&sim_cuda.mu);
    return CUDA_SUCCESS;
}

static CUresult primary_set_flags(CUdevice dev, unsigned int flags)
{
    SIM_ENTER();
    if (dev < 0 || dev >= sim_cuda.rt.cfg.gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    if ((flags & ~(unsigned int)CU_CTX_FLAGS_MASK) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    sim_cuda.primary[dev].flags = flags;
    pthread_mutex_unlock(&sim_cuda.mu);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return primary_set_flags(dev, flags);
}

SIMGPU_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    return primary_set_flags(dev, flags);
}
