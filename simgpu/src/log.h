/* Diagnostics from the simulated driver go to stderr, prefixed so they are easy to attribute. */
#ifndef SIMGPU_LOG_H
#define SIMGPU_LOG_H

#include <stdio.h>

#define sim_log(...)                                                                              \
    do {                                                                                          \
        fprintf(stderr, "simgpu: " __VA_ARGS__);                                                 \
        fputc('\n', stderr);                                                                      \
    } while (0)

/* Every API entry point the libraries export is marked with this; everything else is hidden. */
#define SIMGPU_API __attribute__((visibility("default")))

#endif
