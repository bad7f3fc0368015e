/*
 * The shim's per-process state: the limits in force, the usage region and this process's slot
 * in it, and the map from CUDA ordinals (which CUDA_VISIBLE_DEVICES renumbers) to the GPUs the
 * limits file names by UUID. Everything initialises lazily on the first call that needs it (no
 * constructor does work), once per process: a forked child starts over.
 */
#ifndef TESSERA_SHIM_STATE_H
#define TESSERA_SHIM_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "real.h"
#include "tessera_shim.h"

#define SHIM_EXPORT __attribute__((visibility("default")))
#define SHIM_LIKELY(x) __builtin_expect(!!(x), 1)
#define SHIM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SHIM_MAX_DEVICES 64

struct shim_device {
    int gpu;               /* region GPU index; -1: this GPU is not in the limits file */
    uint64_t memory_limit; /* TESSERA_NO_MEMORY_LIMIT: none */
    uint32_t cores;        /* 1..99: capped; 0: uncapped */
    uint32_t priority;     /* TESSERA_PRIORITY_HIGH or _LOW */
    int board;             /* priority board (priority.h); -1: priority plays no part here */
    CUcontext primary;     /* the device's primary context, once retained */
    char uuid[TESSERA_UUID_MAX];
};

/* What every allocation and free reads comes first, with the first device's limits, so that it
 * fits one cache line: the driver's own work (the simulator's, say) evicts the shim's lines
 * between calls, and each line read again is a miss. The limits, read once, come last. */
struct shim_state {
    bool limited;        /* a limits file is in force (maybe with no entries) */
    bool prepared;       /* ... from a prepared container's fixed path: GPUs it does not name
                            are refused, not unlimited */
    bool memory_limited; /* some GPU has a memory limit */
    bool compute_capped; /* some GPU has a compute cap */
    bool prioritised;    /* some GPU has a priority board: its launches go through priority.c */
    int init_done;       /* shim_state.c's: 1 once shim_init has run */
    int device_count;    /* -1: not mapped yet (the driver is not initialised) */
    uint64_t contexts_forgotten; /* shim_state.c's: contexts destroyed so far */
    struct tessera_region_handle region;
    struct shim_device devices[SHIM_MAX_DEVICES];
    struct tessera_limits limits;
} __attribute__((aligned(64)));

extern struct shim_state shim;

/* 1 once shim_init has run in this process and neither a compute cap nor a priority board is in
 * force: launch hooks call straight through. Read without a lock on every launch. */
extern int shim_launch_passthrough;

/* Initialise (first call in the process does the work; the rest return at once). A limits file
 * that is unreadable or malformed, or a usage region that cannot be opened, stops the process
 * with a message (exit status TESSERA_EXIT_BAD_LIMITS). */
void shim_init(void);

/* Map CUDA ordinals to limits (after a successful cuInit). Returns true when the map is ready. */
bool shim_devices_ready(void);

/* The device of the calling thread's current context (and the context). False if none. */
bool shim_current_device(int *device, CUcontext *ctx);

/* The limits of CUDA ordinal `dev`, or NULL if it is unknown or not limited. */
const struct shim_device *shim_device(int dev);

/* This process's slot in the usage region (claimed on first use). False if none is free. */
bool shim_slot(void);

/* Forget what is known about context `ctx` (it was destroyed). */
void shim_forget_context(CUcontext ctx);

#endif
