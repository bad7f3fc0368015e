/*
 * Stream capture (cuda_capture_hooks.c): whether a stream of this process is capturing, asked
 * by the compute controller (launches into a capturing stream are recorded, not run) and by the
 * stream-ordered allocation hooks (on a capturing stream they are graph allocation nodes, charged
 * with their graph, not when captured).
 */
#ifndef TESSERA_CAPTURE_H
#define TESSERA_CAPTURE_H

#include <stdbool.h>

#include "shim_state.h"

/* `stream` (as passed to the `_ptsz` variant when `ptsz`) is capturing. Costs one flag test
 * until some cuStreamBeginCapture* has been called in this process, a driver call after. */
bool shim_stream_capturing(CUstream stream, bool ptsz);

#endif
