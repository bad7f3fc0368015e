/*
 * Libraries and kernels (cuLibrary*, cuKernel*): CUDA 12's context-independent modules. A
 * library keeps its image and is loaded as a module into a context the first time something in
 * that context needs it (cuLibraryGetModule, cuKernelGetFunction, a launch), as the driver's
 * lazy loading does; a CUkernel launches as its function in the current context.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_module.h"

struct CUkern_st {
    uint32_t tag;
    CUlibrary library;
    struct sim_func_attrs attrs; /* what its functions start with (cuKernelSetAttribute) */
    struct CUkern_st *next;
    char name[];
};

struct CUlib_st {
    uint32_t tag;
    void *image; /* a copy of the image; NULL for an opaque one (nothing in it to read) */
    size_t size;
    struct sim_image contents; /* read for any device: the format check and the kernel names */
    struct CUkern_st *kernels;
    struct CUmod_st *modules; /* one per context it was loaded into */
};

static bool library_valid(CUlibrary lib)
{
    return lib != NULL && lib->tag == TAG_LIBRARY;
}

bool sim_kernel_valid(CUkernel kernel)
{
    return kernel != NULL && kernel->tag == TAG_KERNEL && library_valid(kernel->library);
}

static CUresult check_options(const void *options, void **values, unsigned int count)
{
    return count > 0 && (options == NULL || values == NULL) ? CUDA_ERROR_INVALID_VALUE
                                                            : CUDA_SUCCESS;
}

/* An image that runs on none of the visible devices does not load (CUDA loads a library into
 * every context, present and future). */
static CUresult check_devices(const void *code, size_t size)
{
    CUresult rc = CUDA_ERROR_NO_BINARY_FOR_GPU;
    for (int dev = 0; dev < sim_cuda.rt.cfg.gpu_count && rc != CUDA_SUCCESS; dev++) {
        const struct sim_gpu_config *g = &sim_cuda.rt.cfg.gpus[dev];
        struct sim_image image;
        rc = sim_image_read(code, size, g->cc_major * 10 + g->cc_minor, &image);
        if (rc == CUDA_SUCCESS)
            sim_image_free(&image);
    }
    return rc;
}

