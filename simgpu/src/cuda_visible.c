/*
 * CUDA_VISIBLE_DEVICES, as NVIDIA's driver reads it at cuInit: a comma-separated list of GPU
 * indices and/or UUIDs naming the GPUs CUDA may use, renumbered 0..n-1 in list order.
 *  - an index is parsed like strtoul: leading blanks, then the decimal digits at the start of
 *    the entry ("1gpu" is 1); an entry that does not start with a digit, or an index of no GPU,
 *    is invalid;
 *  - a UUID is "GPU-" and any prefix of one GPU's UUID that no other GPU's shares;
 *  - the list ends at the first invalid entry (0,2,-1,1 shows GPUs 0 and 2);
 *  - a GPU named twice, by index or UUID, hides every GPU (as the driver does; PyTorch's
 *    _parse_visible_devices documents and mirrors it);
 *  - an empty value hides every GPU;
 *  - a GPU in MIG mode is not usable as a whole: naming it is an invalid entry, and unset it is
 *    left out. "MIG-" and the full UUID of one of its instances names that instance instead, which
 *    CUDA then shows as a device of its own with the instance's memory and multiprocessors.
 * NVML ignores the variable; libnvidia-ml never calls this.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

static int resolve_gpu(const struct sim_config *cfg, const char *entry, size_t len);

/* The MIG instance of a GPU in MIG mode whose UUID is exactly the entry's, as an id above every
 * GPU's (SIM_MAX_GPUS + gpu * SIM_MAX_MIG + instance: also its memory domain), or -1. */
static int resolve_mig(const struct sim_config *cfg, const char *entry, size_t len)
{
    for (int i = 0; i < cfg->gpu_count; i++) {
        if (!cfg->gpus[i].mig_mode)
            continue;
        for (int k = 0; k < cfg->gpus[i].mig_count; k++) {
            const char *uuid = cfg->gpus[i].mig[k].uuid;
            if (strlen(uuid) == len && strncmp(uuid, entry, len) == 0)
                return SIM_MAX_GPUS + i * SIM_MAX_MIG + k;
        }
    }
    return -1;
}

/* The configured GPU (0..gpu_count-1) or MIG instance (see resolve_mig) an entry of `len` bytes
 * names, or -1 when it names none. */
static int resolve(const struct sim_config *cfg, const char *entry, size_t len)
{
    while (len > 0 && isspace((unsigned char)*entry)) {
        entry++;
        len--;
    }
    while (len > 0 && isspace((unsigned char)entry[len - 1]))
        len--;
    if (len >= 4 && strncmp(entry, "MIG-", 4) == 0)
        return resolve_mig(cfg, entry, len);
    int gpu = resolve_gpu(cfg, entry, len);
    return gpu >= 0 && cfg->gpus[gpu].mig_mode ? -1 : gpu;
}

static int resolve_gpu(const struct sim_config *cfg, const char *entry, size_t len)
{
    if (len >= 4 && strncmp(entry, "GPU-", 4) == 0) {
        int found = -1;
        for (int i = 0; i < cfg->gpu_count; i++) {
            if (strncmp(cfg->gpus[i].uuid, entry, len) == 0) {
                if (found >= 0)
                    return -1; /* ambiguous prefix */
                found = i;
            }
        }
        return found;
    }
    if (len == 0 || !isdigit((unsigned char)entry[0]))
        return -1;
    long index = 0;
    for (size_t i = 0; i < len && isdigit((unsigned char)entry[i]); i++) {
        index = index * 10 + (entry[i] - '0');
        if (index >= cfg->gpu_count)
            return -1;
    }
    return (int)index;
}

/* Fill `order` with the configured GPUs `visible` names, in its order; returns how many. */
static int parse(const struct sim_config *cfg, const char *visible, int *order)
{
    int count = 0;
    for (const char *entry = visible;; entry++) {
        const char *comma = strchr(entry, ',');
        size_t len = comma != NULL ? (size_t)(comma - entry) : strlen(entry);
        int gpu = resolve(cfg, entry, len);
        if (gpu < 0)
            return count;
        for (int i = 0; i < count; i++) {
            if (order[i] == gpu)
                return 0; /* a GPU named twice hides them all */
        }
        if (count == SIM_MAX_GPUS)
            return count; /* as many devices as a process can have */
        order[count++] = gpu;
        if (comma == NULL)
            return count;
        entry = comma;
    }
}

/* The device CUDA shows for `id` (a GPU, or a MIG instance as resolve_mig numbers them). */
static struct sim_gpu_config device_for(const struct sim_config *cfg, int id)
{
    if (id < SIM_MAX_GPUS)
        return cfg->gpus[id];
    int gpu = (id - SIM_MAX_GPUS) / SIM_MAX_MIG, k = (id - SIM_MAX_GPUS) % SIM_MAX_MIG;
    struct sim_gpu_config d = cfg->gpus[gpu];
    const struct sim_mig_config *m = &cfg->gpus[gpu].mig[k];
    snprintf(d.name, sizeof d.name, "%.60s MIG %s", cfg->gpus[gpu].name, m->profile);
    d.memory_bytes = m->memory_bytes;
    d.sm_count = m->sm_count;
    d.mig_index = k;
    d.mem_domain = id; /* instance ids are the instances' memory domains */
    return d;
}

void sim_cuda_select_visible(struct sim_config *cfg, const char *visible)
{
    int order[SIM_MAX_GPUS];
    int count = 0;
    if (visible != NULL) {
        count = parse(cfg, visible, order);
    } else {
        for (int i = 0; i < cfg->gpu_count; i++) {
            if (!cfg->gpus[i].mig_mode)
                order[count++] = i;
        }
    }
    struct sim_gpu_config picked[SIM_MAX_GPUS];
    for (int i = 0; i < count; i++)
        picked[i] = device_for(cfg, order[i]);
    memcpy(cfg->gpus, picked, (size_t)count * sizeof picked[0]);
    cfg->gpu_count = count;
}
