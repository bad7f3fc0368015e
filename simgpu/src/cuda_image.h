/*
 * Module images: what a PTX text, a cubin (CUDA ELF) or a fatbin says about its entry
 * functions. The simulator never runs device code; it reads an image only to know which kernels
 * it defines, so that looking up a name it does not define fails as on a real driver.
 */
#ifndef SIMGPU_CUDA_IMAGE_H
#define SIMGPU_CUDA_IMAGE_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda_driver_abi.h"

/* An image's size is not known when it comes from memory (cuModuleLoadData): its headers say. */
#define SIM_IMAGE_SIZE_UNKNOWN ((size_t)-1)

/* One kernel parameter in the device-side parameter layout (cuFuncGetParamInfo). */
struct sim_param {
    size_t offset, size;
};

/* An entry function and, where the image says, its parameters. */
struct sim_entry {
    char *name;
    bool params_known; /* a cubin without the kernel's .nv.info section does not say */
    size_t param_count;
    struct sim_param *params;
};

struct sim_image {
    bool opaque;   /* none of the formats above (or a compressed fatbin): any name resolves */
    size_t extent; /* bytes the image occupies (0 when opaque) */
    size_t count;  /* entry functions */
    struct sim_entry *entries;
};

/*
 * Read `image` (`size` bytes, or SIM_IMAGE_SIZE_UNKNOWN) for a device of compute capability
 * `cc` (major * 10 + minor; negative: any device, which only checks the format). A fatbin
 * contributes the entry a real driver would pick: the cubin built for the device's architecture
 * (same major, minor not above it), else PTX for an architecture not above it. Returns
 * CUDA_ERROR_INVALID_IMAGE for a malformed cubin or fatbin, CUDA_ERROR_NO_BINARY_FOR_GPU for a
 * fatbin with nothing for this device, CUDA_ERROR_OUT_OF_MEMORY.
 */
CUresult sim_image_read(const void *image, size_t size, int cc, struct sim_image *out);

/* Whether `name` is an entry function of the image (always, for an opaque one). */
bool sim_image_defines(const struct sim_image *image, const char *name);

/* The entry function `name`, or NULL (an opaque image has none). */
const struct sim_entry *sim_image_entry(const struct sim_image *image, const char *name);

/* Parameter `index` of an entry (cuFuncGetParamInfo): CUDA_ERROR_INVALID_VALUE past the last,
 * CUDA_ERROR_NOT_SUPPORTED where the image does not say (NULL entry: an opaque image). */
CUresult sim_entry_param(const struct sim_entry *entry, size_t index, size_t *offset,
                         size_t *size);

void sim_image_free(struct sim_image *image);

#endif
