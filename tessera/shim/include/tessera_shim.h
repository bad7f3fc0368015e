/*
 * Tessera enforcement shim: the formats shared by the node driver (writer of the limits file,
 * creator of the usage region), the shim (reader of both, writer of the usage region) and the
 * metrics exporter (reader of the usage region). Every side goes through the C functions
 * declared here - the shim links them, Python reaches them through cffi (tessera.shim.format) -
 * so a layout or syntax can never drift between writer and reader. docs/shim.md describes the
 * formats in prose.
 *
 * LIMITS FILE (text, UTF-8/ASCII, written once by the driver at NodePrepareResources, root-owned
 * and mounted read-only at TESSERA_CONTAINER_LIMITS; outside a prepared container the shim finds it
 * through $TESSERA_LIMITS_FILE):
 *
 *     # comment lines and blank lines are ignored
 *     tessera-limits 1
 *     GPU-5fd3a0a4-2f3c-4d1e-9a11-0c5b1e4f8d21 memory=8589934592 cores=30
 *     GPU-0b8e7e9c-1111-2222-3333-444455556666 memory=none cores=0 priority=0
 *
 * The first significant line names the format version. Each further line is one GPU, keyed by its
 * UUID exactly as the driver reports it (cuDeviceGetUuid / nvmlDeviceGetUUID, "GPU-" or "MIG-"
 * prefix), never by an ordinal. `memory` is the claim's device-memory limit in bytes (`none`: no
 * limit); `cores` is the claim's share of the GPU's time in percent, 0-100 (0 or 100: uncapped).
 * Both keys are required, once each, in this order. `priority` (0 high, 1 low) may follow; a line
 * without it is low priority (HAMi's default), so files written before it existed read the same.
 * GPUs not listed are not limited. Anything
 * else - unknown keys, duplicates, a UUID listed twice, numbers out of range, more than
 * TESSERA_MAX_GPUS lines, a file over TESSERA_LIMITS_MAX_BYTES - is malformed.
 *
 * USAGE REGION (binary, a file mapped MAP_SHARED by every process of the claim, at
 * TESSERA_CONTAINER_REGION in a prepared container; elsewhere the shim finds it through
 * $TESSERA_USAGE_REGION): struct tessera_region below. The driver creates it (all zero but the
 * header) before the first process starts; outside a prepared container, a process that finds the
 * named file missing creates it the same way, atomically. Multi-byte fields are host-endian;
 * every shared counter is accessed only with the __atomic builtins, so the region holds no lock
 * and a process killed at any instruction leaves it consistent.
 *
 *  - gpus[]: UUID table, claimed entry by entry with compare-and-swap on `state` the first time a
 *    process of the claim touches that GPU; then the compute controller's shared state for it.
 *  - slots[]: one per live process. A process owns slot i while it holds an open file description
 *    lock (F_OFD_SETLK, write) on byte TESSERA_REGION_LOCK_BASE + i of the region file, taken
 *    through the description its CUDA half opened; the kernel drops that lock when the process
 *    dies in any way, so "lock free but slot ACTIVE" means dead, without pid polling and immune to
 *    pid reuse. A description's lock, not a process's (F_SETLK): the process's other descriptions
 *    of the file (its NVML half's, a tool's) conflict with it and closing them leaves it alone.
 *    pid and start time are informational (for the exporter).
 *  - used[g] in a slot is the bytes that process holds on region GPU g; the claim's usage is the
 *    sum over ACTIVE slots. A reservation adds to its own slot first and then checks the sum, so two
 *    processes racing for the last bytes can both fail but can never both succeed past the limit.
 */
#ifndef TESSERA_SHIM_H
#define TESSERA_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TESSERA_LIMITS_ENV "TESSERA_LIMITS_FILE"
#define TESSERA_REGION_ENV "TESSERA_USAGE_REGION"
#define TESSERA_LOG_ENV "TESSERA_SHIM_LOG"

/* Where prepare puts a claim's files inside a container: the node's claim folder is one read-only
 * bind mount at TESSERA_CONTAINER_DIR (a mount point cannot be renamed), with the usage region a
 * read-write bind mount over its own file inside it. Where the limits file is present, or the shim
 * was loaded from the shim folder, the shim takes its limits and usage region from here - after
 * checking with the kernel that they are that mount's (limits_source.h) - and ignores the two
 * variables above; those only name files for processes outside prepared containers. */
