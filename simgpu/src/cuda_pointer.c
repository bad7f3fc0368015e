/*
 * Pointer attributes (cuPointerGetAttribute, cuPointerGetAttributes): what the driver knows
 * about an address - which allocation, context and device it belongs to and what kind of memory
 * it is. Each attribute is written with the type CUDA documents for it; booleans are one byte,
 * which also reads correctly into a zeroed int.
 */
#include <stdbool.h>
#include <string.h>

#include "cuda_memory.h"

/* The device ordinal cuPointerGetAttributes reports for an address CUDA does not know. */
#define UNKNOWN_DEVICE_ORDINAL (-2)

/* What the process knows about one address. */
struct pointer_info {
    bool known;
    CUcontext ctx;
    CUmemorytype type;
    bool managed;
    bool legacy_ipc;   /* a cuMemAlloc allocation cuIpcGetMemHandle accepts */
    bool host_access;  /* host memory or managed memory: the host may dereference it */
    uintptr_t base;
    size_t size;
    unsigned long long buffer_id, handle_types;
    CUmemoryPool pool;
};

static unsigned long long last_buffer_id; /* guarded by sim_cuda.mu */

static void look_up(uintptr_t ptr, struct pointer_info *info)
{
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_alloc_rec *r = sim_find_containing(ptr);
    uintptr_t base = 0;
    size_t size = 0;
    unsigned long long handle_types = 0;
    if (r != NULL) {
        if (r->buffer_id == 0)
            r->buffer_id = ++last_buffer_id;
        *info = (struct pointer_info){
            .known = true,
            .ctx = r->ctx,
            .type = r->kind == ALLOC_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE,
            .managed = r->kind == ALLOC_MANAGED,
            .legacy_ipc = r->kind == ALLOC_DEVICE,
            .host_access = r->kind == ALLOC_HOST || r->kind == ALLOC_MANAGED,
            .base = r->base,
            .size = r->size,
            .buffer_id = r->buffer_id,
            .pool = r->kind == ALLOC_POOL ? r->pool : NULL,
        };
    } else if (sim_vmm_mapping_at(ptr, &base, &size, &handle_types)) {
        /* A VMM mapping belongs to no context: report the caller's, as the memory is usable
         * wherever access was granted. Its id is its start, unique while it is mapped. */
        *info = (struct pointer_info){
            .known = true,
            .ctx = sim_current_ctx(),
            .type = CU_MEMORYTYPE_DEVICE,
            .base = base,
            .size = size,
            .buffer_id = base,
            .handle_types = handle_types,
        };
    }
    pthread_mutex_unlock(&sim_cuda.mu);
}

static void put_bool(void *data, bool value)
{
    *(unsigned char *)data = value ? 1 : 0;
}

/* One attribute. For an address CUDA does not know (which only cuPointerGetAttributes asks
 * about) that is a zero, NULL or false, and a device ordinal of -2. */
static CUresult attribute(void *data, CUpointer_attribute attr, const struct pointer_info *info,
                          uintptr_t ptr)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = info->ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = info->type;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = info->known ? ptr : 0; /* unified addressing: the same address */
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (info->known && !info->host_access)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = info->known ? (void *)ptr : NULL;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        put_bool(data, false);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        *(unsigned long long *)data = info->buffer_id;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        put_bool(data, info->managed);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = info->ctx != NULL ? info->ctx->device : UNKNOWN_DEVICE_ORDINAL;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        put_bool(data, info->legacy_ipc);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(CUdeviceptr *)data = info->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = info->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        put_bool(data, info->known);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned long long *)data = info->handle_types;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        *(unsigned int *)data = 0; /* no GPUDirect RDMA on a simulated node */
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned int *)data =
            info->known ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = info->pool;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: /* the nv-p2p kernel interface is not simulated */
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

SIMGPU_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute_,
                                          CUdeviceptr ptr)
{
    SIM_ENTER();
    if (data == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct pointer_info info;
    look_up((uintptr_t)ptr, &info);
    if (!info.known)
        return CUDA_ERROR_INVALID_VALUE; /* not allocated, mapped or registered by CUDA */
    return attribute(data, attribute_, &info, (uintptr_t)ptr);
}

SIMGPU_API CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                           CUpointer_attribute *attributes, void **data,
                                           CUdeviceptr ptr)
{
    SIM_ENTER();
    if (numAttributes == 0 || attributes == NULL || data == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct pointer_info info;
    look_up((uintptr_t)ptr, &info);
    for (unsigned int i = 0; i < numAttributes; i++) {
        if (data[i] == NULL)
            return CUDA_ERROR_INVALID_VALUE;
        CUresult rc = attribute(data[i], attributes[i], &info, (uintptr_t)ptr);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    return CUDA_SUCCESS;
}
