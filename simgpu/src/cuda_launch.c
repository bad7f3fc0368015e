/*
 * Kernel launches and (minimal) graphs of kernel and memory nodes. A launch occupies the GPU for its function's duration
 * (cuda_module.c); the handle may be a CUfunction or a library's CUkernel, which launches as its
 * function in the current context.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_graph.h"
#include "cuda_module.h"

/* The first kernel parameter, from either kernelParams or the packed `extra` buffer. */
static int first_param_u64(void **params, void **extra, uint64_t *out)
{
    if (params != NULL && params[0] != NULL) {
        memcpy(out, params[0], sizeof *out);
        return 0;
    }
    const void *buffer = NULL;
    size_t size = 0;
    for (size_t i = 0; extra != NULL && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buffer = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != NULL)
            size = *(size_t *)extra[i + 1];
        else
            return -1;
    }
    if (buffer == NULL || size < sizeof *out)
        return -1;
    memcpy(out, buffer, sizeof *out);
    return 0;
}

struct launch {
    CUfunction f;
    unsigned int grid[3], block[3], shared;
    void **params, **extra;
    bool cooperative;
};

/* Validate a launch and work out its duration (the checks a real launch fails with). */
static CUresult prepare(const struct launch *l, uint64_t *duration)
{
    if (!sim_function_valid(l->f) && !sim_kernel_valid((CUkernel)l->f))
        return CUDA_ERROR_INVALID_HANDLE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    CUfunction f = NULL;
    if (rc == CUDA_SUCCESS)
        rc = sim_launch_function(l->f, ctx, &f);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (f->module->ctx->device != ctx->device)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t threads = (uint64_t)l->block[0] * l->block[1] * l->block[2];
    uint64_t blocks = (uint64_t)l->grid[0] * l->grid[1] * l->grid[2];
    if (blocks == 0 || threads == 0 || threads > 1024 || l->block[0] > 1024 ||
        l->block[1] > 1024 || l->block[2] > 64 || l->grid[0] > 2147483647u ||
        l->grid[1] > 65535 || l->grid[2] > 65535 || l->shared > 232448 ||
        (l->params != NULL && l->extra != NULL))
        return CUDA_ERROR_INVALID_VALUE;
    if (l->cooperative) {
        /* Every block must be resident at once. */
        uint64_t per_sm = 2048 / threads < 32 ? 2048 / threads : 32;
        if (blocks > per_sm * (uint64_t)sim_cuda.rt.cfg.gpus[ctx->device].sm_count)
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    const struct sim_kernel_config *k = f->kernel;
    if (k == NULL)
        *duration = sim_cuda.rt.cfg.default_kernel_ns;
    else if (!k->from_param0)
        *duration = k->ns;
    else if (first_param_u64(l->params, l->extra, duration) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult launch(const struct launch *l, CUstream stream, enum sim_default_stream mode)
{
    uint64_t duration = 0;
    CUresult rc = prepare(l, &duration);
    struct CUstream_st *s = NULL;
    if (rc == CUDA_SUCCESS)
        rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUgraph capture = sim_stream_capture(s);
    if (capture != NULL)
        return sim_graph_append(capture, duration); /* recorded, not run */
    sim_stream_submit(s, duration);
    return CUDA_SUCCESS;
}

static CUresult launch_kernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                              unsigned int gridDimZ, unsigned int blockDimX,
                              unsigned int blockDimY, unsigned int blockDimZ,
                              unsigned int sharedMemBytes, CUstream stream, void **kernelParams,
                              void **extra, enum sim_default_stream mode)
{
    SIM_ENTER();
    struct launch l = {f, {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ},
                       sharedMemBytes, kernelParams, extra, false};
    return launch(&l, stream, mode);
}

SIMGPU_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream stream,
                                   void **kernelParams, void **extra)
{
    return launch_kernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                         sharedMemBytes, stream, kernelParams, extra, SIM_LEGACY);
}

SIMGPU_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream stream, void **kernelParams, void **extra)
{
    return launch_kernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                         sharedMemBytes, stream, kernelParams, extra, SIM_PER_THREAD);
}

static CUresult launch_kernel_ex(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                 void **extra, enum sim_default_stream mode)
{
    SIM_ENTER();
    if (config == NULL || (config->numAttrs > 0 && config->attrs == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    struct launch l = {f,
                       {config->gridDimX, config->gridDimY, config->gridDimZ},
                       {config->blockDimX, config->blockDimY, config->blockDimZ},
                       config->sharedMemBytes,
                       kernelParams,
                       extra,
                       false};
    return launch(&l, config->hStream, mode);
}

SIMGPU_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                     void **kernelParams, void **extra)
{
    return launch_kernel_ex(config, f, kernelParams, extra, SIM_LEGACY);
}

SIMGPU_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                          void **kernelParams, void **extra)
{
    return launch_kernel_ex(config, f, kernelParams, extra, SIM_PER_THREAD);
}

