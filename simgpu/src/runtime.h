/*
 * What each library holds per process: the parsed configuration, its view of the shared state
 * and the fault-injection watch on the configuration file.
 */
#ifndef SIMGPU_RUNTIME_H
#define SIMGPU_RUNTIME_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "config.h"
#include "state.h"

/*
 * How often a running process looks at the configuration file for changed faults. A stat() on
 * every call cost about 0.45 us, more than the simulated calls themselves; a clock read costs
 * a few ns. A rewrite takes effect within this interval plus one tick of CLOCK_MONOTONIC_COARSE.
 */
#define SIM_FAULT_POLL_NS (20ULL * 1000000ULL)

struct sim_runtime {
    struct sim_config cfg;
    struct sim_node node;
    pthread_mutex_t watch_mu;
    struct stat watched;   /* the configuration file as last read */
    uint64_t next_poll_ns; /* CLOCK_MONOTONIC_COARSE time of the next look; 0 = at once */
};

enum sim_open_result { SIM_OPEN_OK, SIM_OPEN_NO_CONFIG, SIM_OPEN_FAILED };

/* Read $SIMGPU_CONFIG and map the node's state. Failures are reported on stderr. */
enum sim_open_result sim_runtime_open(struct sim_runtime *rt);

/*
 * Called on entry to every API function: at most every SIM_FAULT_POLL_NS, picks up fault
 * settings if the configuration file was replaced or modified since last read; then applies the
 * configured call latency.
 */
void sim_faults_on_call(struct sim_runtime *rt);

bool sim_fault_gpu_lost(struct sim_runtime *rt, int gpu);
/* Whether the GPU is in MIG mode now (live, like the faults). */
bool sim_mig_mode(struct sim_runtime *rt, int gpu);
uint64_t sim_fault_fail_alloc(struct sim_runtime *rt, int gpu);
/* Blocks while the GPU's nvml_hang fault is set (NVML entry points that touch the GPU call it). */
void sim_fault_nvml_hang(struct sim_runtime *rt, int gpu);

#endif
