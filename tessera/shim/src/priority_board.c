/*
 * The priority board of one GPU (format and trust rules: tessera_shim.h). Only pread and pwrite of
 * the whole record, never a mapping: the file is shared by tenants that do not trust each other,
 * and a mapped file a writer truncates faults every reader (SIGBUS); a short read only fails the
 * header check.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "create_once.h"
#include "fail.h"
#include "tessera_shim.h"

_Static_assert(sizeof(struct tessera_priority_board) == 64, "board layout is part of the format");

static void board_init(struct tessera_priority_board *b)
{
    memset(b, 0, sizeof *b);
    memcpy(b->magic, TESSERA_BOARD_MAGIC, sizeof b->magic);
    b->version = TESSERA_BOARD_VERSION;
    b->size = sizeof *b;
}

static int board_valid(const struct tessera_priority_board *b)
{
    return memcmp(b->magic, TESSERA_BOARD_MAGIC, sizeof b->magic) == 0 &&
           b->version == TESSERA_BOARD_VERSION && b->size == sizeof *b;
}

int tessera_board_read(int fd, struct tessera_priority_board *out)
{
    ssize_t got;
    do
        got = pread(fd, out, sizeof *out, 0);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof *out || !board_valid(out))
        return -1;
    return 0;
}

int tessera_board_create(const char *path, char *err, size_t errlen)
{
    /* An existing board is kept whatever it holds: running containers have its inode mounted,
     * and a replacement would split the GPU's tenants between two boards. A high-priority
     * writer heals one that does not read back as a board (tessera_board_publish). */
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return tessera_fail(err, errlen, "%s: not a regular file", path);
        return 0;
    }
    if (errno != ENOENT)
        return tessera_fail(err, errlen, "%s: cannot inspect: %s", path, strerror(errno));
    struct tessera_priority_board b;
    board_init(&b);
    return tessera_create_once(path, &b, sizeof b, err, errlen);
}

uint64_t tessera_board_hold_until(const struct tessera_priority_board *b, uint64_t now)
{
    uint64_t beat = b->heartbeat_ns;
    if (beat == 0 || beat > now + TESSERA_BOARD_SKEW_NS)
        return 0; /* never written, or a time that has not come: believe nothing */
    uint64_t busy = b->busy_until_ns;
    if (busy < beat)
        busy = beat;
    if (busy > beat + TESSERA_BOARD_MAX_AHEAD_NS)
        busy = beat + TESSERA_BOARD_MAX_AHEAD_NS;
    uint64_t until = busy + TESSERA_BOARD_LINGER_NS;
    return until > now ? until : 0;
}

int tessera_board_publish(int fd, uint64_t now, uint64_t busy_until)
{
    struct tessera_priority_board b;
    if (tessera_board_read(fd, &b) != 0)
        board_init(&b); /* truncated or scribbled on: write a whole board again */
    /* Another high-priority launch may already hold the GPU for longer: keep the later end. A
     * race between two writers can lose the later one until its next launch; the linger covers
     * the gap, and nothing worse than a shorter hold can come of it. */
    if (b.busy_until_ns > busy_until && b.busy_until_ns <= now + TESSERA_BOARD_MAX_AHEAD_NS)
        busy_until = b.busy_until_ns;
    b.heartbeat_ns = now;
    b.busy_until_ns = busy_until;
    b.high_launches++;
    ssize_t put;
    do
        put = pwrite(fd, &b, sizeof b, 0);
    while (put < 0 && errno == EINTR);
    return put == (ssize_t)sizeof b ? 0 : -1;
}