static CUresult load(CUlibrary *library, const void *code, size_t size)
{
    CUlibrary lib = calloc(1, sizeof *lib);
    if (lib == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = sim_image_read(code, size, -1, &lib->contents);
    if (rc == CUDA_SUCCESS)
        rc = check_devices(code, size);
    if (rc == CUDA_SUCCESS && !lib->contents.opaque) {
        lib->size = lib->contents.extent;
        lib->image = malloc(lib->size);
        if (lib->image == NULL)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else
            memcpy(lib->image, code, lib->size);
    }
    if (rc != CUDA_SUCCESS) {
        sim_image_free(&lib->contents);
        free(lib);
        return rc;
    }
    lib->tag = TAG_LIBRARY;
    *library = lib;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code,
                                      CUjit_option *jitOptions, void **jitOptionsValues,
                                      unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                      void **libraryOptionValues, unsigned int numLibraryOptions)
{
    SIM_ENTER();
    if (library == NULL || code == NULL ||
        check_options(jitOptions, jitOptionsValues, numJitOptions) != CUDA_SUCCESS ||
        check_options(libraryOptions, libraryOptionValues, numLibraryOptions) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    return load(library, code, SIM_IMAGE_SIZE_UNKNOWN);
}

SIMGPU_API CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                          CUjit_option *jitOptions, void **jitOptionsValues,
                                          unsigned int numJitOptions,
                                          CUlibraryOption *libraryOptions,
                                          void **libraryOptionValues,
                                          unsigned int numLibraryOptions)
{
    SIM_ENTER();
    if (library == NULL || fileName == NULL ||
        check_options(jitOptions, jitOptionsValues, numJitOptions) != CUDA_SUCCESS ||
        check_options(libraryOptions, libraryOptionValues, numLibraryOptions) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    void *data = NULL;
    size_t size = 0;
    CUresult rc = sim_read_image_file(fileName, &data, &size);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = load(library, data, size);
    free(data);
    return rc;
}

SIMGPU_API CUresult cuLibraryUnload(CUlibrary library)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    bool valid = library_valid(library);
    if (valid) {
        library->tag = 0;
        for (struct CUkern_st *k = library->kernels; k != NULL; k = k->next)
            k->tag = 0;
        for (CUmodule m = library->modules; m != NULL; m = m->next_in_library)
            m->tag = 0;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    if (!valid)
        return CUDA_ERROR_INVALID_HANDLE;
    for (struct CUkern_st *k = library->kernels, *next = NULL; k != NULL; k = next) {
        next = k->next;
        free(k);
    }
    for (CUmodule m = library->modules, next = NULL; m != NULL; m = next) {
        next = m->next_in_library;
        sim_module_free(m);
    }
    sim_image_free(&library->contents);
    free(library->image);
    free(library);
    return CUDA_SUCCESS;
}

/* The library's module in `ctx`, loading it there on first use. */
static CUresult library_module(CUlibrary lib, CUcontext ctx, CUmodule *out)
{
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = library_valid(lib) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    CUmodule m = NULL;
    if (rc == CUDA_SUCCESS) {
        m = lib->modules;
        while (m != NULL && m->ctx != ctx)
            m = m->next_in_library;
    }
    if (rc == CUDA_SUCCESS && m == NULL) {
        rc = sim_module_load(ctx, lib->image != NULL ? lib->image : "",
                             lib->image != NULL ? lib->size : 1, &m);
        if (rc == CUDA_SUCCESS) {
            m->library = lib;
            m->next_in_library = lib->modules;
            lib->modules = m;
        }
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    if (rc == CUDA_SUCCESS)
        *out = m;
    return rc;
}

SIMGPU_API CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    SIM_ENTER();
    if (pMod == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!library_valid(library))
        return CUDA_ERROR_INVALID_HANDLE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    return library_module(library, ctx, pMod);
}

/* The library's kernel `name`, made on first request (the same handle every time). Needs mu. */
static CUresult kernel_locked(CUlibrary lib, const char *name, CUkernel *out)
{
    struct CUkern_st *k = lib->kernels;
    while (k != NULL && strcmp(k->name, name) != 0)
        k = k->next;
    if (k == NULL) {
        if (!sim_image_defines(&lib->contents, name))
            return CUDA_ERROR_NOT_FOUND;
        k = calloc(1, sizeof *k + strlen(name) + 1);
        if (k == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        k->tag = TAG_KERNEL;
        k->library = lib;
        k->attrs = sim_default_func_attrs;
        strcpy(k->name, name);
        k->next = lib->kernels;
        lib->kernels = k;
    }
    *out = k;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    SIM_ENTER();
    if (pKernel == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = library_valid(library) ? kernel_locked(library, name, pKernel)
                                         : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuLibraryGetKernelCount(unsigned int *count, CUlibrary lib)
{
    SIM_ENTER();
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!library_valid(lib))
        return CUDA_ERROR_INVALID_HANDLE;
    *count = (unsigned int)lib->contents.count;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuLibraryEnumerateKernels(CUkernel *kernels, unsigned int numKernels,
                                              CUlibrary lib)
{
    SIM_ENTER();
    if (kernels == NULL && numKernels > 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = library_valid(lib) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && numKernels > lib->contents.count)
        rc = CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; rc == CUDA_SUCCESS && i < numKernels; i++)
        rc = kernel_locked(lib, lib->contents.entries[i].name, &kernels[i]);
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

CUresult sim_launch_function(CUfunction handle, CUcontext ctx, CUfunction *out)
{
    if (sim_function_valid(handle)) {
        *out = handle;
        return CUDA_SUCCESS;
    }
    CUkernel kernel = (CUkernel)handle;
    if (!sim_kernel_valid(kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    CUmodule m = NULL;
    CUresult rc = library_module(kernel->library, ctx, &m);
    if (rc == CUDA_SUCCESS)
        rc = sim_module_function(m, kernel->name, &kernel->attrs, out);
    return rc;
}

SIMGPU_API CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    SIM_ENTER();
    if (pFunc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_kernel_valid(kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_launch_function((CUfunction)kernel, ctx, pFunc);
}

SIMGPU_API CUresult cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel)
{
    SIM_ENTER();
    if (pLib == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_kernel_valid(kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    *pLib = kernel->library;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
    SIM_ENTER();
    if (name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_kernel_valid(hfunc))
        return CUDA_ERROR_INVALID_HANDLE;
    *name = hfunc->name;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
                                         size_t *paramSize)
{
    SIM_ENTER();
    if (!sim_kernel_valid(kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    return sim_entry_param(sim_image_entry(&kernel->library->contents, kernel->name), paramIndex,
                           paramOffset, paramSize);
}

SIMGPU_API CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel,
                                         CUdevice dev)
{
    SIM_ENTER();
    if (!sim_kernel_valid(kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = sim_check_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_func_get_attribute(pi, attrib, &kernel->attrs, dev);
}

SIMGPU_API CUresult cuKernelSetCacheConfig(CUkernel kernel, int config, CUdevice dev)
{
    SIM_ENTER();
    if (!sim_kernel_valid(kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = sim_check_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_check_cache_config(config);
}

/* Sets the attribute for the kernel's functions in every context, those made later included
 * (the simulator does not keep a value per device). */
SIMGPU_API CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel,
                                         CUdevice dev)
{
    SIM_ENTER();
    if (!sim_kernel_valid(kernel))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = sim_check_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    rc = sim_func_set_attribute(&kernel->attrs, attrib, val);
    for (CUmodule m = kernel->library->modules; rc == CUDA_SUCCESS && m != NULL;
         m = m->next_in_library) {
        for (struct CUfunc_st *f = m->functions; f != NULL; f = f->next) {
            if (strcmp(f->name, kernel->name) == 0)
                f->attrs = kernel->attrs;
        }
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}