#define TESSERA_CONTAINER_DIR "/run/tessera"
#define TESSERA_CONTAINER_LIMITS TESSERA_CONTAINER_DIR "/limits"
#define TESSERA_CONTAINER_REGION TESSERA_CONTAINER_DIR "/usage"
#define TESSERA_CONTAINER_SHIM_DIR TESSERA_CONTAINER_DIR "/shim"

#define TESSERA_LIMITS_VERSION 1
#define TESSERA_LIMITS_MAX_BYTES 65536
#define TESSERA_MAX_GPUS 16
#define TESSERA_UUID_MAX 80 /* including the NUL; NVML's UUID buffer is 80 (v2: 96) */
#define TESSERA_NO_MEMORY_LIMIT UINT64_MAX

/* How long an allocation the claim's limit has room for waits, retrying, when the driver refuses
 * it with CUDA_ERROR_OUT_OF_MEMORY (a process that takes GPU memory around the shim has taken the
 * GPU's free memory; the node stops such processes within a few seconds) before it fails. */
#define TESSERA_OOM_WAIT_NS 5000000000ULL /* 5 s */

/* Exit status of a process stopped because its limits file is unreadable or malformed. */
#define TESSERA_EXIT_BAD_LIMITS 78

#define TESSERA_PRIORITY_HIGH 0
#define TESSERA_PRIORITY_LOW 1

struct tessera_gpu_limit {
    char uuid[TESSERA_UUID_MAX];
    uint64_t memory_bytes; /* TESSERA_NO_MEMORY_LIMIT: none */
    uint32_t cores;        /* percent, 0..100; 0 and 100 mean uncapped */
    uint32_t priority;     /* TESSERA_PRIORITY_HIGH or TESSERA_PRIORITY_LOW */
};

struct tessera_limits {
    uint32_t count;
    struct tessera_gpu_limit gpus[TESSERA_MAX_GPUS];
};

/*
 * Parse `len` bytes of limits-file text. Returns 0, or -1 with a one-line reason ("line 3: ...")
 * in `err`.
 */
int tessera_limits_parse(const char *text, size_t len, struct tessera_limits *out, char *err,
                         size_t errlen);

/* Read and parse a limits file. Returns 0; 1 if the file does not exist (no limits: `out` is
 * empty); -1 with a reason naming the file in `err` if it is unreadable or malformed. */
int tessera_limits_read(const char *path, struct tessera_limits *out, char *err, size_t errlen);

/* Render limits as file text into `buf`. Returns the length, or -1 (invalid limits or `buf` too
 * small) with a reason in `err`. The result always parses back to the same limits. */
int tessera_limits_format(const struct tessera_limits *limits, char *buf, size_t buflen,
                          char *err, size_t errlen);

/* ---------------------------------------------------------------- usage region ---------- */

#define TESSERA_REGION_MAGIC "TSRUSE1" /* 8 bytes with the NUL */
#define TESSERA_REGION_VERSION 1
#define TESSERA_REGION_SLOTS 1024
#define TESSERA_REGION_LOCK_BASE 0 /* record-lock byte of slot i: LOCK_BASE + i */

enum tessera_gpu_state { TESSERA_GPU_FREE = 0, TESSERA_GPU_WRITING = 1, TESSERA_GPU_READY = 2 };
enum tessera_slot_state { TESSERA_SLOT_FREE = 0, TESSERA_SLOT_ACTIVE = 1 };

struct tessera_region_gpu {
    uint32_t state; /* enum tessera_gpu_state */
    uint32_t reserved0;
    char uuid[TESSERA_UUID_MAX];
    /* Compute controller (compute.c), shared by the claim's processes on this GPU. */
    int64_t budget_ns;    /* GPU time the claim may still submit; negative: in debt */
    uint64_t refill_ns;   /* CLOCK_MONOTONIC time up to which budget has been credited */
    uint64_t charged_ns;  /* total GPU time charged (monotonic counter, for the exporter) */
    uint64_t throttled_ns; /* total time launches waited (monotonic counter) */
    uint64_t launches;     /* kernel and graph launches seen while capped */
    int64_t hint_ns;       /* latest duration estimate any process settled: the provisional
                              charge of a launch shape not yet measured (0: none yet) */
    uint64_t held_ns;      /* total time low-priority launches waited for a high-priority
                              neighbour (monotonic counter; priority.c) */
    uint64_t holds;        /* launches that waited so */
    uint8_t reserved1[40];
} __attribute__((aligned(64)));

