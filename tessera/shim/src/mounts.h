/*
 * What the kernel says about the mount an open file lives on: its mount ID (from
 * /proc/self/fdinfo), and that mount's line in /proc/self/mountinfo - the filesystem's device, the
 * folder of that filesystem the mount shows (its "root"), and whether it is read-only.
 *
 * Why the shim asks: a prepared container's limits and usage region are trusted because of where
 * the node put them, and only the kernel's record of a mount says that. A tenant can rename,
 * write and symlink files in its container, but it cannot make a mount: a file it made shows the
 * container's own root filesystem, not the node's claim folder.
 */
#ifndef TESSERA_MOUNTS_H
#define TESSERA_MOUNTS_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

struct tessera_mount {
    int id;
    unsigned int major, minor;
    char root[PATH_MAX];  /* the folder of the filesystem this mount shows, unescaped */
    bool read_only;       /* the mount's own flag, not the filesystem's */
};

/* The mount `fd` (any open file, O_PATH included) is on. Returns 0, or -1 with a reason. */
int tessera_mount_of(int fd, struct tessera_mount *out, char *err, size_t errlen);

/* Whether `dir_fd` is the root of its mount: its ".." is on another mount. 1 yes, 0 no, -1 with a
 * reason when the kernel cannot say. */
int tessera_is_mount_root(int dir_fd, char *err, size_t errlen);

#endif
