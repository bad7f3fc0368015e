/*
 * The floor under the shim's allocation cost: a preload library that does the least any
 * per-allocation memory limit must do, and nothing else. An allocation adds its bytes to one
 * counter against a limit (one atomic add, taken back if over) and records pointer -> bytes in
 * an open-addressing table under one lock; a free looks the pointer up, removes it, calls the
 * driver and gives the bytes back. No usage shared between processes, no per-device limits, no
 * contexts, no ordering of racing frees, no record kept of a free the driver refuses. overhead.py
 * measures it in the same runs as the shim, so that the shim's figure, on a machine where the
 * same code reads two or three times more from one hour to the next, is read against what the
 * least accounting costs at that moment (docs/shim.md).
 *
 * Built with soname libcuda.so.1 and a DT_NEEDED entry for libcuda-real.so.1 (the driver), as
 * the shim is: preloaded, it is what a program's dlopen("libcuda.so.1") finds, and every other
 * symbol resolves through it to the driver.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_driver_abi.h"

#define FLOOR_EXPORT __attribute__((visibility("default")))
#define CELLS (1U << 15) /* a power of two: 10 000 live allocations at under a third full */
#define LIMIT (1ULL << 40)

struct cell {
    uint64_t key; /* 0: empty */
    uint64_t bytes;
};

static struct {
    __typeof__(&cuMemAlloc_v2) alloc;
    __typeof__(&cuMemFree_v2) free;
    uint64_t used;
    uint32_t lock;
    uint32_t live; /* cells in use: at most half of them, so that a probe ends */
} floor_state __attribute__((aligned(64)));

static struct cell cells[CELLS];

__attribute__((constructor)) static void floor_init(void)
{
    void *real = dlopen("libcuda-real.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (real == NULL) {
        fprintf(stderr, "floor_shim: libcuda-real.so.1 is not loaded: %s\n", dlerror());
        abort();
    }
    floor_state.alloc = (__typeof__(&cuMemAlloc_v2))dlsym(real, "cuMemAlloc_v2");
    floor_state.free = (__typeof__(&cuMemFree_v2))dlsym(real, "cuMemFree_v2");
    if (floor_state.alloc == NULL || floor_state.free == NULL)
        abort();
}

/* The shim's pointer table hashes keys the same way (ptrtable.c). */
static inline uint64_t mix(uint64_t x)
{
    x ^= 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static inline void lock(void)
{
    uint32_t free_word = 0;
    while (!__atomic_compare_exchange_n(&floor_state.lock, &free_word, 1, false, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
        free_word = 0;
}

static inline void unlock(void)
{
    __atomic_store_n(&floor_state.lock, 0, __ATOMIC_RELEASE);
}

/* The cell holding `key`, or the empty cell where it would go. */
static inline uint32_t find(uint64_t key)
{
    uint32_t i = (uint32_t)mix(key) & (CELLS - 1);
    while (cells[i].key != 0 && cells[i].key != key)
        i = (i + 1) & (CELLS - 1);
    return i;
}

/* Empty cell i, moving later members of its probe run back (no tombstones). */
static void erase(uint32_t i)
{
    for (uint32_t j = (i + 1) & (CELLS - 1); cells[j].key != 0; j = (j + 1) & (CELLS - 1)) {
        uint32_t home = (uint32_t)mix(cells[j].key) & (CELLS - 1);
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            cells[i] = cells[j];
            i = j;
        }
    }
    cells[i].key = 0;
}

FLOOR_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (__atomic_add_fetch(&floor_state.used, bytesize, __ATOMIC_SEQ_CST) > LIMIT) {
        __atomic_sub_fetch(&floor_state.used, bytesize, __ATOMIC_SEQ_CST);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = floor_state.alloc(dptr, bytesize);
    if (rc != CUDA_SUCCESS) {
        __atomic_sub_fetch(&floor_state.used, bytesize, __ATOMIC_SEQ_CST);
        return rc;
    }
    lock();
    uint32_t i = find(*dptr);
    if (cells[i].key == 0 && floor_state.live >= CELLS / 2) {
        unlock();
        floor_state.free(*dptr);
        __atomic_sub_fetch(&floor_state.used, bytesize, __ATOMIC_SEQ_CST);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    floor_state.live += cells[i].key == 0;
    cells[i] = (struct cell){*dptr, bytesize};
    unlock();
    return rc;
}

FLOOR_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    uint64_t bytes = 0;
    lock();
    uint32_t i = find(dptr);
    if (cells[i].key == dptr && dptr != 0) {
        bytes = cells[i].bytes;
        erase(i);
        floor_state.live--;
    }
    unlock();
    CUresult rc = floor_state.free(dptr);
    if (rc == CUDA_SUCCESS)
        __atomic_sub_fetch(&floor_state.used, bytes, __ATOMIC_SEQ_CST);
    return rc;
}