struct tessera_region_slot {
    uint32_t state; /* enum tessera_slot_state */
    int32_t pid;    /* as the owning process sees itself */
    uint64_t start_time; /* field 22 of /proc/<pid>/stat: clock ticks after boot */
    uint64_t used[TESSERA_MAX_GPUS]; /* bytes held on region GPU g */
    uint8_t reserved[48];
} __attribute__((aligned(64)));

struct tessera_region {
    char magic[8];
    uint32_t version;
    uint32_t size; /* sizeof(struct tessera_region) */
    uint32_t max_gpus;
    uint32_t max_slots;
    uint32_t slot_hwm;     /* slots [0, slot_hwm) have ever been used: the scan bound */
    uint32_t reserved0;
    uint64_t last_reap_ns; /* CLOCK_MONOTONIC of the last sweep for dead processes */
    uint8_t reserved1[24];
    struct tessera_region_gpu gpus[TESSERA_MAX_GPUS];
    struct tessera_region_slot slots[TESSERA_REGION_SLOTS];
};

/* An open region: the mapping, its file (an open file description of its own, whose lock is this
 * process's slot ownership; -1 once a forked child could not open one of its own) and the slot
 * this process holds (-1: none). */
struct tessera_region_handle {
    struct tessera_region *map;
    int fd;
    int slot;
};

/* Create the region file at `path` if it does not exist (atomically: written aside, then linked
 * into place), mode 0666 so every uid of the claim's containers can map it. Returns 0 if created
 * or already present and valid, -1 with a reason. */
int tessera_region_create(const char *path, char *err, size_t errlen);

/* Open (creating if missing) and map the region, checking its header. `h->slot` is -1. */
int tessera_region_open(const char *path, struct tessera_region_handle *h, char *err,
                        size_t errlen);

/* A region private to this process (an anonymous file), for a process that has limits but no
 * $TESSERA_USAGE_REGION: limits then hold per process instead of per claim. */
int tessera_region_open_private(struct tessera_region_handle *h, char *err, size_t errlen);

/* Unmap and close (dropping the slot, if held). */
void tessera_region_close(struct tessera_region_handle *h);

/* The region GPU index for `uuid`, adding it to the table if absent. -1 if the table is full. */
int tessera_region_gpu(struct tessera_region *r, const char *uuid);

/* Take a free (or dead process's) slot for this process. Returns the slot, -1 if all are held by
 * live processes, or -2 if the handle has no descriptor of the region (`fd` closed by the
 * application, its number maybe naming another file now, or a forked child that could not open
 * the region again). */
int tessera_region_claim_slot(struct tessera_region_handle *h);

/*
 * Reserve `bytes` on region GPU `gpu` for this process's slot, failing (returning -1) if the
 * claim's usage would then exceed `limit`. Never lets concurrent reservations from any number
 * of processes and threads together exceed the limit. On failure, dead processes are reaped and
 * the reservation retried before giving up.
 */
int tessera_region_reserve(struct tessera_region_handle *h, int gpu, uint64_t bytes,
                           uint64_t limit);

/* Give back `bytes` reserved earlier (saturating at zero). */
void tessera_region_release(struct tessera_region_handle *h, int gpu, uint64_t bytes);

/* The claim's usage on region GPU `gpu`: the sum over active slots. */
uint64_t tessera_region_used(const struct tessera_region *r, int gpu);

/* Sweep: every ACTIVE slot whose owner has died (its lock is free) has its usage zeroed and
 * becomes FREE. Returns how many were reaped. Safe to call from any process of the claim,
 * including one that holds no slot (the exporter reads with tessera_region_read and never sweeps).
 * Sweeps nothing if the handle's descriptor no longer names the region (see
 * tessera_region_claim_slot): through another file every lock would succeed. */
int tessera_region_reap(struct tessera_region_handle *h);

/* Reap if the last sweep (by any process) was more than `interval_ns` ago. */
void tessera_region_maybe_reap(struct tessera_region_handle *h, uint64_t interval_ns);

/* In a forked child: the parent's slot is not the child's, and the child opens the region again
 * (same file, same address) so that it shares no open file description with its parent - through
 * a shared one it could take its parent's slot without a conflict, and keep its parent's lock
 * alive after the parent died. Returns 0; -1 if it cannot (no descriptor left, no /proc): the
 * handle then has no descriptor, and this process takes no slot (its allocations on limited GPUs
 * are refused) and sweeps nothing. */
int tessera_region_after_fork_child(struct tessera_region_handle *h);

