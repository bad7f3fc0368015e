/*
 * CUDA arrays: opaque device memory, counted against the GPU like any allocation and, like any
 * allocation, freed with the context that made them.
 */
#include <stdlib.h>

#include "cuda_internal.h"
#include "devmem.h"

struct CUarray_st {
    uint32_t tag;
    CUDA_ARRAY3D_DESCRIPTOR desc;
    CUcontext ctx;
    uint32_t handle;
    struct CUarray_st *next; /* the process's live arrays */
};

static struct CUarray_st *arrays; /* guarded by sim_cuda.mu */

/* Give the array's memory back and make its handle invalid. Needs mu. */
static void release(CUarray a)
{
    for (CUarray *link = &arrays; *link != NULL; link = &(*link)->next) {
        if (*link == a) {
            *link = a->next;
            break;
        }
    }
    a->tag = 0;
    sim_mem_release(&sim_cuda.rt.node, a->handle);
}

void sim_arrays_release_context(CUcontext ctx)
{
    for (CUarray a = arrays, next = NULL; a != NULL; a = next) {
        next = a->next;
        /* Not freed: the program may still hold the handle, which must read as invalid. */
        if (a->ctx == ctx)
            release(a);
    }
}

static size_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    }
    return 0;
}

static CUresult create(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    size_t elem = format_bytes(desc->Format);
    unsigned int ch = desc->NumChannels;
    if (elem == 0 || (ch != 1 && ch != 2 && ch != 4) || desc->Width == 0 ||
        (desc->Depth > 0 && desc->Height == 0))
        return CUDA_ERROR_INVALID_VALUE;
    size_t h = desc->Height > 0 ? desc->Height : 1, d = desc->Depth > 0 ? desc->Depth : 1;
    if (desc->Width > SIZE_MAX / h / d / elem / ch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUarray a = calloc(1, sizeof *a);
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = sim_devmem_reserve(ctx->device, desc->Width * h * d * elem * ch, &a->handle);
    if (rc != CUDA_SUCCESS) {
        free(a);
        return rc;
    }
    a->tag = TAG_ARRAY;
    a->desc = *desc;
    a->ctx = ctx;
    pthread_mutex_lock(&sim_cuda.mu);
    a->next = arrays;
    arrays = a;
    pthread_mutex_unlock(&sim_cuda.mu);
    *array = a;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    SIM_ENTER();
    if (array == NULL || desc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = desc->Width, .Height = desc->Height,
                                  .Format = desc->Format, .NumChannels = desc->NumChannels};
    return create(array, &d3);
}

SIMGPU_API CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    SIM_ENTER();
    if (array == NULL || desc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return create(array, desc);
}

SIMGPU_API CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *desc, CUarray array)
{
    SIM_ENTER();
    if (desc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (array == NULL || array->tag != TAG_ARRAY)
        return CUDA_ERROR_INVALID_HANDLE;
    desc->Width = array->desc.Width;
    desc->Height = array->desc.Height;
    desc->Format = array->desc.Format;
    desc->NumChannels = array->desc.NumChannels;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuArrayDestroy(CUarray array)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = array != NULL && array->tag == TAG_ARRAY;
    if (valid)
        release(array);
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_HANDLE;
    free(array);
    return CUDA_SUCCESS;
}
