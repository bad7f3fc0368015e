/*
 * Resolving the real driver. The shim is linked with a DT_NEEDED entry on the alias
 * libcuda-real.so.1 (a symlink beside the shim pointing at the real libcuda.so.1), so that
 * library is always loaded with the shim and can be named: dlsym on its handle searches it and
 * its dependencies only, never the shim, whatever order objects were loaded in.
 */
#include <dlfcn.h>
#include <stddef.h>

#include "log.h"
#include "real.h"

struct shim_real shim_real;

#define SHIM_REAL_ALIAS "libcuda-real.so.1"

int shim_real_resolve(void)
{
    void *lib = dlopen(SHIM_REAL_ALIAS, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        SHIM_ERROR("the real driver (%s) is not loaded: %s", SHIM_REAL_ALIAS, dlerror());
        return -1;
    }
    int missing = 0;
#define SHIM_RESOLVE(name)                                                                        \
    shim_real.name = (__typeof__(&name))dlsym(lib, #name);                                        \
    if (shim_real.name == NULL) {                                                                 \
        SHIM_ERROR("the real driver has no %s", #name);                                           \
        missing++;                                                                                \
    }
#define SHIM_RESOLVE_OPT(name) shim_real.name = (__typeof__(&name))dlsym(lib, #name);
    SHIM_CUDA_ENTRY_POINTS(SHIM_RESOLVE, SHIM_RESOLVE_OPT)
#undef SHIM_RESOLVE
#undef SHIM_RESOLVE_OPT
    dlclose(lib); /* drops only the reference NOLOAD took; the DT_NEEDED one keeps it loaded */
    return missing == 0 ? 0 : -1;
}
