/*
 * Peer access between the simulated GPUs of one process, and copies between their memory. Every
 * simulated GPU can reach every other (as on an NVLink or PCIe switch machine); enabling access
 * is recorded per context, with the real driver's errors for enabling twice or disabling what
 * was not enabled. Copies move the bytes at once, after the work queued in both contexts (the
 * synchronous forms) or in stream order (the asynchronous ones), like the other copies
 * (cuda_memory.c). Kernels do not touch memory in the simulator, so access that was not enabled
 * is not a fault here.
 */
#include <string.h>

#include "cuda_memory.h"

SIMGPU_API CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    SIM_ENTER();
    if (canAccessPeer == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_check_device(dev);
    if (rc == CUDA_SUCCESS)
        rc = sim_check_device(peerDev);
    if (rc != CUDA_SUCCESS)
        return rc;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

/* The peer of the current context `cur`, checked; the bit of the peer's device. Needs mu. */
static CUresult peer_bit(CUcontext peer, CUcontext *cur, uint64_t *bit)
{
    if (peer == NULL || !sim_ctx_valid(peer))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (peer->device == (*cur)->device)
        return CUDA_ERROR_INVALID_DEVICE;
    *bit = 1ULL << peer->device;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    SIM_ENTER();
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext cur = NULL;
    uint64_t bit = 0;
    CUresult rc = sim_require_ctx(&cur);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    rc = peer_bit(peerContext, &cur, &bit);
    if (rc == CUDA_SUCCESS && (cur->peers & bit) != 0)
        rc = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    if (rc == CUDA_SUCCESS)
        cur->peers |= bit;
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    SIM_ENTER();
    CUcontext cur = NULL;
    uint64_t bit = 0;
    CUresult rc = sim_require_ctx(&cur);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    rc = peer_bit(peerContext, &cur, &bit);
    if (rc == CUDA_SUCCESS && (cur->peers & bit) == 0)
        rc = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    if (rc == CUDA_SUCCESS)
        cur->peers &= ~bit;
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

static bool live_ctx(CUcontext ctx)
{
    pthread_mutex_lock(&sim_cuda.mu);
    bool ok = ctx != NULL && sim_ctx_valid(ctx);
    pthread_mutex_unlock(&sim_cuda.mu);
    return ok;
}

static CUresult copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                          size_t bytes, CUstream stream, bool sync, enum sim_default_stream mode)
{
    SIM_ENTER();
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!live_ctx(dst_ctx) || !live_ctx(src_ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes == 0)
        return CUDA_SUCCESS;
    if (!sim_device_range_valid((uintptr_t)dst, bytes) ||
        !sim_device_range_valid((uintptr_t)src, bytes))
        return CUDA_ERROR_INVALID_VALUE;
    if (sync) {
        if ((rc = sim_ctx_wait(src_ctx)) != CUDA_SUCCESS || (rc = sim_ctx_wait(dst_ctx)) != CUDA_SUCCESS)
            return rc;
    } else {
        struct CUstream_st *s = NULL;
        if ((rc = sim_resolve_stream(stream, mode, &s)) != CUDA_SUCCESS)
            return rc;
    }
    memmove((void *)dst, (const void *)src, bytes);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                 CUcontext srcContext, size_t ByteCount)
{
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, NULL, true,
                     SIM_LEGACY);
}

SIMGPU_API CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext,
                                      CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount)
{
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, NULL, true,
                     SIM_PER_THREAD);
}

SIMGPU_API CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                                      CUdeviceptr srcDevice, CUcontext srcContext,
                                      size_t ByteCount, CUstream hStream)
{
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, false,
                     SIM_LEGACY);
}

SIMGPU_API CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext,
                                           CUdeviceptr srcDevice, CUcontext srcContext,
                                           size_t ByteCount, CUstream hStream)
{
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, false,
                     SIM_PER_THREAD);
}
