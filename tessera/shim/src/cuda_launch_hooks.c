/*
 * Kernel and graph launches. Uncapped (no limits, or no GPU of the claim capped), every launch
 * hook is one load of a flag and a call through: the controller costs nothing. Capped, launches
 * go through the compute controller (compute.c). Each entry point exists in the legacy and the
 * per-thread-default-stream (_ptsz) flavour, each calling its own real counterpart.
 */
#include "compute.h"
#include "shim_state.h"

#define PASSTHROUGH() SHIM_LIKELY(__atomic_load_n(&shim_launch_passthrough, __ATOMIC_RELAXED))

/* The first launch of a process, or a capped one. */
static bool launch_uncapped(void)
{
    shim_init();
    return __atomic_load_n(&shim_launch_passthrough, __ATOMIC_RELAXED) != 0;
}

#define KERNEL_ARGS                                                                               \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,             \
        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,   \
        void **extra

static CUresult launch_kernel(__typeof__(&cuLaunchKernel) real, bool ptsz, KERNEL_ARGS)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (launch_uncapped())
        return real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
    struct shim_launch l;
    shim_compute_begin(&l, shim_launch_key(f, gx, gy, gz, bx, by, bz, shared), stream, ptsz);
    CUresult rc = real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
    shim_compute_end(&l, rc);
    return rc;
}

SHIM_EXPORT CUresult cuLaunchKernel(KERNEL_ARGS)
{
    if (PASSTHROUGH())
        return shim_real.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
    return launch_kernel(shim_real.cuLaunchKernel, false, f, gx, gy, gz, bx, by, bz, shared,
                         stream, params, extra);
}

SHIM_EXPORT CUresult cuLaunchKernel_ptsz(KERNEL_ARGS)
{
    if (PASSTHROUGH() && shim_real.cuLaunchKernel_ptsz != NULL)
        return shim_real.cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params,
                                             extra);
    shim_init();
    return launch_kernel(shim_real.cuLaunchKernel_ptsz, true, f, gx, gy, gz, bx, by, bz, shared,
                         stream, params, extra);
}

#define COOP_ARGS                                                                                 \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,             \
        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params

static CUresult launch_coop(__typeof__(&cuLaunchCooperativeKernel) real, bool ptsz, COOP_ARGS)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (launch_uncapped())
        return real(f, gx, gy, gz, bx, by, bz, shared, stream, params);
    struct shim_launch l;
    shim_compute_begin(&l, shim_launch_key(f, gx, gy, gz, bx, by, bz, shared), stream, ptsz);
    CUresult rc = real(f, gx, gy, gz, bx, by, bz, shared, stream, params);
    shim_compute_end(&l, rc);
    return rc;
}

SHIM_EXPORT CUresult cuLaunchCooperativeKernel(COOP_ARGS)
{
    shim_init();
    if (PASSTHROUGH() && shim_real.cuLaunchCooperativeKernel != NULL)
        return shim_real.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream,
                                                   params);
    return launch_coop(shim_real.cuLaunchCooperativeKernel, false, f, gx, gy, gz, bx, by, bz,
                       shared, stream, params);
}

SHIM_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(COOP_ARGS)
{
    shim_init();
    return launch_coop(shim_real.cuLaunchCooperativeKernel_ptsz, true, f, gx, gy, gz, bx, by, bz,
                       shared, stream, params);
}

static CUresult launch_ex(__typeof__(&cuLaunchKernelEx) real, bool ptsz,
                          const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (launch_uncapped() || config == NULL)
        return real(config, f, params, extra);
    struct shim_launch l;
    uint64_t key = shim_launch_key(f, config->gridDimX, config->gridDimY, config->gridDimZ,
                                   config->blockDimX, config->blockDimY, config->blockDimZ,
                                   config->sharedMemBytes);
    shim_compute_begin(&l, key, config->hStream, ptsz);
    CUresult rc = real(config, f, params, extra);
    shim_compute_end(&l, rc);
    return rc;
}

SHIM_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                      void **extra)
{
    shim_init();
    return launch_ex(shim_real.cuLaunchKernelEx, false, config, f, params, extra);
}

SHIM_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                           void **params, void **extra)
{
    shim_init();
    return launch_ex(shim_real.cuLaunchKernelEx_ptsz, true, config, f, params, extra);
}

/* A graph is charged as one launch whose duration is the whole graph's. */
static CUresult launch_graph(__typeof__(&cuGraphLaunch) real, bool ptsz, CUgraphExec exec,
                             CUstream stream)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (launch_uncapped())
        return real(exec, stream);
    struct shim_launch l;
    shim_compute_begin(&l, shim_launch_key(exec, 0, 0, 0, 0, 0, 0, 0), stream, ptsz);
    CUresult rc = real(exec, stream);
    shim_compute_end(&l, rc);
    return rc;
}

SHIM_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    shim_init();
    return launch_graph(shim_real.cuGraphLaunch, false, exec, stream);
}

SHIM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    shim_init();
    return launch_graph(shim_real.cuGraphLaunch_ptsz, true, exec, stream);
}
