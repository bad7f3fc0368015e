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
    uint64_t memory_limit; /* TESSERA_NO_MEMORY_LIMIT: none */
    int gpu;               /* region GPU index; -1: this GPU is not in the limits file */
    uint32_t cores;        /* 1..99: capped; 0: uncapped */
    uint32_t priority;     /* TESSERA_PRIORITY_HIGH or _LOW */
    int board;             /* priority board (priority.h); -1: priority plays no part here */
    CUcontext primary;     /* the device's primary context, once retained */
    char uuid[TESSERA_UUID_MAX];
};

/* The driver's entry points that an allocation and its free call, copied from shim_real (real.h)
 * when the shim initialises and never changed after (cuGetProcAddress fills only entry points the
 * library lacks; these three it must have): read here, on the state's first line, they cost no
 * line of their own. */
struct shim_hot_calls {
    __typeof__(&cuCtxGetCurrent) cuCtxGetCurrent;
    __typeof__(&cuMemAlloc_v2) cuMemAlloc_v2;
    __typeof__(&cuMemFree_v2) cuMemFree_v2;
};

/* What every allocation and free reads comes first, with the first device's limits, so that it
 * fits one cache line: the driver's own work (the simulator's, say) evicts the shim's lines
 * between calls, and each line read again is a miss. Hence the one-byte init_done and the
 * fields the hot path never reads after the devices. The limits, read once, come last. */
struct shim_state {
    struct shim_hot_calls calls;
    struct tessera_region_handle region;
    bool memory_limited; /* some GPU has a memory limit */
    uint8_t init_done;   /* shim_state.c's: 1 once shim_init has run */
    int device_count;    /* -1: not mapped yet (the driver is not initialised) */
    struct shim_device devices[SHIM_MAX_DEVICES];
    bool limited;        /* a limits file is in force (maybe with no entries) */
    bool prepared;       /* ... from a prepared container's fixed path: GPUs it does not name
                            are refused, not unlimited */
    bool compute_capped; /* some GPU has a compute cap */
    bool prioritised;    /* some GPU has a priority board: its launches go through priority.c */
    uint64_t contexts_forgotten; /* shim_state.c's: contexts destroyed so far */
    struct tessera_limits limits;
} __attribute__((aligned(64)));

_Static_assert(__builtin_offsetof(struct shim_state, devices[0].gpu) + sizeof(int) <= 64,
               "what an allocation and its free read of the state fits its first cache line");

extern struct shim_state shim;

/* 1 once shim_init has run in this process and neither a compute cap nor a priority board is in
 * force: launch hooks call straight through. Read without a lock on every launch. */
extern int shim_launch_passthrough;

/* Initialise (first call in the process does the work; the rest return at once). A limits file
 * that is unreadable or malformed, or a usage region that cannot be opened, stops the process
 * with a message (exit status TESSERA_EXIT_BAD_LIMITS). Inline, so that the check every hook
 * makes is a load, not a call whose return address takes one more line of stack. */
void shim_init_once(void);

static inline void shim_init(void)
{
    if (SHIM_LIKELY(__atomic_load_n(&shim.init_done, __ATOMIC_ACQUIRE)))
        return;
    shim_init_once();
}

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