static CUresult launch_cooperative(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream stream,
                                   void **kernelParams, enum sim_default_stream mode)
{
    SIM_ENTER();
    struct launch l = {f, {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ},
                       sharedMemBytes, kernelParams, NULL, true};
    return launch(&l, stream, mode);
}

SIMGPU_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                              unsigned int gridDimY, unsigned int gridDimZ,
                                              unsigned int blockDimX, unsigned int blockDimY,
                                              unsigned int blockDimZ, unsigned int sharedMemBytes,
                                              CUstream stream, void **kernelParams)
{
    return launch_cooperative(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                              sharedMemBytes, stream, kernelParams, SIM_LEGACY);
}

SIMGPU_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                   unsigned int gridDimY, unsigned int gridDimZ,
                                                   unsigned int blockDimX, unsigned int blockDimY,
                                                   unsigned int blockDimZ,
                                                   unsigned int sharedMemBytes, CUstream stream,
                                                   void **kernelParams)
{
    return launch_cooperative(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                              sharedMemBytes, stream, kernelParams, SIM_PER_THREAD);
}

/* ---- Graphs: kernel and memory nodes, run in insertion order (which respects dependencies).
 * A stream capture (cuda_stream.c) appends its launches to a graph the same way. ---- */

CUresult sim_graph_new(CUgraph *out)
{
    CUgraph g = calloc(1, sizeof *g);
    if (g == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->tag = TAG_GRAPH;
    *out = g;
    return CUDA_SUCCESS;
}

CUresult sim_graph_append_node(CUgraph graph, const struct sim_graph_node *node, CUgraphNode *out)
{
    struct sim_graph_node *n = malloc(sizeof *n);
    if (n == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *n = *node;
    n->tag = TAG_GRAPH_NODE;
    n->next = NULL;
    if (graph->last != NULL)
        graph->last->next = n;
    else
        graph->first = n;
    graph->last = n;
    if (out != NULL)
        *out = (CUgraphNode)n;
    return CUDA_SUCCESS;
}

CUresult sim_graph_append(CUgraph graph, uint64_t duration_ns)
{
    struct sim_graph_node n = {.kind = SIM_NODE_KERNEL, .duration_ns = duration_ns};
    return sim_graph_append_node(graph, &n, NULL);
}

SIMGPU_API CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    SIM_ENTER();
    if (graph == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_graph_new(graph);
}

SIMGPU_API CUresult cuGraphDestroy(CUgraph graph)
{
    SIM_ENTER();
    if (graph == NULL || graph->tag != TAG_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    graph->tag = 0;
    for (struct sim_graph_node *n = graph->first, *next = NULL; n != NULL; n = next) {
        next = n->next;
        n->tag = 0;
        sim_graph_mem_graph_destroyed(n);
        free(n);
    }
    free(graph);
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                size_t numDeps, const struct launch *l)
{
    if (node == NULL || graph == NULL || graph->tag != TAG_GRAPH || (numDeps > 0 && deps == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph_node n = {.kind = SIM_NODE_KERNEL};
    CUresult rc = prepare(l, &n.duration_ns);
    return rc != CUDA_SUCCESS ? rc : sim_graph_append_node(graph, &n, node);
}

SIMGPU_API CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                         size_t numDeps, const CUDA_KERNEL_NODE_PARAMS *p)
{
    SIM_ENTER();
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct launch l = {p->func, {p->gridDimX, p->gridDimY, p->gridDimZ},
                       {p->blockDimX, p->blockDimY, p->blockDimZ}, p->sharedMemBytes,
                       p->kernelParams, p->extra, false};
    return add_kernel_node(node, graph, deps, numDeps, &l);
}

SIMGPU_API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph,
                                            const CUgraphNode *deps, size_t numDeps,
                                            const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    SIM_ENTER();
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct launch l = {p->func, {p->gridDimX, p->gridDimY, p->gridDimZ},
                       {p->blockDimX, p->blockDimY, p->blockDimZ}, p->sharedMemBytes,
                       p->kernelParams, p->extra, false};
    return add_kernel_node(node, graph, deps, numDeps, &l);
}

/* cuGraphAddNode (CUDA 12.2) and its edge-data versions: the kernel and memory nodes the
 * simulator models; other node types are CUDA_ERROR_NOT_SUPPORTED. Edge data must be the
 * default (NULL), the only kind the simulator's dependency-free graphs can honour. */
static CUresult add_node(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                         const void *edgeData, size_t numDeps, CUgraphNodeParams *p)
{
    if (node == NULL || graph == NULL || graph->tag != TAG_GRAPH || p == NULL ||
        (numDeps > 0 && deps == NULL) || edgeData != NULL)
        return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        const CUDA_KERNEL_NODE_PARAMS_v2 *k = &p->kernel;
        struct launch l = {k->func, {k->gridDimX, k->gridDimY, k->gridDimZ},
                           {k->blockDimX, k->blockDimY, k->blockDimZ}, k->sharedMemBytes,
                           k->kernelParams, k->extra, false};
        return add_kernel_node(node, graph, deps, numDeps, &l);
    }
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
        return sim_graph_mem_add_alloc(graph, &p->alloc, node);
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
        return sim_graph_mem_add_free(graph, p->free.dptr, node);
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

SIMGPU_API CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                   size_t numDeps, void *params)
{
    SIM_ENTER();
    return add_node(node, graph, deps, NULL, numDeps, params);
}

SIMGPU_API CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                      const void *edgeData, size_t numDeps, void *params)
{
    SIM_ENTER();
    return add_node(node, graph, deps, edgeData, numDeps, params);
}

SIMGPU_API CUresult cuGraphAddNode_v3(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                      const void *edgeData, size_t numDeps, void *params)
{
    SIM_ENTER();
    return add_node(node, graph, deps, edgeData, numDeps, params);
}

SIMGPU_API CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count)
{
    SIM_ENTER();
    if (graph == NULL || graph->tag != TAG_GRAPH || count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    size_t n = 0;
    for (struct sim_graph_node *g = graph->first; g != NULL; g = g->next, n++) {
        if (nodes != NULL && n < *count)
            nodes[n] = (CUgraphNode)g;
    }
    if (nodes == NULL || n < *count)
        *count = n; /* with an array, CUDA reports how many it filled when fewer than room */
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type)
{
    SIM_ENTER();
    const struct sim_graph_node *n = (const struct sim_graph_node *)node;
    if (n == NULL || n->tag != TAG_GRAPH_NODE || type == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    static const CUgraphNodeType types[] = {[SIM_NODE_KERNEL] = CU_GRAPH_NODE_TYPE_KERNEL,
                                            [SIM_NODE_MEM_ALLOC] = CU_GRAPH_NODE_TYPE_MEM_ALLOC,
                                            [SIM_NODE_MEM_FREE] = CU_GRAPH_NODE_TYPE_MEM_FREE};
    *type = types[n->kind];
    return CUDA_SUCCESS;
}

static CUresult instantiate(CUgraphExec *exec, CUgraph graph)
{
    if (exec == NULL || graph == NULL || graph->tag != TAG_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    size_t count = 0;
    for (const struct sim_graph_node *n = graph->first; n != NULL; n = n->next)
        count++;
    CUgraphExec e = calloc(1, sizeof *e + count * sizeof e->nodes[0]);
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->tag = TAG_GRAPH_EXEC;
    e->count = count;
    size_t i = 0;
    for (const struct sim_graph_node *n = graph->first; n != NULL; n = n->next)
        e->nodes[i++] = *n;
    CUresult rc = sim_graph_mem_instantiate(e->nodes, count);
    if (rc != CUDA_SUCCESS) {
        free(e);
        return rc;
    }
    *exec = e;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                                unsigned long long flags)
{
    SIM_ENTER();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return instantiate(exec, graph);
}

SIMGPU_API CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *errorNode,
                                          char *logBuffer, size_t bufferSize)
{
    SIM_ENTER();
    if (errorNode != NULL)
        *errorNode = NULL;
    if (logBuffer != NULL && bufferSize > 0)
        logBuffer[0] = '\0';
    return instantiate(exec, graph);
}

static CUresult graph_launch(CUgraphExec exec, CUstream stream, enum sim_default_stream mode)
{
    SIM_ENTER();
    if (exec == NULL || exec->tag != TAG_GRAPH_EXEC)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUgraph capture = sim_stream_capture(s);
    bool has_memory = false;
    for (size_t i = 0; i < exec->count; i++)
        has_memory |= exec->nodes[i].kind != SIM_NODE_KERNEL;
    if (capture != NULL && has_memory) /* a child graph with memory nodes: not modelled */
        return CUDA_ERROR_NOT_SUPPORTED;
    if (has_memory)
        rc = sim_graph_mem_prepare_launch(exec->nodes, exec->count);
    for (size_t i = 0; i < exec->count && rc == CUDA_SUCCESS; i++) {
        if (capture != NULL)
            rc = sim_graph_append(capture, exec->nodes[i].duration_ns); /* recorded, not run */
        else if (exec->nodes[i].kind == SIM_NODE_KERNEL)
            sim_stream_submit(s, exec->nodes[i].duration_ns);
        else
            sim_graph_mem_run(&exec->nodes[i], s->ctx);
    }
    return rc;
}

SIMGPU_API CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    return graph_launch(exec, stream, SIM_LEGACY);
}

SIMGPU_API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    return graph_launch(exec, stream, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    SIM_ENTER();
    if (exec == NULL || exec->tag != TAG_GRAPH_EXEC)
        return CUDA_ERROR_INVALID_VALUE;
    exec->tag = 0;
    sim_graph_mem_exec_destroyed(exec->nodes, exec->count);
    free(exec);
    return CUDA_SUCCESS;
}
