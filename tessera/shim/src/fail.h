/*
 * The format code's one way to fail with a reason: print it into the caller's buffer (when there
 * is one) and return -1. A header of static inline code, because build.py #includes limits.c,
 * region.c and region_read.c into one cffi module, where a static function of one name defined in
 * each would clash.
 */
#ifndef TESSERA_FAIL_H
#define TESSERA_FAIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline int tessera_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline int tessera_fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

#endif
