/*
 * Reading a usage region from outside the claim (the metrics exporter, tests): a private copy
 * taken with pread, never a mapping. The region is world-writable and mounted read-write into
 * the claim's containers, so a reader must assume a tenant shaped it: a shared mapping faults
 * (SIGBUS) on a file truncated under it, a FIFO put in its place blocks an open, and any count or
 * index in it may be out of range. So the reader opens without blocking, copies exactly
 * sizeof(struct tessera_region) bytes of a regular file of exactly that size, checks every field
 * it will use, and never writes: liveness of a slot is asked of the kernel (F_OFD_GETLK on the
 * slot's lock byte, see tessera_region_reap), not taken by locking, so the reader changes nothing
 * the claim's processes rely on.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fail.h"
#include "tessera_shim.h"

/* 1 if some process holds the lock on slot i's byte (its owner is alive), 0 if not, -1 if the
 * kernel cannot say. F_OFD_GETLK reports the lock of any other open file description (the shim's
 * F_OFD_SETLK) and traditional F_SETLK locks alike, and asking with a read lock needs only a
 * descriptor open for reading. */
static int slot_owned(int fd, uint32_t slot)
{
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET,
                       .l_start = TESSERA_REGION_LOCK_BASE + (off_t)slot, .l_len = 1, .l_pid = 0};
    while (fcntl(fd, F_OFD_GETLK, &fl) != 0) {
        if (errno != EINTR)
            return -1;
    }
    return fl.l_type != F_UNLCK;
}

static int check_copy(const struct tessera_region *r, const char *path, char *err, size_t errlen)
{
    if (memcmp(r->magic, TESSERA_REGION_MAGIC, sizeof r->magic) != 0)
        return tessera_fail(err, errlen, "%s: not a Tessera usage region (bad magic)", path);
    if (r->version != TESSERA_REGION_VERSION || r->size != sizeof *r ||
        r->max_gpus != TESSERA_MAX_GPUS || r->max_slots != TESSERA_REGION_SLOTS)
        return tessera_fail(err, errlen,
                            "%s: header says version %u, size %u, %u GPUs, %u slots; expected version "
                            "%d, size %zu, %d GPUs, %d slots",
                            path, r->version, r->size, r->max_gpus, r->max_slots,
                            TESSERA_REGION_VERSION, sizeof *r, TESSERA_MAX_GPUS, TESSERA_REGION_SLOTS);
    if (r->slot_hwm > TESSERA_REGION_SLOTS)
        return tessera_fail(err, errlen, "%s: slot_hwm %u is past the %d slots", path, r->slot_hwm,
                            TESSERA_REGION_SLOTS);
    for (int g = 0; g < TESSERA_MAX_GPUS; g++) {
        const struct tessera_region_gpu *gpu = &r->gpus[g];
        if (gpu->state > TESSERA_GPU_READY)
            return tessera_fail(err, errlen, "%s: GPU entry %d has state %u", path, g, gpu->state);
        if (gpu->state == TESSERA_GPU_READY && memchr(gpu->uuid, '\0', sizeof gpu->uuid) == NULL)
            return tessera_fail(err, errlen, "%s: GPU entry %d has a UUID without an end", path, g);
    }
    for (uint32_t i = 0; i < r->slot_hwm; i++) {
        if (r->slots[i].state > TESSERA_SLOT_ACTIVE)
            return tessera_fail(err, errlen, "%s: slot %u has state %u", path, i, r->slots[i].state);
    }
    return 0;
}

int tessera_region_read(const char *path, struct tessera_region_view *out, char *err,
                        size_t errlen)
{
    memset(out->live, 0, sizeof out->live);
    /* O_NONBLOCK: a FIFO in the region's place must fail the checks below, not block the open. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 1;
        return tessera_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) != 0) {
        tessera_fail(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        tessera_fail(err, errlen, "%s: not a regular file", path);
        goto done;
    }
    if ((uint64_t)st.st_size != sizeof out->region) {
        tessera_fail(err, errlen, "%s: %lld bytes, not the %zu of a usage region", path,
                     (long long)st.st_size, sizeof out->region);
        goto done;
    }
    size_t have = 0;
    char *into = (char *)&out->region;
    while (have < sizeof out->region) {
        ssize_t n = pread(fd, into + have, sizeof out->region - have, (off_t)have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            tessera_fail(err, errlen, "%s: cannot read: %s", path, strerror(errno));
            goto done;
        }
        if (n == 0) {
            tessera_fail(err, errlen, "%s: truncated to %zu bytes while read", path, have);
            goto done;
        }
        have += (size_t)n;
    }
    if (check_copy(&out->region, path, err, errlen) != 0)
        goto done;
    for (uint32_t i = 0; i < out->region.slot_hwm; i++) {
        if (out->region.slots[i].state != TESSERA_SLOT_ACTIVE)
            continue;
        int owned = slot_owned(fd, i);
        if (owned < 0) {
            tessera_fail(err, errlen, "%s: cannot ask for slot %u's lock: %s", path, i,
                         strerror(errno));
            goto done;
        }
        out->live[i] = (uint8_t)owned;
    }
    rc = 0;
done:
    close(fd);
    return rc;
}
