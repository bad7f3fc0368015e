/*
 * Task priority on a shared GPU: while a high-priority claim on a GPU has kernels in flight,
 * low-priority claims on that GPU hold their launches back (design: priority.c, docs/shim.md).
 */
#ifndef TESSERA_PRIORITY_H
#define TESSERA_PRIORITY_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera_shim.h"

/* Open the board of each GPU of `limits` found in `dir` (NULL: no boards). Returns whether any
 * board was opened, i.e. whether launches on some GPU must go through priority.c. */
bool shim_priority_open(const struct tessera_limits *limits, const char *dir, bool prepared);

/* The board of limits entry `i`, or -1 if it has none. */
int shim_priority_board(uint32_t i);

/* A low-priority launch on board `board`: wait while a high-priority neighbour is busy (at most
 * SHIM_PRIORITY_MAX_HOLD_NS), counting the wait in region GPU `gpu`. */
void shim_priority_hold(int board, struct tessera_region_gpu *gpu);

/* A high-priority launch on board `board` whose kernel should take `expect_ns`. */
void shim_priority_publish(int board, int64_t expect_ns);

#endif
