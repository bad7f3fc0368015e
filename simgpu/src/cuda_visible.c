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
 *  - an empty value hides every GPU.
 * NVML ignores the variable; libnvidia-ml never calls this.
 */
#include <ctype.h>
#include <string.h>

#include "cuda_internal.h"

/* The configured GPU an entry of `len` bytes names, or -1 when it names none. */
static int resolve(const struct sim_config *cfg, const char *entry, size_t len)
{
    while (len > 0 && isspace((unsigned char)*entry)) {
        entry++;
        len--;
    }
    while (len > 0 && isspace((unsigned char)entry[len - 1]))
        len--;
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
        order[count++] = gpu; /* fits: no GPU twice, so at most gpu_count entries */
        if (comma == NULL)
            return count;
        entry = comma;
    }
}

void sim_cuda_select_visible(struct sim_config *cfg, const char *visible)
{
    int order[SIM_MAX_GPUS];
    int count = parse(cfg, visible, order);
    struct sim_gpu_config picked[SIM_MAX_GPUS];
    for (int i = 0; i < count; i++)
        picked[i] = cfg->gpus[order[i]];
    memcpy(cfg->gpus, picked, (size_t)count * sizeof picked[0]);
    cfg->gpu_count = count;
}
