/*
 * Where this process's limits and usage region come from. One answer for both halves of the shim
 * (CUDA and NVML), so they can never disagree about whether a process is limited.
 *
 * A prepared container - one the node driver prepared for a claim - has its claim's folder mounted
 * read-only at TESSERA_CONTAINER_DIR, the usage region a mount of its own inside it. There the
 * environment is ignored, and the kernel is asked (mounts.h) before anything is read: the folder
 * must be the root of a read-only mount holding the very shim file this process mapped, the limits
 * file that mount's own, and the region a mount of the same filesystem's <claim folder>/usage. A
 * folder a tenant put there after renaming the mount's parent fails that, and so does a copy of the
 * shim preloaded from elsewhere: the process stops rather than run with limits nobody prepared.
 * Every path handed back goes through a descriptor of the checked mount (/proc/self/fd/N/...), so
 * nothing renamed between the check and the open can stand in. Anything missing is fatal.
 * Everywhere else (the shim run by hand, the test bed's processes outside containers) the
 * environment names the files, and a process whose environment names no limits file is
 * deliberately left unlimited: it is not a Tessera container.
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
    int dir_fd;              /* prepared: the checked claim folder, open until released; else -1 */
    char via[32];            /* prepared: "/proc/self/fd/<dir_fd>", which the paths start with */
    char paths[3][48];       /* prepared: the three paths above, through dir_fd */
};

/*
 * Decide the source and read the limits from it. Returns 0 - `out` empty for TESSERA_LIMITS_NONE -
 * or -1 with a one-line reason in `err`, after which the caller must stop the process: a prepared
 * container whose limits file or usage region is missing, a limits file that does not exist where
 * the environment points, or one that is unreadable or malformed. The returned paths point at
 * constants, at this process's environment or into `source` itself; release the source once the
 * region and priority boards are open.
 */
int tessera_limits_load(struct tessera_limits_source *source, struct tessera_limits *out, char *err,
                        size_t errlen);

/* Close what tessera_limits_load held open (the prepared claim folder); the paths are then void. */
void tessera_limits_source_release(struct tessera_limits_source *source);

/* Rewrite a reason that names a path through the claim folder's descriptor with the path the
 * container knows (TESSERA_CONTAINER_DIR), for the one line a user reads. */
void tessera_limits_source_explain(const struct tessera_limits_source *source, char *err, size_t errlen);

#endif
