/*
 * Task priority on a shared GPU (HAMi's nvidia.com/priority): 0 high, 1 low.
 *
 * A GPU executes the kernels of all its tenants in the order they reach it (time slicing
 * without MPS), so a high-priority kernel launched while a low-priority neighbour has work
 * queued waits for that work. Kernels are not preempted; what can be done is to keep low-priority
 * work from reaching the GPU while high-priority work is there. So:
 *
 *  - A high-priority launch publishes on the GPU's board (tessera_shim.h) a heartbeat and when
 *    its kernel should end: the later of now and this process's previous kernels' end, plus the
 *    launch's expected duration (the compute controller's estimate of its shape, compute.c).
 *  - A low-priority launch reads the board and, while a high-priority kernel should still be
 *    running or ended less than TESSERA_BOARD_LINGER_NS ago, sleeps until then and looks again.
 *    The linger keeps low-priority work out of the gaps in which a high-priority process
 *    synchronises, does its host work and launches its next kernel - gaps that grow by whatever
 *    time it waits for a CPU; every gap longer than the linger lets low kernels in ahead of the
 *    next high one. 20 ms, not 5: on the benchmark's loaded machine 5 ms let them in often enough
 *    to double a high-priority claim's p99 (benchmarks/shim/results/priority.md).
 *  - A clear board is believed for CHECK_NS, so a low-priority process reads the file at most
 *    once per CHECK_NS while no high-priority neighbour is busy.
 *  - A low-priority launch waits at most SHIM_PRIORITY_MAX_HOLD_NS: a high-priority neighbour
 *    that never pauses slows a low one down to a launch per second per thread, never stops it.
 *
 * Trust: the board is writable only from high-priority containers (the driver mounts it
 * read-only into the others), and what a reader believes is bounded (tessera_shim.h): a dead
 * high-priority process holds no one back for more than MAX_AHEAD + LINGER after its last launch,
 * a heartbeat in the future is ignored, and a board that does not read back as one holds no one.
 * Priority never changes a claim's memory limit or compute cap.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "priority.h"

#define CHECK_NS 100000ULL                  /* a clear board is believed this long */
#define SHIM_PRIORITY_MAX_HOLD_NS 1000000000ULL /* 1 s */

struct board {
    int fd;
    uint64_t clear_until; /* CLOCK_MONOTONIC until which the board was last seen clear */
    uint64_t queue_end;   /* high priority: when this process's kernels should end */
};

static struct board boards[TESSERA_MAX_GPUS];
static int board_of[TESSERA_MAX_GPUS];

bool shim_priority_open(const struct tessera_limits *limits, const char *dir, bool prepared)
{
    bool any = false;
    for (uint32_t i = 0; i < TESSERA_MAX_GPUS; i++)
        board_of[i] = -1;
    if (dir == NULL)
        return false;
    for (uint32_t i = 0; i < limits->count; i++) {
        const struct tessera_gpu_limit *g = &limits->gpus[i];
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, g->uuid);
        bool high = g->priority == TESSERA_PRIORITY_HIGH;
        int fd = open(path, (high ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) {
            /* Caps and memory limits do not depend on it: say so and carry on without priority. */
            if (prepared || errno != ENOENT || high)
                SHIM_WARN("cannot open the priority board %s (%s): launches on %s neither hold "
                          "back for nor are held back by priority",
                          path, strerror(errno), g->uuid);
            continue;
        }
        boards[i] = (struct board){.fd = fd};
        board_of[i] = (int)i;
        any = true;
        SHIM_DEBUG("priority board %s open (%s priority)", path, high ? "high" : "low");
    }
    return any;
}

int shim_priority_board(uint32_t i)
{
    return i < TESSERA_MAX_GPUS ? board_of[i] : -1;
}

static void sleep_until(uint64_t deadline)
{
    struct timespec ts = {(time_t)(deadline / 1000000000ULL), (long)(deadline % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

void shim_priority_hold(int board, struct tessera_region_gpu *gpu)
{
    struct board *b = &boards[board];
    uint64_t now = tessera_now_ns();
    if (now < __atomic_load_n(&b->clear_until, __ATOMIC_RELAXED))
        return;
    uint64_t start = now;
    for (;;) {
        struct tessera_priority_board rec;
        uint64_t until = tessera_board_read(b->fd, &rec) == 0 ? tessera_board_hold_until(&rec, now) : 0;
        if (until == 0) {
            __atomic_store_n(&b->clear_until, now + CHECK_NS, __ATOMIC_RELAXED);
            break;
        }
        if (now - start >= SHIM_PRIORITY_MAX_HOLD_NS)
            break;
        if (until > start + SHIM_PRIORITY_MAX_HOLD_NS)
            until = start + SHIM_PRIORITY_MAX_HOLD_NS;
        sleep_until(until);
        now = tessera_now_ns();
    }
    if (now > start) {
        __atomic_add_fetch(&gpu->held_ns, now - start, __ATOMIC_RELAXED);
        __atomic_add_fetch(&gpu->holds, 1, __ATOMIC_RELAXED);
    }
}

void shim_priority_publish(int board, int64_t expect_ns)
{
    struct board *b = &boards[board];
    uint64_t now = tessera_now_ns();
    uint64_t expect = expect_ns > 0 ? (uint64_t)expect_ns : 0;
    uint64_t end = __atomic_load_n(&b->queue_end, __ATOMIC_RELAXED);
    uint64_t next;
    do
        next = (end > now ? end : now) + expect;
    while (!__atomic_compare_exchange_n(&b->queue_end, &end, next, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    if (tessera_board_publish(b->fd, now, next) != 0)
        SHIM_DEBUG("a priority board could not be written: this launch is not published");
}
