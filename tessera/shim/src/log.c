/* Diagnostics on stderr, filtered by $TESSERA_SHIM_LOG. Each message is one write(2), so lines
 * from concurrent threads and processes do not interleave. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "tessera_shim.h"

static int level = -1; /* -1: not read yet */

void shim_log_init(void)
{
    if (__atomic_load_n(&level, __ATOMIC_ACQUIRE) >= 0)
        return;
    int chosen = SHIM_LOG_WARN;
    const char *v = getenv(TESSERA_LOG_ENV);
    if (v != NULL && v[0] != '\0') {
        static const char *const names[] = {"error", "warn", "info", "debug"};
        int found = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(v, names[i]) == 0)
                found = i;
        if (found < 0) {
            char line[200];
            int n = snprintf(line, sizeof line,
                             "tessera-shim[%d]: warn: %s=%.40s is not error|warn|info|debug; "
                             "using warn\n", (int)getpid(), TESSERA_LOG_ENV, v);
            if (n > 0) {
                ssize_t w = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
                (void)w;
            }
        } else {
            chosen = found;
        }
    }
    __atomic_store_n(&level, chosen, __ATOMIC_RELEASE);
}

int shim_log_enabled(enum shim_log_level l)
{
    shim_log_init();
    return (int)l <= __atomic_load_n(&level, __ATOMIC_RELAXED);
}

void shim_log(enum shim_log_level l, const char *fmt, ...)
{
    if (!shim_log_enabled(l))
        return;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    char line[1024];
    int n = snprintf(line, sizeof line, "tessera-shim[%d]: %s: ", (int)getpid(), names[l]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t w = write(2, line, len);
    (void)w;
}
