/*
 * Where this process's limits and usage region come from (see limits_source.h). Decided from
 * kernel-visible facts the container cannot change - which mounts exist at the fixed paths, and
 * where the dynamic loader found this library - before the environment is consulted at all.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "limits_source.h"
#include "mounts.h"
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

/* The device and inode of the file the loader mapped this library from: the kernel's record in
 * /proc/self/maps, not a path anyone can rename. */
static int mapped_file(const void *base, dev_t *dev, ino_t *ino)
{
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps == NULL)
        return -1;
    char line[PATH_MAX + 128];
    int rc = -1;
    bool at_start = true; /* the rest of a line longer than the buffer (a long file name) is no line */
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long start, end, inode;
        unsigned int major, minor;
        bool starts = at_start;
        at_start = strchr(line, '\n') != NULL;
        if (starts && sscanf(line, "%lx-%lx %*s %*x %x:%x %lu", &start, &end, &major, &minor, &inode) == 5 &&
            (uintptr_t)base >= start && (uintptr_t)base < end) {
            *dev = makedev(major, minor);
            *ino = (ino_t)inode;
            rc = 0;
            break;
        }
    }
    fclose(maps);
    return rc;
}

/* Whether the library this code runs in is the file <dir_fd>/shim/<its name>. */
static bool loaded_from(int dir_fd)
{
    Dl_info info;
    if (dladdr((void *)&tessera_limits_load, &info) == 0 || info.dli_fname == NULL)
        return false;
    const char *name = strrchr(info.dli_fname, '/');
    char inside[PATH_MAX];
    snprintf(inside, sizeof inside, "shim/%s", name != NULL ? name + 1 : info.dli_fname);
    dev_t dev;
    ino_t ino;
    struct stat st;
    return mapped_file(info.dli_fbase, &dev, &ino) == 0 &&
           fstatat(dir_fd, inside, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == dev && st.st_ino == ino;
}

/* The mount `path` is on, or -1 with a reason (ENOENT left in errno for the caller). */
static int mount_of_path(const char *path, struct tessera_mount *m, char *err, size_t errlen)
{
    int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = tessera_mount_of(fd, m, err, errlen);
    close(fd);
    return rc;
}

/* The claim folder prepare mounted at TESSERA_CONTAINER_DIR, checked as limits_source.h says. */
static int prepared(struct tessera_limits_source *out, char *err, size_t errlen)
{
    const char *dir = TESSERA_CONTAINER_DIR;
    out->dir_fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (out->dir_fd < 0)
        return fail(err, errlen, "this container was prepared by Tessera but %s cannot be opened: %s",
                    dir, strerror(errno));
    char why[400] = "";
    struct tessera_mount claim;
    if (tessera_mount_of(out->dir_fd, &claim, why, sizeof why) != 0)
        return fail(err, errlen, "cannot tell which mount %s is: %s", dir, why);
    int root = tessera_is_mount_root(out->dir_fd, why, sizeof why);
    if (root < 0)
        return fail(err, errlen, "cannot tell whether %s is a mount: %s", dir, why);
    if (root == 0 || !claim.read_only)
        return fail(err, errlen,
                    "%s is not the read-only mount of the claim's folder that prepare makes "
                    "(a folder made inside the container stands there)", dir);
    if (!loaded_from(out->dir_fd))
        return fail(err, errlen, "the shim was not loaded from %s, the claim's own mount", TESSERA_CONTAINER_SHIM_DIR);
    const char *names[3] = {"limits", "usage", "priority"};
    snprintf(out->via, sizeof out->via, "/proc/self/fd/%d", out->dir_fd);
    for (int i = 0; i < 3; i++)
        snprintf(out->paths[i], sizeof out->paths[i], "%s/%s", out->via, names[i]);
    out->limits_path = out->paths[0];
    out->region_path = out->paths[1];
    out->priority_dir = out->paths[2];

    struct tessera_mount limits, region;
    if (mount_of_path(out->limits_path, &limits, why, sizeof why) != 0)
        return errno == ENOENT ? fail(err, errlen,
                                      "this container was prepared by Tessera but its limits file %s "
                                      "is missing", TESSERA_CONTAINER_LIMITS)
                               : fail(err, errlen, "cannot check %s: %s", TESSERA_CONTAINER_LIMITS,
                                      why[0] ? why : strerror(errno));
    if (limits.id != claim.id)
        return fail(err, errlen, "%s is not the claim folder's own file (something is mounted over it)",
                    TESSERA_CONTAINER_LIMITS);
    if (mount_of_path(out->region_path, &region, why, sizeof why) != 0)
        return errno == ENOENT ? fail(err, errlen,
                                      "this container was prepared by Tessera but its usage region %s "
                                      "is missing", TESSERA_CONTAINER_REGION)
                               : fail(err, errlen, "cannot check %s: %s", TESSERA_CONTAINER_REGION,
                                      why[0] ? why : strerror(errno));
    char expected[PATH_MAX + 8];
    snprintf(expected, sizeof expected, "%s/usage", strcmp(claim.root, "/") == 0 ? "" : claim.root);
    if (region.major != claim.major || region.minor != claim.minor || strcmp(region.root, expected) != 0)
        return fail(err, errlen, "%s is not the claim folder's usage region (a mount of %s, not of %s)",
                    TESSERA_CONTAINER_REGION, region.root, expected);
    return 0;
}

static int decide(struct tessera_limits_source *out, char *err, size_t errlen)
{
    bool fixed_limits = present(TESSERA_CONTAINER_LIMITS);
    bool prepared_shim = loaded_from_prepared_folder();
    if (fixed_limits || prepared_shim) {
        *out = (struct tessera_limits_source){
            .origin = TESSERA_LIMITS_PREPARED,
            .why = fixed_limits ? "the container's fixed limits path"
                                : "the shim's prepared folder " TESSERA_CONTAINER_SHIM_DIR,
            .dir_fd = -1,
        };
        return prepared(out, err, errlen);
    }
    const char *limits = getenv(TESSERA_LIMITS_ENV);
    if (limits == NULL || limits[0] == '\0') {
        *out = (struct tessera_limits_source){
            .origin = TESSERA_LIMITS_NONE,
            .why = "not a prepared container and " TESSERA_LIMITS_ENV " is not set",
            .dir_fd = -1,
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
        .dir_fd = -1,
    };
    return 0;
}

int tessera_limits_load(struct tessera_limits_source *source, struct tessera_limits *out, char *err,
                        size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (decide(source, err, errlen) != 0) {
        tessera_limits_source_release(source);
        return -1;
    }
    if (source->origin == TESSERA_LIMITS_NONE)
        return 0;
    int rc = tessera_limits_read(source->limits_path, out, err, errlen);
    if (rc == 1)
        rc = fail(err, errlen, "the limits file %s (from %s) does not exist", source->limits_path,
                  source->why);
    if (rc != 0) {
        tessera_limits_source_explain(source, err, errlen);
        tessera_limits_source_release(source);
    }
    return rc;
}

void tessera_limits_source_explain(const struct tessera_limits_source *source, char *err, size_t errlen)
{
    if (source->origin != TESSERA_LIMITS_PREPARED || source->via[0] == '\0' || err == NULL)
        return;
    size_t n = strlen(source->via);
    char *at;
    while ((at = strstr(err, source->via)) != NULL && (at[n] == '/' || at[n] == '\0')) {
        char rest[1024];
        snprintf(rest, sizeof rest, "%s", at + n);
        *at = '\0';
        size_t head = strlen(err);
        snprintf(err + head, errlen - head, "%s%s", TESSERA_CONTAINER_DIR, rest);
    }
}

void tessera_limits_source_release(struct tessera_limits_source *source)
{
    if (source->dir_fd >= 0)
        close(source->dir_fd);
    source->dir_fd = -1;
}
