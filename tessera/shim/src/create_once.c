/* Creating a shared file once, whole (create_once.h). */
#include "create_once.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fail.h"

static int write_whole(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int tessera_create_once(const char *path, const void *bytes, size_t len, char *err, size_t errlen)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (tmp == NULL)
        return tessera_fail(err, errlen, "out of memory");
    /* A name of its own for every call: two threads of one process creating the same file at once
     * (two claims prepared on one GPU) must not write, link and unlink one temporary file. */
    snprintf(tmp, plen + 16, "%s.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return tessera_fail(err, errlen, "%s: cannot create: %s", path, strerror(e));
    }
    /* fchmod: the creating umask must not keep other uids of the claim or the GPU out. */
    int rc = write_whole(fd, bytes, len) == 0 && fchmod(fd, 0666) == 0 && fsync(fd) == 0 ? 0 : -1;
    int e = errno;
    close(fd);
    /* link, not rename: of two creators racing, the first file stays. */
    if (rc == 0 && link(tmp, path) != 0 && errno != EEXIST) {
        e = errno;
        rc = -1;
    }
    unlink(tmp);
    free(tmp);
    if (rc != 0)
        return tessera_fail(err, errlen, "%s: cannot create: %s", path, strerror(e));
    return 0;
}
