/*
 * Modules, functions, libraries and kernels as the launch code sees them. A module belongs to
 * one context and holds the functions looked up in it; a library (cuda_library.c) is
 * context-independent and loads itself as a module into each context that uses one of its
 * kernels, as CUDA's lazy loading does. A CUkernel launches like the CUfunction it stands for in
 * the current context.
 */
#ifndef SIMGPU_CUDA_MODULE_H
#define SIMGPU_CUDA_MODULE_H

#include "cuda_image.h"
#include "cuda_internal.h"

/* The attributes a program may set on a function or kernel (they change no timing here). */
struct sim_func_attrs {
    int max_dynamic_shared; /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
    int carveout;           /* CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT */
};

struct CUfunc_st {
    uint32_t tag;
    CUmodule module;
    const struct sim_kernel_config *kernel; /* NULL: default duration */
    struct sim_func_attrs attrs;
    struct CUfunc_st *next;
    char name[];
};

struct CUmod_st {
    uint32_t tag;
    CUcontext ctx;
    CUlibrary library; /* the library that loaded it into ctx, or NULL */
    struct sim_image image;
    struct CUfunc_st *functions;
    struct CUmod_st *next_in_library;
};

/* Load `image` (`size` bytes or SIM_IMAGE_SIZE_UNKNOWN) as a module of `ctx`. */
CUresult sim_module_load(CUcontext ctx, const void *image, size_t size, CUmodule *out);

/* Free a module (its tag already cleared) and its functions. */
void sim_module_free(CUmodule module);

/* The function `name` of a live module: CUDA_ERROR_NOT_FOUND if the image does not define it.
 * One made now starts with `attrs` (NULL: the defaults). */
CUresult sim_module_function(CUmodule module, const char *name,
                             const struct sim_func_attrs *attrs, CUfunction *out);

/* A whole image file, with a NUL after its bytes (PTX from a file need not end in one). */
CUresult sim_read_image_file(const char *path, void **data, size_t *size);

/* What a new function's settable attributes start as. */
extern const struct sim_func_attrs sim_default_func_attrs;

/* Function attributes, for a function or a kernel on `dev`, and setting them in `attrs`. */
CUresult sim_func_get_attribute(int *value, CUfunction_attribute attrib,
                                const struct sim_func_attrs *attrs, CUdevice dev);
CUresult sim_func_set_attribute(struct sim_func_attrs *attrs, CUfunction_attribute attrib,
                                int value);

/* A CUfunc_cache preference: PREFER_NONE (0) to PREFER_EQUAL (3). It changes nothing here. */
static inline CUresult sim_check_cache_config(int config)
{
    return config >= 0 && config <= 3 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

bool sim_module_valid(CUmodule module);
bool sim_function_valid(CUfunction f);
bool sim_kernel_valid(CUkernel kernel); /* cuda_library.c */

/* The function a launch handle names in `ctx`: a CUfunction itself, or a CUkernel's function
 * in that context (cuda_library.c); CUDA_ERROR_INVALID_HANDLE for anything else. */
CUresult sim_launch_function(CUfunction handle, CUcontext ctx, CUfunction *out);

#endif
