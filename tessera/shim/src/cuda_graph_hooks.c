/*
 * Graph memory (graph_mem.h): an executable graph is charged, when instantiated, a bound of what
 * its allocation nodes can take, given back when it is destroyed against what the driver still
 * reserves for graphs, which cuDeviceGraphMemTrim gives back. Without a memory limit each hook
 * calls through unchanged.
 */
#include "graph_mem.h"
#include "log.h"
#include "memory.h"

/* Charge `graph`'s bound, make the instantiation `call(arg)` and record the charge under the
 * executable it returns in `exec`. A bound that does not fit even after the pool and graph
 * memory caches gave back what they hold (shim_charge_begin) is CUDA_ERROR_OUT_OF_MEMORY, before
 * the driver is asked. */
static CUresult instantiate(CUgraph graph, CUgraphExec *exec, CUresult (*call)(void *), void *arg)
{
    if (!shim.memory_limited)
        return call(arg);
    int dev = -1;
    uint64_t bytes = 0;
    CUresult rc = shim_graph_bound(graph, &dev, &bytes);
    if (rc != CUDA_SUCCESS || bytes == 0)
        return rc != CUDA_SUCCESS ? rc : call(arg);
    struct shim_charge c;
    rc = shim_charge_begin(&c, dev, bytes);
    if (rc != CUDA_SUCCESS) {
        SHIM_WARN("graph instantiation refused: its memory nodes can take %llu bytes on CUDA "
                  "device %d, past the claim's limit", (unsigned long long)bytes, dev);
        return rc;
    }
    rc = call(arg);
    if (rc != CUDA_SUCCESS) {
        shim_charge_abort(&c);
        return rc;
    }
    shim_charge_commit(&c, SHIM_KIND_GRAPH_EXEC, (uint64_t)(uintptr_t)*exec);
    return CUDA_SUCCESS;
}

struct instantiate_args {
    CUgraphExec *exec;
    CUgraph graph;
    CUgraphNode *error_node;
    char *log;
    size_t log_size;
    unsigned long long flags;
    void *params;
};

static CUresult call_v1(void *arg)
{
    struct instantiate_args *a = arg;
    return shim_real.cuGraphInstantiate(a->exec, a->graph, a->error_node, a->log, a->log_size);
}

static CUresult call_v2(void *arg)
{
    struct instantiate_args *a = arg;
    return shim_real.cuGraphInstantiate_v2(a->exec, a->graph, a->error_node, a->log,
                                           a->log_size);
}

static CUresult call_with_flags(void *arg)
{
    struct instantiate_args *a = arg;
    return shim_real.cuGraphInstantiateWithFlags(a->exec, a->graph, a->flags);
}

static CUresult call_with_params(void *arg)
{
    struct instantiate_args *a = arg;
    return shim_real.cuGraphInstantiateWithParams(a->exec, a->graph, a->params);
}

static CUresult call_with_params_ptsz(void *arg)
{
    struct instantiate_args *a = arg;
    return shim_real.cuGraphInstantiateWithParams_ptsz(a->exec, a->graph, a->params);
}

#define INSTANTIATE(name, call, ...)                                                              \
    do {                                                                                          \
        shim_init();                                                                              \
        if (shim_real.name == NULL)                                                               \
            return CUDA_ERROR_NOT_FOUND;                                                          \
        struct instantiate_args a = {__VA_ARGS__};                                                \
        return instantiate(graph, exec, call, &a);                                                \
    } while (0)

SHIM_EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *errorNode,
                                        char *logBuffer, size_t bufferSize)
{
    INSTANTIATE(cuGraphInstantiate, call_v1, exec, graph, errorNode, logBuffer, bufferSize, 0, NULL);
}

SHIM_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph,
                                           CUgraphNode *errorNode, char *logBuffer,
                                           size_t bufferSize)
{
    INSTANTIATE(cuGraphInstantiate_v2, call_v2, exec, graph, errorNode, logBuffer, bufferSize, 0,
                NULL);
}

SHIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                                 unsigned long long flags)
{
    INSTANTIATE(cuGraphInstantiateWithFlags, call_with_flags, exec, graph, .flags = flags);
}

SHIM_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, void *params)
{
    INSTANTIATE(cuGraphInstantiateWithParams, call_with_params, exec, graph, .params = params);
}

SHIM_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                                       void *params)
{
    INSTANTIATE(cuGraphInstantiateWithParams_ptsz, call_with_params_ptsz, exec, graph,
                .params = params);
}

/* The executable's bound goes; what the driver still reserves for graphs (its cached or live
 * allocations among it) is charged as the residue first, so the claim never goes under it. */
SHIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    shim_init();
    if (shim_real.cuGraphExecDestroy == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (!shim.memory_limited)
        return shim_real.cuGraphExecDestroy(exec);
    struct shim_entry e;
    bool charged = shim_table_take(SHIM_KIND_GRAPH_EXEC, (uint64_t)(uintptr_t)exec, &e);
    CUresult rc = shim_real.cuGraphExecDestroy(exec);
    if (charged && rc != CUDA_SUCCESS) {
        shim_table_put(&e);
    } else if (charged) {
        shim_graph_settle(e.device);
        shim_uncharge(&e);
    }
    return rc;
}

SHIM_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    shim_init();
    if (shim_real.cuDeviceGraphMemTrim == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = shim_real.cuDeviceGraphMemTrim(device);
    if (rc == CUDA_SUCCESS && shim.memory_limited)
        shim_graph_settle(device);
    return rc;
}
