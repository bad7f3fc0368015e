/* Process-local state of the simulated NVML, shared by its source files. */
#ifndef SIMGPU_NVML_INTERNAL_H
#define SIMGPU_NVML_INTERNAL_H

#include "log.h"
#include "runtime.h"
#include "nvml_abi.h"

struct nvmlDevice_st {
    int index; /* the GPU's NVML index (a MIG device's parent's) */
    int mig;   /* -1 for a GPU, else which of its MIG instances */
};

struct sim_nvml {
    pthread_mutex_t mu;
    int refs;    /* nvmlInit calls minus nvmlShutdown calls */
    bool loaded; /* configuration read and state mapped (kept across shutdown) */
    struct sim_runtime rt;
    struct nvmlDevice_st devices[SIM_MAX_GPUS];
    struct nvmlDevice_st mig_devices[SIM_MAX_GPUS][SIM_MAX_MIG];
};

extern struct sim_nvml sim_nvml;

/* The guard at the top of every entry point: initialised, faults applied. */
nvmlReturn_t sim_nvml_enter(void);

/* Initialised, and `device` is a handle this library gave out for a GPU that is still there;
 * sets *index. */
nvmlReturn_t sim_nvml_device(nvmlDevice_t device, int *index);

/* Like sim_nvml_device, but also takes a MIG device handle of a GPU that is in MIG mode now;
 * sets *mig to the instance, or -1 for a GPU handle. */
nvmlReturn_t sim_nvml_any_device(nvmlDevice_t device, int *index, int *mig);

#endif
