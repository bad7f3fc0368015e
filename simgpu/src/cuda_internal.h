/* Process-local state of the simulated CUDA driver, shared by its source files. */
#ifndef SIMGPU_CUDA_INTERNAL_H
#define SIMGPU_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "log.h"
#include "runtime.h"
#include "cuda_driver_abi.h"

/* Handle validity: every object starts with a tag that is cleared when it is destroyed. */
enum sim_tag {
    TAG_CTX = 0x43545831,
    TAG_STREAM = 0x53545231,
    TAG_EVENT = 0x45564e31,
    TAG_MODULE = 0x4d4f4431,
    TAG_FUNCTION = 0x46554e31,
    TAG_POOL = 0x504f4f31,
    TAG_GRAPH = 0x47524131,
    TAG_GRAPH_EXEC = 0x47455831,
    TAG_GRAPH_NODE = 0x474e4431,
    TAG_ARRAY = 0x41525231,
    TAG_LIBRARY = 0x4c494231,
    TAG_KERNEL = 0x4b524e31,
};

struct CUstream_st {
    uint32_t tag;
    CUcontext ctx;
    unsigned int flags;
    int priority;
    uint64_t last_end_ns; /* when the last work queued on this stream completes */
    CUgraph capture;      /* the graph being captured from this stream, or NULL */
    unsigned long long id; /* cuStreamGetId: given on first request, unique in the process */
};

struct CUctx_st {
    uint32_t tag;
    CUdevice device;
    unsigned int flags;
    bool primary;
    int primary_refs;        /* primary contexts: retains minus releases */
    struct CUstream_st null; /* the context's default stream */
    uint64_t last_end_ns;    /* when all work queued in this context completes */
    uint64_t peers;          /* devices whose memory this context has peer access to (bits) */
    struct CUctx_st *next;   /* all live contexts of the process */
    unsigned long long id;   /* cuCtxGetId: given on first request, unique in the process */
};

struct CUevent_st {
    uint32_t tag;
    CUcontext ctx;
    unsigned int flags;
    bool recorded;
    uint64_t at_ns; /* when the work before the record point completes */
};

struct sim_cuda {
    pthread_mutex_t mu; /* guards all process-local objects below and in the other files */
    bool initialized;
    bool forked; /* set in a child forked after cuInit: CUDA does not survive fork */
    struct sim_runtime rt;
    struct CUctx_st primary[SIM_MAX_GPUS];
    struct CUctx_st *contexts;
    uint64_t alloc_attempts[SIM_MAX_GPUS]; /* for the fail_alloc fault */
};

extern struct sim_cuda sim_cuda;

/* The guard at the top of every entry point that needs cuInit: initialisation, fork, faults. */
CUresult sim_cuda_enter(void);
#define SIM_ENTER()                                                                               \
    do {                                                                                          \
        CUresult enter_rc_ = sim_cuda_enter();                                                    \
        if (enter_rc_ != CUDA_SUCCESS)                                                            \
            return enter_rc_;                                                                     \
    } while (0)

/* The stream priority range (cuCtxGetStreamPriorityRange); numerically lower is greater. */
#define SIM_STREAM_PRIORITY_LEAST 0
#define SIM_STREAM_PRIORITY_GREATEST (-5)

/* What a call touching a GPU that has fallen off the bus returns. */
#define SIM_CUDA_GPU_LOST CUDA_ERROR_DEVICE_UNAVAILABLE

CUresult sim_check_device(CUdevice dev); /* valid ordinal, not lost */

/*
 * CUDA_VISIBLE_DEVICES (read once, by cuInit): sim_cuda.rt.cfg.gpus[] holds the visible GPUs in
 * CUDA ordinal order, so a CUdevice indexes it directly. The shared state is indexed by the
 * physical GPU (the NVML index): go through sim_node_gpu() for anything in it.
 */
void sim_cuda_select_visible(struct sim_config *cfg, const char *visible);
static inline int sim_node_gpu(CUdevice dev)
{
    return sim_cuda.rt.cfg.gpus[dev].node_index;
}

/* Where the device's memory is accounted in the shared state: its GPU's, or, for a MIG
 * instance, the instance's own (its memory is its own; its kernels share the GPU's timeline). */
static inline int sim_node_mem(CUdevice dev)
{
    return sim_cuda.rt.cfg.gpus[dev].mem_domain;
}

/* The calling thread's current context, or NULL. */
CUcontext sim_current_ctx(void);
/* Current context, valid and on a GPU that is still there; else the matching error. */
CUresult sim_require_ctx(CUcontext *out);
bool sim_ctx_valid(CUcontext ctx); /* needs sim_cuda.mu */

/* What a NULL stream handle names: the context's legacy default stream (the plain entry points)
 * or the calling thread's per-thread default stream in it (the _ptsz/_ptds entry points). */
enum sim_default_stream { SIM_LEGACY, SIM_PER_THREAD };

/* Resolve a stream handle: NULL per `mode`, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD as named,
 * anything else must be a live stream. */
CUresult sim_resolve_stream(CUstream handle, enum sim_default_stream mode,
                            struct CUstream_st **out);

/* Sleep until the work queued on `stream` ends; CUDA_ERROR_DEVICE_UNAVAILABLE if the GPU was
 * lost meanwhile. */
CUresult sim_stream_wait(struct CUstream_st *stream);

/* Queue `duration_ns` of device work on `stream`. */
void sim_stream_submit(struct CUstream_st *stream, uint64_t duration_ns);

/* Stream capture: the graph a launch on `stream` is recorded into instead of run (NULL: run it).
 * Graphs (cuda_launch.c): an empty one, and appending a kernel node of a given duration.
 * Stream-ordered allocations and frees captured become memory nodes (cuda_graph_mem.c). */
CUgraph sim_stream_capture(struct CUstream_st *stream);
CUresult sim_graph_new(CUgraph *out);
CUresult sim_graph_append(CUgraph graph, uint64_t duration_ns);
CUresult sim_graph_capture_alloc(CUgraph graph, CUdevice dev, size_t bytes, CUdeviceptr *dptr);
CUresult sim_graph_capture_free(CUgraph graph, CUdeviceptr dptr);

/* A graph allocation freed by cuMemFree or cuMemFreeAsync: its memory goes back to the device's
 * graph memory cache. Needs mu. */
struct sim_alloc_rec;
void sim_graph_mem_free(struct sim_alloc_rec *rec);

/* Wait for everything queued in `ctx` (synchronous copies and cuCtxSynchronize). */
CUresult sim_ctx_wait(CUcontext ctx);

/* Memory: reserve device bytes on `gpu` for this process, honouring the fail_alloc fault. */
CUresult sim_devmem_reserve(int gpu, uint64_t bytes, uint32_t *handle);

/* Free every allocation that belongs to `ctx` (context destruction). */
void sim_memory_release_context(CUcontext ctx);
void sim_pools_release_context(CUcontext ctx);
void sim_arrays_release_context(CUcontext ctx);
/* A synchronisation point: pools give cached memory above their release threshold back. */
void sim_pools_trim_after_sync(CUdevice dev);

/* The configured CUDA driver version (cuDriverGetVersion), also before cuInit. */
int sim_driver_version(void);

/* The fallback for real entry points the simulator does not implement (cuda_stubs.c). */
void *sim_cuda_stub_lookup(const char *symbol);

#endif