/* Mark this process's slot as holding nothing (at exit); the slot stays owned until death. */
void tessera_region_drop_usage(struct tessera_region_handle *h);

/* A reader's private copy of a region (shim/src/region_read.c): what the exporter reads, never a
 * mapping, so nothing a tenant does to the file can fault or block the reader. */
struct tessera_region_view {
    struct tessera_region region;
    uint8_t live[TESSERA_REGION_SLOTS]; /* 1: slot ACTIVE and its owner's lock held (alive) */
};

/* Copy the region at `path` with pread (opened read-only and non-blocking; a regular file of
 * exactly sizeof(struct tessera_region) bytes), check its header and every count and state it
 * holds, and mark which ACTIVE slots a live process owns (F_OFD_GETLK on the slot's lock byte).
 * Never writes the file and takes no lock. Returns 0; 1 if `path` does not exist; -1 with a
 * one-line reason naming the file in `err` if it is anything but a well-formed region. */
int tessera_region_read(const char *path, struct tessera_region_view *out, char *err,
                        size_t errlen);

/* ---------------------------------------------------------------- priority board -------- */

/*
 * PRIORITY BOARD (binary, one per GPU per node, shim/src/priority_board.c): where high-priority
 * claims on a shared GPU say they have kernels in flight, so that low-priority claims on that GPU
 * hold their launches back. The driver creates it under its state folder and mounts it at
 * TESSERA_CONTAINER_PRIORITY_DIR/<GPU UUID> into every shared container on that GPU: read-write
 * for a claim whose limits give that GPU priority 0, read-only for the rest. Outside a prepared
 * container $TESSERA_PRIORITY_DIR names the folder.
 *
 * Nobody maps it: writers and readers use pwrite/pread of the whole 64 bytes, so a writer that
 * truncates or scribbles on the file can make no other process fault, only make its reads fail
 * the header check (no hold) until the next high-priority launch writes a whole board again. A reader trusts nothing in it: a heartbeat in the future is
 * garbage, busy_until counts at most TESSERA_BOARD_MAX_AHEAD_NS past the heartbeat, and the hold
 * ends TESSERA_BOARD_LINGER_NS after that - so a dead high-priority process holds nobody back
 * for longer than their sum, and a live one only while it keeps writing.
 */
#define TESSERA_CONTAINER_PRIORITY_DIR TESSERA_CONTAINER_DIR "/priority"
#define TESSERA_PRIORITY_ENV "TESSERA_PRIORITY_DIR"
#define TESSERA_BOARD_MAGIC "TSRPRI1" /* 8 bytes with the NUL */
#define TESSERA_BOARD_VERSION 1
#define TESSERA_BOARD_MAX_AHEAD_NS 100000000ULL /* 100 ms */
#define TESSERA_BOARD_LINGER_NS 20000000ULL     /* 20 ms (priority.c says why) */
#define TESSERA_BOARD_SKEW_NS 1000000ULL        /* a heartbeat this far ahead is garbage */

struct tessera_priority_board {
    char magic[8];
    uint32_t version;
    uint32_t size;           /* sizeof(struct tessera_priority_board) */
    uint64_t heartbeat_ns;   /* CLOCK_MONOTONIC of the last high-priority launch */
    uint64_t busy_until_ns;  /* when that launch's kernels (queued after earlier ones) should end */
    uint64_t high_launches;  /* high-priority launches published (for tests and the curious) */
    uint8_t reserved[24];
};

/* Create the board at `path` if nothing is there (written aside, then linked into place; mode
 * 0666 so a high-priority container of any uid can write it). An existing regular file is kept
 * as it is (containers have it mounted). Returns 0, or -1 with a reason. */
int tessera_board_create(const char *path, char *err, size_t errlen);

/* Read the board from `fd` (pread). Returns 0, or -1 if it is not a well-formed board. */
int tessera_board_read(int fd, struct tessera_priority_board *out);

/* Until when (CLOCK_MONOTONIC) low-priority launches should hold back at `now`, as far as `b`
 * may be believed (see above); 0 when they need not. */
uint64_t tessera_board_hold_until(const struct tessera_priority_board *b, uint64_t now);

/* Publish a high-priority launch at `now` whose kernels should end at `busy_until` (a board that
 * does not read back as one is written whole again). Returns 0, or -1 if it cannot be written. */
int tessera_board_publish(int fd, uint64_t now, uint64_t busy_until);

/* CLOCK_MONOTONIC in nanoseconds (the region's time base). */
uint64_t tessera_now_ns(void);

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_SHIM_H */
