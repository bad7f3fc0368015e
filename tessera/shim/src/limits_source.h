/*
 * Where this process's limits and usage region come from. One answer for both halves of the shim
 * (CUDA and NVML), so they can never disagree about whether a process is limited.
 *
 * A prepared container - one the node driver prepared for a claim - has its limits file and usage
 * region at fixed paths (TESSERA_CONTAINER_LIMITS, TESSERA_CONTAINER_REGION) that prepare
 * bind-mounts: nothing inside the container can remove or redirect them, so there the environment
 * is ignored and anything missing is fatal. Everywhere else (the shim run by hand, the test bed's
 * processes outside containers) the environment names the files, and a process whose environment
 * names no limits file is deliberately left unlimited: it is not a Tessera container.
 */
#ifndef TESSERA_LIMITS_SOURCE_H
#define TESSERA_LIMITS_SOURCE_H

#include <stdbool.h>
#include <stddef.h>

#include "tessera_shim.h"

enum tessera_limits_origin {
    TESSERA_LIMITS_NONE = 0,      /* not a prepared container, no $TESSERA_LIMITS_FILE: unlimited */
    TESSERA_LIMITS_PREPARED = 1,  /* the fixed paths of a prepared container */
    TESSERA_LIMITS_FROM_ENV = 2,  /* $TESSERA_LIMITS_FILE (and $TESSERA_USAGE_REGION, if set) */
};

struct tessera_limits_source {
    enum tessera_limits_origin origin;
    const char *limits_path; /* NULL for TESSERA_LIMITS_NONE */
    const char *region_path; /* NULL: no shared region (limits hold per process) */
    const char *priority_dir; /* the GPUs' priority boards (tessera_shim.h); NULL: none */
    const char *why;         /* one phrase saying how the origin was decided, for the log */
};

/*
 * Decide the source and read the limits from it. Returns 0 - `out` empty for TESSERA_LIMITS_NONE -
 * or -1 with a one-line reason in `err`, after which the caller must stop the process: a prepared
 * container whose limits file or usage region is missing, a limits file that does not exist where
 * the environment points, or one that is unreadable or malformed. The returned paths point at
 * constants or at this process's environment.
 */
int tessera_limits_load(struct tessera_limits_source *source, struct tessera_limits *out, char *err,
                        size_t errlen);

#endif
