/*
 * Streams and events. A stream only remembers when its last queued work ends; the device
 * timeline (timeline.c) decides when work actually runs. Synchronisation sleeps until then.
 */
#include <stdlib.h>

#include "cuda_internal.h"
#include "timeline.h"

/*
 * Per-thread default streams: one per thread and context, made on first use. A context's handle
 * is never reused for another context (destroyed contexts are not freed), so a stale entry can
 * only ever name its own context again. Entries are freed when their thread exits.
 */
struct per_thread_stream {
    struct CUstream_st stream;
    struct per_thread_stream *next;
};

static __thread struct per_thread_stream *per_thread_streams;
static pthread_key_t per_thread_key;
static pthread_once_t per_thread_once = PTHREAD_ONCE_INIT;

static void free_per_thread_streams(void *head)
{
    for (struct per_thread_stream *p = head, *next; p != NULL; p = next) {
        next = p->next;
        free(p);
    }
}

static void make_per_thread_key(void)
{
    if (pthread_key_create(&per_thread_key, free_per_thread_streams) != 0)
        sim_log("cannot register per-thread stream cleanup; they leak at thread exit");
}

static CUresult per_thread_stream(CUcontext ctx, struct CUstream_st **out)
{
    for (struct per_thread_stream *p = per_thread_streams; p != NULL; p = p->next) {
        if (p->stream.ctx == ctx) {
            *out = &p->stream;
            return CUDA_SUCCESS;
        }
    }
    struct per_thread_stream *p = calloc(1, sizeof *p);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->stream.tag = TAG_STREAM;
    p->stream.ctx = ctx;
    p->next = per_thread_streams;
    per_thread_streams = p;
    pthread_once(&per_thread_once, make_per_thread_key);
    pthread_setspecific(per_thread_key, per_thread_streams);
    *out = &p->stream;
    return CUDA_SUCCESS;
}

CUresult sim_resolve_stream(CUstream handle, enum sim_default_stream mode,
                            struct CUstream_st **out)
{
    if (handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
        CUcontext ctx = NULL;
        CUresult rc = sim_require_ctx(&ctx);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (handle == CU_STREAM_PER_THREAD ||
            (handle == NULL && mode == SIM_PER_THREAD))
            return per_thread_stream(ctx, out);
        *out = &ctx->null;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = handle->tag == TAG_STREAM && sim_ctx_valid(handle->ctx);
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_HANDLE;
    if (sim_fault_gpu_lost(&sim_cuda.rt, handle->ctx->device))
        return SIM_CUDA_GPU_LOST;
    *out = handle;
    return CUDA_SUCCESS;
}

CUresult sim_stream_wait(struct CUstream_st *stream)
{
    pthread_mutex_lock(&sim_cuda.mu);
    uint64_t until = stream->last_end_ns;
    pthread_mutex_unlock(&sim_cuda.mu);
    sim_sleep_until(until);
    return sim_fault_gpu_lost(&sim_cuda.rt, stream->ctx->device) ? SIM_CUDA_GPU_LOST
                                                                 : CUDA_SUCCESS;
}

void sim_stream_submit(struct CUstream_st *stream, uint64_t duration_ns)
{
    CUcontext ctx = stream->ctx;
    pthread_mutex_lock(&sim_cuda.mu);
    uint64_t after = stream->last_end_ns;
    pthread_mutex_unlock(&sim_cuda.mu);
    uint64_t end = sim_tl_submit(&sim_cuda.rt.node, sim_node_gpu(ctx->device), after, duration_ns);
    pthread_mutex_lock(&sim_cuda.mu);
    if (end > stream->last_end_ns)
        stream->last_end_ns = end;
    if (end > ctx->last_end_ns)
        ctx->last_end_ns = end;
    pthread_mutex_unlock(&sim_cuda.mu);
}

static CUresult create(CUstream *stream, unsigned int flags, int priority)
{
    if (stream == NULL || (flags & ~(unsigned int)CU_STREAM_NON_BLOCKING) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->tag = TAG_STREAM;
    s->ctx = ctx;
    s->flags = flags;
    /* Priorities outside the range are clamped to it, as documented. */
    s->priority = priority > SIM_STREAM_PRIORITY_LEAST      ? SIM_STREAM_PRIORITY_LEAST
                  : priority < SIM_STREAM_PRIORITY_GREATEST ? SIM_STREAM_PRIORITY_GREATEST
                                                            : priority;
    *stream = s;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    SIM_ENTER();
    return create(stream, flags, 0);
}

SIMGPU_API CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags, int priority)
{
    SIM_ENTER();
    return create(stream, flags, priority);
}

SIMGPU_API CUresult cuStreamDestroy_v2(CUstream stream)
{
    SIM_ENTER();
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = stream->tag == TAG_STREAM;
    if (valid)
        stream->tag = 0;
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_HANDLE;
    if (stream->capture != NULL) /* a capture in progress is abandoned with its stream */
        cuGraphDestroy(stream->capture);
    free(stream); /* queued work still completes on the device timeline */
    return CUDA_SUCCESS;
}

static CUresult stream_synchronize(CUstream stream, enum sim_default_stream mode)
{
    SIM_ENTER();
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc == CUDA_SUCCESS)
        rc = sim_stream_wait(s);
    if (rc == CUDA_SUCCESS)
        sim_pools_trim_after_sync(s->ctx->device);
    return rc;
}

