/* Graph memory charges (graph_mem.h). */
#include "graph_mem.h"

#include <pthread.h>
#include <stdlib.h>

#include "log.h"

static uint64_t residue[SHIM_MAX_DEVICES]; /* charged for RESERVED_MEM_CURRENT, per ordinal */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t granules(uint64_t bytes)
{
    if (bytes > UINT64_MAX - (SHIM_GRAPH_GRANULE - 1))
        return UINT64_MAX;
    return (bytes + SHIM_GRAPH_GRANULE - 1) / SHIM_GRAPH_GRANULE * SHIM_GRAPH_GRANULE;
}

/* Add an allocation node's charge to the sum on its device. */
static CUresult add_alloc_node(CUgraphNode node, int *dev, uint64_t *bytes)
{
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    CUresult rc = shim_real.cuGraphMemAllocNodeGetParams(node, &p);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (*dev >= 0 && *dev != p.poolProps.location.id) {
        SHIM_WARN("graph with memory on CUDA devices %d and %d refused: one executable graph's "
                  "memory is charged on one device", *dev, p.poolProps.location.id);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    *dev = p.poolProps.location.id;
    uint64_t add = granules(p.bytesize);
    *bytes = *bytes > UINT64_MAX - add ? UINT64_MAX : *bytes + add;
    return CUDA_SUCCESS;
}

CUresult shim_graph_bound(CUgraph graph, int *dev, uint64_t *bytes)
{
    *dev = -1;
    *bytes = 0;
    if (shim_real.cuGraphGetNodes == NULL || shim_real.cuGraphNodeGetType == NULL)
        return CUDA_ERROR_NOT_SUPPORTED;
    size_t count = 0;
    CUresult rc = shim_real.cuGraphGetNodes(graph, NULL, &count);
    if (rc != CUDA_SUCCESS || count == 0)
        return rc;
    CUgraphNode *nodes = calloc(count, sizeof *nodes);
    if (nodes == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = shim_real.cuGraphGetNodes(graph, nodes, &count);
    for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++) {
        CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL;
        rc = shim_real.cuGraphNodeGetType(nodes[i], &type);
        if (rc == CUDA_SUCCESS && type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
            rc = shim_real.cuGraphMemAllocNodeGetParams != NULL
                     ? add_alloc_node(nodes[i], dev, bytes)
                     : CUDA_ERROR_NOT_SUPPORTED;
    }
    free(nodes);
    return rc;
}

/* Charge or refund the difference between the residue and what the driver reserves. A growth is
 * charged even past the limit: the driver holds that memory already (instantiations were charged
 * a bound for it), and charging it keeps the claim's other allocations from adding to it. */
static void settle_locked(int dev, const struct shim_device *d)
{
    cuuint64_t now = 0;
    if (shim_real.cuDeviceGetGraphMemAttribute == NULL ||
        shim_real.cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
                                               &now) != CUDA_SUCCESS)
        return; /* kept as it was: an over-charge at worst */
    if (now < residue[dev])
        tessera_region_release(&shim.region, d->gpu, residue[dev] - now);
    else if (now > residue[dev])
        tessera_region_reserve(&shim.region, d->gpu, now - residue[dev], UINT64_MAX);
    residue[dev] = now;
}

void shim_graph_settle(int dev)
{
    const struct shim_device *d = dev >= 0 && dev < SHIM_MAX_DEVICES ? shim_device(dev) : NULL;
    if (d == NULL || d->memory_limit == TESSERA_NO_MEMORY_LIMIT)
        return;
    pthread_mutex_lock(&mu);
    settle_locked(dev, d);
    pthread_mutex_unlock(&mu);
}

bool shim_graph_reclaim(int dev)
{
    const struct shim_device *d = dev >= 0 && dev < SHIM_MAX_DEVICES ? shim_device(dev) : NULL;
    if (d == NULL || d->memory_limit == TESSERA_NO_MEMORY_LIMIT ||
        shim_real.cuDeviceGraphMemTrim == NULL)
        return false;
    pthread_mutex_lock(&mu);
    uint64_t before = residue[dev];
    bool reclaimed = false;
    if (before > 0 && shim_real.cuDeviceGraphMemTrim(dev) == CUDA_SUCCESS) {
        settle_locked(dev, d);
        reclaimed = residue[dev] < before;
    }
    pthread_mutex_unlock(&mu);
    return reclaimed;
}

void shim_graph_child_after_fork(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    mu = fresh;
    for (int i = 0; i < SHIM_MAX_DEVICES; i++)
        residue[i] = 0;
}
