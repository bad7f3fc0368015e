/*
 * Where this process's limits and usage region come from (see limits_source.h). Decided from
 * kernel-visible facts the container cannot change - which mounts exist at the fixed paths, and
 * where the dynamic loader found this library - before the environment is consulted at all.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "limits_source.h"
#include "tessera_shim.h"

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Anything at `path`, even a dangling link or a file this uid cannot read: only ENOENT (and
 * ENOTDIR, a parent that is no folder) means nothing is there. */
static bool present(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 || (errno != ENOENT && errno != ENOTDIR);
}

/* True when the dynamic loader found this library in the folder prepare mounts the shim at: the
 * path is the loader's record of what it opened, not anything the program can rename. */
static bool loaded_from_prepared_folder(void)
{
    Dl_info info;
    if (dladdr((void *)&tessera_limits_load, &info) == 0 || info.dli_fname == NULL)
        return false;
    size_t n = strlen(TESSERA_CONTAINER_SHIM_DIR);
    return strncmp(info.dli_fname, TESSERA_CONTAINER_SHIM_DIR, n) == 0 && info.dli_fname[n] == '/';
}

static int decide(struct tessera_limits_source *out, char *err, size_t errlen)
{
    bool fixed_limits = present(TESSERA_CONTAINER_LIMITS);
    bool prepared_shim = loaded_from_prepared_folder();
    if (fixed_limits || prepared_shim) {
        *out = (struct tessera_limits_source){
            .origin = TESSERA_LIMITS_PREPARED,
            .limits_path = TESSERA_CONTAINER_LIMITS,
            .region_path = TESSERA_CONTAINER_REGION,
            .priority_dir = TESSERA_CONTAINER_PRIORITY_DIR,
            .why = fixed_limits ? "the container's fixed limits path"
                                : "the shim's prepared folder " TESSERA_CONTAINER_SHIM_DIR,
        };
        if (!fixed_limits)
            return fail(err, errlen,
                        "this container was prepared by Tessera (the shim is loaded from %s) but "
                        "its limits file %s is missing",
                        TESSERA_CONTAINER_SHIM_DIR, TESSERA_CONTAINER_LIMITS);
        if (!present(TESSERA_CONTAINER_REGION))
            return fail(err, errlen,
                        "this container was prepared by Tessera but its usage region %s is missing",
                        TESSERA_CONTAINER_REGION);
        return 0;
    }
    const char *limits = getenv(TESSERA_LIMITS_ENV);
    if (limits == NULL || limits[0] == '\0') {
        *out = (struct tessera_limits_source){
            .origin = TESSERA_LIMITS_NONE,
            .why = "not a prepared container and " TESSERA_LIMITS_ENV " is not set",
        };
        return 0;
    }
    const char *region = getenv(TESSERA_REGION_ENV);
    const char *boards = getenv(TESSERA_PRIORITY_ENV);
    *out = (struct tessera_limits_source){
        .origin = TESSERA_LIMITS_FROM_ENV,
        .limits_path = limits,
        .region_path = region != NULL && region[0] != '\0' ? region : NULL,
        .priority_dir = boards != NULL && boards[0] != '\0' ? boards : NULL,
        .why = "$" TESSERA_LIMITS_ENV,
    };
    return 0;
}

int tessera_limits_load(struct tessera_limits_source *source, struct tessera_limits *out, char *err,
                        size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (decide(source, err, errlen) != 0)
        return -1;
    if (source->origin == TESSERA_LIMITS_NONE)
        return 0;
    int rc = tessera_limits_read(source->limits_path, out, err, errlen);
    if (rc == 1)
        return fail(err, errlen, "the limits file %s (from %s) does not exist", source->limits_path,
                    source->why);
    return rc;
}