SIMGPU_API CUresult cuStreamSynchronize(CUstream stream)
{
    return stream_synchronize(stream, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamSynchronize_ptsz(CUstream stream)
{
    return stream_synchronize(stream, SIM_PER_THREAD);
}

static CUresult stream_query(CUstream stream, enum sim_default_stream mode)
{
    SIM_ENTER();
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    bool done = sim_now_ns() >= s->last_end_ns;
    pthread_mutex_unlock(&sim_cuda.mu);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIMGPU_API CUresult cuStreamQuery(CUstream stream)
{
    return stream_query(stream, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamQuery_ptsz(CUstream stream)
{
    return stream_query(stream, SIM_PER_THREAD);
}

/*
 * Stream capture, minimal: between cuStreamBeginCapture and cuStreamEndCapture, kernel and graph
 * launches on the stream are appended to a graph instead of run (cuda_launch.c), and
 * cuStreamEndCapture hands that graph over; launching it runs the captured kernels' durations.
 * Only the capturing stream records (no cross-stream capture through events); other work on it
 * (copies, memsets, events, stream-ordered allocations) still happens at once.
 */
CUgraph sim_stream_capture(struct CUstream_st *stream)
{
    pthread_mutex_lock(&sim_cuda.mu);
    CUgraph g = stream->capture;
    pthread_mutex_unlock(&sim_cuda.mu);
    return g;
}

static CUresult begin_capture(CUstream stream, unsigned int mode, enum sim_default_stream dflt)
{
    SIM_ENTER();
    if (mode > 2) /* CU_STREAM_CAPTURE_MODE_GLOBAL, _THREAD_LOCAL, _RELAXED */
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, dflt, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (s == &s->ctx->null) /* the legacy default stream cannot be captured */
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CUgraph g = NULL;
    rc = sim_graph_new(&g);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    bool busy = s->capture != NULL;
    if (!busy)
        s->capture = g;
    pthread_mutex_unlock(&sim_cuda.mu);
    if (busy) {
        cuGraphDestroy(g);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamBeginCapture(CUstream stream)
{
    return begin_capture(stream, 0, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamBeginCapture_ptsz(CUstream stream)
{
    return begin_capture(stream, 0, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuStreamBeginCapture_v2(CUstream stream, unsigned int mode)
{
    return begin_capture(stream, mode, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, unsigned int mode)
{
    return begin_capture(stream, mode, SIM_PER_THREAD);
}

static CUresult end_capture(CUstream stream, CUgraph *graph, enum sim_default_stream dflt)
{
    SIM_ENTER();
    if (graph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, dflt, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    CUgraph g = s->capture;
    s->capture = NULL;
    pthread_mutex_unlock(&sim_cuda.mu);
    if (g == NULL)
        return CUDA_ERROR_ILLEGAL_STATE; /* not capturing */
    *graph = g;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph)
{
    return end_capture(stream, graph, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph *graph)
{
    return end_capture(stream, graph, SIM_PER_THREAD);
}

static CUresult stream_is_capturing(CUstream stream, CUstreamCaptureStatus *status,
                                    enum sim_default_stream mode)
{
    SIM_ENTER();
    if (status == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    *status = sim_stream_capture(s) != NULL ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                            : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *captureStatus)
{
    return stream_is_capturing(stream, captureStatus, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamIsCapturing_ptsz(CUstream stream,
                                             CUstreamCaptureStatus *captureStatus)
{
    return stream_is_capturing(stream, captureStatus, SIM_PER_THREAD);
}

static bool event_valid(CUevent event)
{
    return event != NULL && event->tag == TAG_EVENT;
}

static CUresult stream_wait_event(CUstream stream, CUevent event, unsigned int flags,
                                  enum sim_default_stream mode)
{
    SIM_ENTER();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    rc = CUDA_ERROR_INVALID_HANDLE;
    if (event_valid(event)) {
        if (event->recorded && event->at_ns > s->last_end_ns)
            s->last_end_ns = event->at_ns;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
    return stream_wait_event(stream, event, flags, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned int flags)
{
    return stream_wait_event(stream, event, flags, SIM_PER_THREAD);
}

static CUresult stream_get_ctx(CUstream stream, CUcontext *pctx, enum sim_default_stream mode)
{
    SIM_ENTER();
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc == CUDA_SUCCESS)
        *pctx = s->ctx;
    return rc;
}

SIMGPU_API CUresult cuStreamGetCtx(CUstream stream, CUcontext *pctx)
{
    return stream_get_ctx(stream, pctx, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamGetCtx_ptsz(CUstream stream, CUcontext *pctx)
{
    return stream_get_ctx(stream, pctx, SIM_PER_THREAD);
}

/* A stream's priority, flags, id and device; the default streams have priority 0 and no
 * flags. */
enum stream_query { QUERY_PRIORITY, QUERY_FLAGS, QUERY_ID, QUERY_DEVICE };

static CUresult stream_property(CUstream stream, enum stream_query what, void *out,
                                enum sim_default_stream mode)
{
    static unsigned long long last_id;
    SIM_ENTER();
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    switch (what) {
    case QUERY_PRIORITY:
        *(int *)out = s->priority;
        break;
    case QUERY_FLAGS:
        *(unsigned int *)out = s->flags;
        break;
    case QUERY_ID:
        if (s->id == 0)
            s->id = ++last_id;
        *(unsigned long long *)out = s->id;
        break;
    case QUERY_DEVICE:
        *(CUdevice *)out = s->ctx->device;
        break;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuStreamGetPriority(CUstream stream, int *priority)
{
    return stream_property(stream, QUERY_PRIORITY, priority, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamGetPriority_ptsz(CUstream stream, int *priority)
{
    return stream_property(stream, QUERY_PRIORITY, priority, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuStreamGetFlags(CUstream stream, unsigned int *flags)
{
    return stream_property(stream, QUERY_FLAGS, flags, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamGetFlags_ptsz(CUstream stream, unsigned int *flags)
{
    return stream_property(stream, QUERY_FLAGS, flags, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuStreamGetId(CUstream stream, unsigned long long *streamId)
{
    return stream_property(stream, QUERY_ID, streamId, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamGetId_ptsz(CUstream stream, unsigned long long *streamId)
{
    return stream_property(stream, QUERY_ID, streamId, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuStreamGetDevice(CUstream hStream, CUdevice *device)
{
    return stream_property(hStream, QUERY_DEVICE, device, SIM_LEGACY);
}

SIMGPU_API CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice *device)
{
    return stream_property(hStream, QUERY_DEVICE, device, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    SIM_ENTER();
    const unsigned int known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                               CU_EVENT_INTERPROCESS;
    if (event == NULL || (flags & ~known) != 0 ||
        ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->tag = TAG_EVENT;
    e->ctx = ctx;
    e->flags = flags;
    *event = e;
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent event, CUstream stream, enum sim_default_stream mode)
{
    SIM_ENTER();
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t now = sim_now_ns();
    pthread_mutex_lock(&sim_cuda.mu);
    rc = CUDA_ERROR_INVALID_HANDLE;
    if (event_valid(event) && event->ctx == s->ctx) {
        event->recorded = true;
        event->at_ns = s->last_end_ns > now ? s->last_end_ns : now;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuEventRecord(CUevent event, CUstream stream)
{
    return event_record(event, stream, SIM_LEGACY);
}

SIMGPU_API CUresult cuEventRecord_ptsz(CUevent event, CUstream stream)
{
    return event_record(event, stream, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuEventQuery(CUevent event)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;
    if (event_valid(event))
        rc = !event->recorded || sim_now_ns() >= event->at_ns ? CUDA_SUCCESS
                                                               : CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuEventSynchronize(CUevent event)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = event_valid(event);
    uint64_t until = valid && event->recorded ? event->at_ns : 0;
    CUdevice dev = valid ? event->ctx->device : 0;
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_sleep_until(until);
    if (sim_fault_gpu_lost(&sim_cuda.rt, dev))
        return SIM_CUDA_GPU_LOST;
    sim_pools_trim_after_sync(dev);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    SIM_ENTER();
    if (ms == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = CUDA_SUCCESS;
    if (!event_valid(start) || !event_valid(end) || !start->recorded || !end->recorded ||
        ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING))
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (sim_now_ns() < start->at_ns || sim_now_ns() < end->at_ns)
        rc = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((double)((int64_t)(end->at_ns - start->at_ns)) / 1e6);
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    return cuEventElapsedTime(ms, start, end);
}

SIMGPU_API CUresult cuEventDestroy_v2(CUevent event)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = event_valid(event);
    if (valid)
        event->tag = 0;
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_HANDLE;
    free(event);
    return CUDA_SUCCESS;
}
