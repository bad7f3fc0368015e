/*
 * Stream capture. A launch into a capturing stream is recorded into a graph, not run, so the
 * compute controller must not charge it (the graph is charged when launched). Asking the driver
 * cuStreamIsCapturing on every capped launch costs a driver call; instead these hooks note that
 * a capture is beginning in this process, and only from then on do launches ask. (A stream can
 * only be capturing after some cuStreamBeginCapture* in its process; streams that join a capture
 * through an event wait still need one to have begun.) Each hook calls through unchanged.
 */
#include "compute.h"
#include "shim_state.h"

#define CALL_THROUGH(name, ...)                                                                   \
    do {                                                                                          \
        shim_init();                                                                              \
        shim_compute_capture_begun();                                                             \
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

SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                                      const CUgraphNode *deps,
                                                      const void *edgeData, size_t count,
                                                      unsigned int mode)
{
    CALL_THROUGH(cuStreamBeginCaptureToGraph_ptsz, stream, graph, deps, edgeData, count, mode);
}
