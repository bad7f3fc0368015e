/*
 * Creating a shared file once, whole: the usage region and the priority boards are files that
 * several processes (and the driver) may try to create at the same moment, and that readers must
 * never see half-written.
 */
#ifndef TESSERA_CREATE_ONCE_H
#define TESSERA_CREATE_ONCE_H

#include <stddef.h>

/* Write `len` bytes to a temporary file beside `path` (mode 0666 whatever the umask, synced), then
 * link it to `path`: of two creators racing, the first file stays and the second returns 0 too.
 * Returns 0, or -1 with a reason naming `path` in `err`. */
int tessera_create_once(const char *path, const void *bytes, size_t len, char *err, size_t errlen);

#endif
