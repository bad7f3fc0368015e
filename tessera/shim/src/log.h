/* Diagnostics: one line per message on stderr, "tessera-shim[pid]: level: text", filtered by
 * $TESSERA_SHIM_LOG (error, warn, info, debug; default warn). */
#ifndef TESSERA_LOG_H
#define TESSERA_LOG_H

enum shim_log_level { SHIM_LOG_ERROR = 0, SHIM_LOG_WARN = 1, SHIM_LOG_INFO = 2, SHIM_LOG_DEBUG = 3 };

/* Read $TESSERA_SHIM_LOG (once per process; later calls are no-ops). */
void shim_log_init(void);
int shim_log_enabled(enum shim_log_level level);
void shim_log(enum shim_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define SHIM_ERROR(...) shim_log(SHIM_LOG_ERROR, __VA_ARGS__)
#define SHIM_WARN(...) shim_log(SHIM_LOG_WARN, __VA_ARGS__)
#define SHIM_INFO(...) shim_log(SHIM_LOG_INFO, __VA_ARGS__)
#define SHIM_DEBUG(...)                                                                           \
    do {                                                                                          \
        if (shim_log_enabled(SHIM_LOG_DEBUG))                                                     \
            shim_log(SHIM_LOG_DEBUG, __VA_ARGS__);                                                \
    } while (0)

#endif
