/*
 * The simulated node's configuration: which GPUs exist and how they behave. Read from the file
 * named by $SIMGPU_CONFIG (format: docs/simgpu.md). Both libraries parse the same file, so a
 * node's CUDA and NVML views can never disagree.
 */
#ifndef SIMGPU_CONFIG_H
#define SIMGPU_CONFIG_H

/* The CUDA version a node reports when its configuration does not set one. */
#define SIM_DEFAULT_CUDA_DRIVER_VERSION 12040

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_CONFIG_ENV "SIMGPU_CONFIG"
#define SIM_MAX_GPUS 16
#define SIM_MAX_KERNELS 64
#define SIM_NAME_LEN 96
#define SIM_VERSION_LEN 80
#define SIM_MAX_MIG 7          /* MIG instances per GPU: what an A100/H100 holds at most */
#define SIM_PROFILE_LEN 32
/* Memory accounting domains in the shared state: GPUs first, then each GPU's MIG instances. */
#define SIM_MEM_DOMAINS (SIM_MAX_GPUS * (1 + SIM_MAX_MIG))

/* Faults are the only settings a running process picks up again when the file changes. */
struct sim_gpu_faults {
    uint64_t fail_alloc; /* this process's Nth allocation on the GPU fails; 0 = never */
    bool lost;           /* the GPU has fallen off the bus */
    bool nvml_hang;      /* NVML calls that touch the GPU block until the fault is cleared */
};

/* One MIG instance (a GPU instance with one compute instance) of a GPU: a [mig] section. */
struct sim_mig_config {
    char profile[SIM_PROFILE_LEN]; /* "1g.10gb": what NVML's name and HAMi's resource carry */
    char uuid[SIM_NAME_LEN];       /* MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx */
    uint64_t memory_bytes;
    int sm_count;
};

struct sim_gpu_config {
    char uuid[SIM_NAME_LEN];
    char name[SIM_NAME_LEN];
    uint64_t memory_bytes;
    int sm_count;
    int cc_major;
    int cc_minor;
    unsigned int pci_domain, pci_bus, pci_device, pci_function;
    unsigned int pci_device_id;    /* NVML's pciDeviceId: device id << 16 | vendor 0x10de */
    unsigned int pci_subsystem_id;
    unsigned int minor;
    int brand;                     /* nvmlBrandType_t */
    unsigned int power_mw;
    unsigned int power_limit_mw;
    unsigned int temperature_c;
    struct sim_gpu_faults faults;
    /* MIG mode, live like the faults: the GPU's instances exist only while it is on. The instances
     * themselves are topology, fixed for a running process. */
    bool mig_mode;
    int mig_count;
    struct sim_mig_config mig[SIM_MAX_MIG];
    /* What libcuda shows for this entry: -1 the whole GPU, else that MIG instance of it (after
     * CUDA_VISIBLE_DEVICES named it); and the memory accounting domain in the shared state. */
    int mig_index;
    int mem_domain;
    /* Position in the configuration file: the GPU's NVML index and its index in the shared
     * state. libcuda reorders its copy of gpus[] by CUDA_VISIBLE_DEVICES; this stays. */
    int node_index;
};

/* How long a launch of one function occupies the device. */
struct sim_kernel_config {
    char name[128];
    bool from_param0; /* duration is the first kernel parameter, a uint64 of nanoseconds */
    uint64_t ns;      /* otherwise this fixed duration */
};

struct sim_config {
    char path[PATH_MAX];
    char state_file[PATH_MAX];
    char driver_version[SIM_VERSION_LEN];
    int cuda_driver_version;
    uint64_t util_window_ns;
    uint64_t default_kernel_ns;
    uint64_t latency_ns; /* fault: added to every API call of both libraries */
    int gpu_count;
    struct sim_gpu_config gpus[SIM_MAX_GPUS];
    int kernel_count;
    struct sim_kernel_config kernels[SIM_MAX_KERNELS];
};

/*
 * Parse `path` into `out`. Returns 0, or -1 with a message naming the file and line in `err`.
 * Unknown sections, unknown keys, duplicate keys, malformed values and missing required keys
 * are all errors: a typo must not silently yield a default GPU.
 */
int sim_config_load(const char *path, struct sim_config *out, char *err, size_t errlen);

/* A hash of what the shared state's layout depends on (GPU count, UUIDs, memory sizes, and the
 * same of each GPU's MIG instances). */
uint64_t sim_config_fingerprint(const struct sim_config *cfg);

/* Parse "dddd:bb:dd.f" or "dddddddd:bb:dd.f" (hex); returns 0 on success. */
int sim_parse_pci_bus_id(const char *text, unsigned int *domain, unsigned int *bus,
                         unsigned int *device, unsigned int *function);

#endif
