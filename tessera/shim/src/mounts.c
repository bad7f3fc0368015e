/*
 * The kernel's record of the mount an open file is on (see mounts.h). Every read is bounded:
 * fdinfo is a few lines, and mountinfo is read a line at a time, each at most LINE_MAX_BYTES, with
 * at most MAX_MOUNTS lines looked at.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fail.h"
#include "mounts.h"

#define LINE_MAX_BYTES (3 * PATH_MAX)
#define MAX_MOUNTS 100000

static int mount_id_of(int fd, int *id, char *err, size_t errlen)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    int info = open(path, O_RDONLY | O_CLOEXEC);
    if (info < 0)
        return tessera_fail(err, errlen, "cannot read %s: %s", path, strerror(errno));
    ssize_t n = read(info, buf, sizeof buf - 1);
    close(info);
    if (n <= 0)
        return tessera_fail(err, errlen, "cannot read %s", path);
    buf[n] = '\0';
    const char *line = strstr(buf, "mnt_id:");
    if (line == NULL)
        return tessera_fail(err, errlen, "%s names no mount (a kernel older than 3.15?)", path);
    *id = (int)strtol(line + strlen("mnt_id:"), NULL, 10);
    return 0;
}

/* mountinfo escapes a blank, tab, newline and backslash as \ and three octal digits. */
static bool unescape(const char *in, size_t len, char *out, size_t outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = in[i];
        if (c == '\\' && i + 3 < len && in[i + 1] >= '0' && in[i + 1] <= '3' &&
            in[i + 2] >= '0' && in[i + 2] <= '7' && in[i + 3] >= '0' && in[i + 3] <= '7') {
            c = (char)((in[i + 1] - '0') * 64 + (in[i + 2] - '0') * 8 + (in[i + 3] - '0'));
            i += 3;
        }
        if (o + 1 >= outlen)
            return false;
        out[o++] = c;
    }
    out[o] = '\0';
    return true;
}

/* "ID PARENT MAJOR:MINOR ROOT POINT OPTIONS ..." - the fields up to the mount's own options. */
static bool parse_line(const char *line, struct tessera_mount *m)
{
    int consumed = 0;
    if (sscanf(line, "%d %*d %u:%u %n", &m->id, &m->major, &m->minor, &consumed) != 3 || consumed == 0)
        return false;
    const char *root = line + consumed;
    const char *root_end = strchr(root, ' ');
    if (root_end == NULL || !unescape(root, (size_t)(root_end - root), m->root, sizeof m->root))
        return false;
    const char *point_end = strchr(root_end + 1, ' ');
    if (point_end == NULL)
        return false;
    const char *options = point_end + 1;
    m->read_only = strncmp(options, "ro", 2) == 0 && (options[2] == ',' || options[2] == ' ');
    return true;
}

int tessera_mount_of(int fd, struct tessera_mount *out, char *err, size_t errlen)
{
    int id = -1;
    if (mount_id_of(fd, &id, err, errlen) != 0)
        return -1;
    FILE *table = fopen("/proc/self/mountinfo", "re");
    if (table == NULL)
        return tessera_fail(err, errlen, "cannot read /proc/self/mountinfo: %s", strerror(errno));
    char *line = malloc(LINE_MAX_BYTES);
    if (line == NULL) {
        fclose(table);
        return tessera_fail(err, errlen, "out of memory");
    }
    int rc = tessera_fail(err, errlen, "/proc/self/mountinfo lists no mount %d", id);
    for (int n = 0; n < MAX_MOUNTS && fgets(line, LINE_MAX_BYTES, table) != NULL; n++) {
        size_t len = strlen(line);
        if (len > 0 && line[len - 1] != '\n' && !feof(table)) {
            rc = tessera_fail(err, errlen, "/proc/self/mountinfo has a line past %d bytes",
                              LINE_MAX_BYTES);
            break;
        }
        struct tessera_mount m;
        if (!parse_line(line, &m) || m.id != id)
            continue;
        *out = m;
        rc = 0;
        break;
    }
    free(line);
    fclose(table);
    return rc;
}

int tessera_is_mount_root(int dir_fd, char *err, size_t errlen)
{
    int parent = openat(dir_fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (parent < 0)
        return tessera_fail(err, errlen, "cannot open the folder above: %s", strerror(errno));
    int here = -1, above = -1;
    int rc = mount_id_of(dir_fd, &here, err, errlen) == 0 && mount_id_of(parent, &above, err, errlen) == 0
                 ? here != above
                 : -1;
    close(parent);
    return rc;
}
