/*
 * Stream capture (cuda_capture_hooks.c): whether a stream of this process is capturing, asked
 * by the compute controller (launches into a capturing stream are recorded, not run) and by the
 * stream-ordered allocation hooks (refused on a capturing stream under a memory limit).
 */
#ifndef TESSERA_CAPTURE_H
#define TESSERA_CAPTURE_H

#include <stdbool.h>

#include "shim_state.h"

/* `stream` (as passed to the `_ptsz` variant when `ptsz`) is capturing. Costs one flag test
 * until some cuStreamBeginCapture* has been called in this process, a driver call after. */
bool shim_stream_capturing(CUstream stream, bool ptsz);

#endif
