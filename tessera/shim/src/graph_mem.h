/*
 * Graph memory: what a graph's allocation nodes take on the device. The driver takes it when an
 * executable graph launches and, once freed, keeps it in the device's graph memory cache until
 * cuDeviceGraphMemTrim, whatever became of the graph. The claim is charged:
 *
 *  - at instantiation, an upper bound of what the executable can take: each allocation node's
 *    size rounded up to SHIM_GRAPH_GRANULE (shim_graph_bound), recorded in the pointer table
 *    under the executable (SHIM_KIND_GRAPH_EXEC) and refused with CUDA_ERROR_OUT_OF_MEMORY when
 *    it does not fit, so that no launch can take the claim past its limit;
 *  - beside those bounds, a residue: what the driver reserves for the process's graphs on the
 *    device (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), read when an executable graph is destroyed
 *    and after cuDeviceGraphMemTrim (shim_graph_settle). Memory reserved later can only come from
 *    launches of executables still charged their bound, so the residue plus the bounds always
 *    covers what the driver holds; trimming with no executable left brings the charge to what
 *    allocations still live hold.
 */
#ifndef TESSERA_GRAPH_MEM_H
#define TESSERA_GRAPH_MEM_H

#include <stdint.h>

#include "shim_state.h"

/* What an allocation node is charged for, at least. A driver maps graph memory in granules of
 * 2 MiB; the granularity cannot be queried. */
#define SHIM_GRAPH_GRANULE (2ull << 20)

/* The charge for `graph`'s allocation nodes and the CUDA ordinal they are on: CUDA_SUCCESS with
 * *bytes 0 when it has none; CUDA_ERROR_NOT_SUPPORTED when they are on more than one device
 * (one executable's charge is on one device) or the driver cannot list them; the driver's error
 * if a query fails. */
CUresult shim_graph_bound(CUgraph graph, int *dev, uint64_t *bytes);

/* Settle CUDA ordinal `dev`'s residue to what the driver reserves for graphs there now. */
void shim_graph_settle(int dev);

/* The claim is at its limit (any allocation: memory.h): trim `dev`'s graph memory cache and
 * settle. True if the residue went down. */
bool shim_graph_reclaim(int dev);

/* fork(): the child has no graphs (its parent's are not its own). */
void shim_graph_child_after_fork(void);

#endif
