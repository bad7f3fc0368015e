/*
 * The compute controller: paces a claim's kernel (and graph) launches on a GPU so that the
 * GPU time they take is the claim's `cores` percent of wall time. See compute.c for the design.
 */
#ifndef TESSERA_COMPUTE_H
#define TESSERA_COMPUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "shim_state.h"

/* One launch going through the controller. */
struct shim_launch {
    bool active;   /* capped or high priority: the controller estimated this launch */
    bool capped;   /* ... and gated and charged it */
    bool measure;  /* events bracket this launch */
    int gpu;       /* region GPU index */
    int64_t charged_ns;
    int64_t expect_ns; /* the estimate this launch went through with */
    uint32_t ledger_gen; /* the shape's ledger this launch was entered in */
    uint64_t key;
    CUcontext ctx;
    CUstream stream;
    CUevent start, end;
};

/* A launch identity for duration estimates: same function and shape, same estimate. */
uint64_t shim_launch_key(const void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shared);

/* Before the real launch: hold back for a high-priority neighbour (low priority), wait for the
 * claim's budget and charge the expected duration (capped), publish it (high priority), and
 * maybe start measuring. `ptsz`: the per-thread-default-stream variant is being called. */
void shim_compute_begin(struct shim_launch *l, uint64_t key, CUstream stream, bool ptsz);

/* After the real launch (its result `rc`): finish the measurement, or refund if it failed. */
void shim_compute_end(struct shim_launch *l, CUresult rc);

void shim_compute_prepare_fork(void);
void shim_compute_parent_after_fork(void);
void shim_compute_child_after_fork(void);

#endif
