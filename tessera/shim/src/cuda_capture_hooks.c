/*
 * Stream capture. A launch into a capturing stream is recorded into a graph, not run, so the
 * compute controller must not charge it (the graph is charged when launched), and a
 * stream-ordered allocation on it becomes a graph allocation node, which the memory hooks do not
 * charge (its graph is charged when instantiated). Asking the driver cuStreamIsCapturing on every capped launch costs a driver call;
 * instead these hooks note that a capture is beginning in this process, and only from then on
 * is the driver asked. (A stream can only be capturing after some cuStreamBeginCapture* in its
 * process; streams that join a capture through an event wait still need one to have begun.)
 * Each hook calls through unchanged. The flag is sticky, fork included (a child that inherited
 * it just keeps asking: harmless).
 */
#include "capture.h"

static int capture_begun; /* a stream capture has begun in this process */

bool shim_stream_capturing(CUstream stream, bool ptsz)
{
    if (SHIM_LIKELY(__atomic_load_n(&capture_begun, __ATOMIC_ACQUIRE) == 0))
        return false; /* no capture ever began in this process */
    __typeof__(&cuStreamIsCapturing) is_capturing =
        ptsz && shim_real.cuStreamIsCapturing_ptsz != NULL ? shim_real.cuStreamIsCapturing_ptsz
                                                           : shim_real.cuStreamIsCapturing;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return is_capturing != NULL && is_capturing(stream, &st) == CUDA_SUCCESS &&
           st != CU_STREAM_CAPTURE_STATUS_NONE;
}

#define CALL_THROUGH(name, ...)                                                                   \
    do {                                                                                          \
        shim_init();                                                                              \
        __atomic_store_n(&capture_begun, 1, __ATOMIC_RELEASE);                                    \
        if (shim_real.name == NULL)                                                               \
            return CUDA_ERROR_NOT_FOUND;                                                          \
        return shim_real.name(__VA_ARGS__);                                                       \
    } while (0)

SHIM_EXPORT CUresult cuStreamBeginCapture(CUstream stream)
{
    CALL_THROUGH(cuStreamBeginCapture, stream);
}

SHIM_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream)
{
    CALL_THROUGH(cuStreamBeginCapture_ptsz, stream);
}

SHIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, unsigned int mode)
{
    CALL_THROUGH(cuStreamBeginCapture_v2, stream, mode);
}

SHIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, unsigned int mode)
{
    CALL_THROUGH(cuStreamBeginCapture_v2_ptsz, stream, mode);
}

SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph,
                                                 const CUgraphNode *deps, const void *edgeData,
                                                 size_t count, unsigned int mode)
{
    CALL_THROUGH(cuStreamBeginCaptureToGraph, stream, graph, deps, edgeData, count, mode);
}

SHIM_EXPORT CUresult cuStreamBeginCaptureToCig(CUstream stream, void *cigCaptureParams)
{
    CALL_THROUGH(cuStreamBeginCaptureToCig, stream, cigCaptureParams);
}

SHIM_EXPORT CUresult cuStreamBeginRecaptureToGraph(CUstream stream, unsigned int mode,
                                                   CUgraph graph, void *callback, void *userData)
{
    CALL_THROUGH(cuStreamBeginRecaptureToGraph, stream, mode, graph, callback, userData);
}

SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                                      const CUgraphNode *deps,
                                                      const void *edgeData, size_t count,
                                                      unsigned int mode)
{
    CALL_THROUGH(cuStreamBeginCaptureToGraph_ptsz, stream, graph, deps, edgeData, count, mode);
}
