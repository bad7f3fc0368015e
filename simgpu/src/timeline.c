/* The per-GPU kernel timeline and the busy-time queries NVML's utilisation is computed from. */
#include "timeline.h"

#include <errno.h>
#include <time.h>

uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void sim_sleep_until(uint64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ULL),
                          .tv_nsec = (long)(deadline_ns % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

uint64_t sim_tl_submit(struct sim_node *node, int gpu, uint64_t not_before_ns,
                       uint64_t duration_ns)
{
    struct sim_gpu_state *g = &node->sh->gpus[gpu];
    const struct sim_proc_slot *me = &node->sh->procs[node->my_slot];
    uint64_t now = sim_now_ns();
    sim_node_lock(node);
    uint64_t start = now;
    if (g->busy_until_ns > start)
        start = g->busy_until_ns;
    if (not_before_ns > start)
        start = not_before_ns;
    uint64_t end = start + duration_ns;
    if (duration_ns > 0) {
        struct sim_interval *last =
            g->ring_count > 0 ? &g->ring[(g->ring_count - 1) % SIM_RING] : NULL;
        if (last != NULL && last->end_ns == start && last->proc == node->my_slot &&
            last->gen == me->gen) {
            last->end_ns = end; /* back-to-back kernels of one process: one interval */
        } else {
            struct sim_interval *slot = &g->ring[g->ring_count % SIM_RING];
            slot->start_ns = start;
            slot->end_ns = end;
            slot->pid = me->id.pid;
            slot->proc = (uint16_t)node->my_slot;
            slot->gen = me->gen;
            g->ring_count++;
        }
        g->busy_until_ns = end;
    }
    sim_node_unlock(node);
    return end;
}

static uint64_t overlap(const struct sim_interval *iv, uint64_t from, uint64_t to)
{
    uint64_t a = iv->start_ns > from ? iv->start_ns : from;
    uint64_t b = iv->end_ns < to ? iv->end_ns : to;
    return b > a ? b - a : 0;
}

/* Walk the ring from newest to oldest; intervals are in start order, so stop once they end
 * before the window. */
#define FOR_EACH_INTERVAL(g, iv)                                                                  \
    for (uint64_t k_ = 0, n_ = (g)->ring_count < SIM_RING ? (g)->ring_count : SIM_RING;           \
         k_ < n_ && ((iv) = &(g)->ring[((g)->ring_count - 1 - k_) % SIM_RING], 1); k_++)

uint64_t sim_tl_busy_locked(struct sim_node *node, int gpu, uint64_t from, uint64_t to)
{
    const struct sim_gpu_state *g = &node->sh->gpus[gpu];
    const struct sim_interval *iv = NULL;
    uint64_t busy = 0;
    FOR_EACH_INTERVAL(g, iv)
    {
        if (iv->end_ns <= from)
            break;
        busy += overlap(iv, from, to);
    }
    return busy;
}

int sim_tl_busy_by_process_locked(struct sim_node *node, int gpu, uint64_t from, uint64_t to,
                                  struct sim_proc_busy *out, int cap)
{
    const struct sim_gpu_state *g = &node->sh->gpus[gpu];
    const struct sim_interval *iv = NULL;
    int n = 0;
    FOR_EACH_INTERVAL(g, iv)
    {
        if (iv->end_ns <= from)
            break;
        uint64_t busy = overlap(iv, from, to);
        if (busy == 0)
            continue;
        int i = 0;
        while (i < n && !(out[i].proc == iv->proc && out[i].gen == iv->gen))
            i++;
        if (i == n) {
            if (n == cap)
                continue;
            out[n] = (struct sim_proc_busy){.pid = iv->pid, .proc = iv->proc, .gen = iv->gen};
            n++;
        }
        out[i].busy_ns += busy;
    }
    return n;
}
