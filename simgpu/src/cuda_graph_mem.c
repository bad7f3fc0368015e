/*
 * Graph memory nodes. An allocation node's virtual address is fixed when the node is added; its
 * physical memory is taken from the device when the graph launches and is live until a free node,
 * cuMemFree or cuMemFreeAsync frees it. Freed memory goes to the device's graph memory cache,
 * which keeps it reserved (NVML and cuMemGetInfo still see it) for the next launch until
 * cuDeviceGraphMemTrim gives back what no live allocation uses, as the driver documents. An
 * executable graph cannot be launched again while one of its allocations is live, and a graph
 * with memory nodes has at most one executable at a time.
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "cuda_graph.h"
#include "cuda_memory.h"
#include "devmem.h"

/* One allocation node's memory: created with the node, gone once neither its graph, an
 * executable nor a free node (of any graph or executable) refers to it and it holds no physical
 * memory. */
struct sim_graph_block {
    struct sim_alloc_rec rec; /* the allocation's record, linked into the registry while live */
    CUdevice device;
    bool in_graph, in_exec, live, reserved;
    int free_refs; /* free nodes naming it, in graphs and executables */
    uint32_t handle; /* the physical reservation, while `reserved` */
    struct sim_graph_block *next;
};

/* The device's graph memory, as cuDeviceGetGraphMemAttribute reports it. */
struct sim_graph_mem {
    uint64_t used, used_high, reserved, reserved_high;
};

static struct sim_graph_block *blocks; /* every block of the process; guarded by mu */
static struct sim_graph_mem devices[SIM_MAX_GPUS];

static uint64_t physical_bytes(const struct sim_graph_block *b)
{
    return (b->rec.size + SIM_ALLOC_ROUNDING - 1) / SIM_ALLOC_ROUNDING * SIM_ALLOC_ROUNDING;
}

/* Free a block nothing refers to any more. Needs mu. */
static void collect(struct sim_graph_block *b)
{
    if (b->in_graph || b->in_exec || b->live || b->reserved || b->free_refs > 0)
        return;
    for (struct sim_graph_block **link = &blocks; *link != NULL; link = &(*link)->next) {
        if (*link == b) {
            *link = b->next;
            break;
        }
    }
    munmap((void *)b->rec.base, b->rec.size);
    free(b);
}

/* Give a block's physical memory back to the device. Needs mu. */
static void unreserve(struct sim_graph_block *b)
{
    sim_mem_release(&sim_cuda.rt.node, b->handle);
    b->reserved = false;
    devices[b->device].reserved -= physical_bytes(b);
}

static CUresult new_block(CUdevice dev, size_t bytes, struct sim_graph_block **out)
{
    struct sim_graph_block *b = calloc(1, sizeof *b);
    if (b == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *map = sim_backing_map(bytes);
    if (map == NULL) {
        free(b);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b->rec.base = (uintptr_t)map;
    b->rec.size = bytes;
    b->rec.kind = ALLOC_GRAPH;
    b->rec.graph_block = b;
    b->device = dev;
    b->in_graph = true;
    pthread_mutex_lock(&sim_cuda.mu);
    b->next = blocks;
    blocks = b;
    pthread_mutex_unlock(&sim_cuda.mu);
    *out = b;
    return CUDA_SUCCESS;
}

/* The pool properties of an allocation node: pinned device memory on a visible device. */
static CUresult alloc_params_device(const CUDA_MEM_ALLOC_NODE_PARAMS *p, CUdevice *dev)
{
    if (p->bytesize == 0 || p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        (p->accessDescCount > 0 && p->accessDescs == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_check_device(p->poolProps.location.id);
    if (rc != CUDA_SUCCESS)
        return rc == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : rc;
    *dev = p->poolProps.location.id;
    return CUDA_SUCCESS;
}

static CUresult add_alloc(CUgraph graph, CUdevice dev, size_t bytes, CUgraphNode *node,
                          CUdeviceptr *dptr)
{
    struct sim_graph_node n = {.kind = SIM_NODE_MEM_ALLOC};
    CUresult rc = new_block(dev, bytes, &n.block);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = sim_graph_append_node(graph, &n, node);
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_lock(&sim_cuda.mu);
        n.block->in_graph = false;
        collect(n.block);
        pthread_mutex_unlock(&sim_cuda.mu);
        return rc;
    }
    *dptr = n.block->rec.base;
    return CUDA_SUCCESS;
}

CUresult sim_graph_mem_add_alloc(CUgraph graph, CUDA_MEM_ALLOC_NODE_PARAMS *params,
                                 CUgraphNode *out)
{
    CUdevice dev = 0;
    CUresult rc = alloc_params_device(params, &dev);
    return rc != CUDA_SUCCESS ? rc : add_alloc(graph, dev, params->bytesize, out, &params->dptr);
}

/* The block whose allocation starts at `dptr`, or NULL. Needs mu. */
static struct sim_graph_block *block_at(CUdeviceptr dptr)
{
    for (struct sim_graph_block *b = blocks; b != NULL; b = b->next) {
        if (b->rec.base == dptr)
            return b;
    }
    return NULL;
}

/* A graph's or an executable's node goes: it no longer keeps its block. */
static void let_go(const struct sim_graph_node *node, bool of_exec)
{
    struct sim_graph_block *b = node->block;
    if (node->kind == SIM_NODE_MEM_FREE)
        b->free_refs--;
    else if (node->kind == SIM_NODE_MEM_ALLOC && of_exec)
        b->in_exec = false;
    else if (node->kind == SIM_NODE_MEM_ALLOC)
        b->in_graph = false;
    else
        return;
    collect(b);
}

CUresult sim_graph_mem_add_free(CUgraph graph, CUdeviceptr dptr, CUgraphNode *out)
{
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_graph_node n = {.kind = SIM_NODE_MEM_FREE, .block = block_at(dptr)};
    /* Only a graph allocation can be freed by a free node, and only once in a graph. */
    CUresult rc = n.block == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    for (const struct sim_graph_node *g = graph->first; g != NULL && rc == CUDA_SUCCESS;
         g = g->next) {
        if (g->kind == SIM_NODE_MEM_FREE && g->block == n.block)
            rc = CUDA_ERROR_INVALID_VALUE;
    }
    if (rc == CUDA_SUCCESS)
        rc = sim_graph_append_node(graph, &n, out);
    if (rc == CUDA_SUCCESS)
        n.block->free_refs++; /* the node names it: kept while the node exists */
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

void sim_graph_mem_graph_destroyed(const struct sim_graph_node *node)
{
    pthread_mutex_lock(&sim_cuda.mu);
    let_go(node, false);
    pthread_mutex_unlock(&sim_cuda.mu);
}

CUresult sim_graph_mem_instantiate(const struct sim_graph_node *nodes, size_t count)
{
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&sim_cuda.mu);
    for (size_t i = 0; i < count; i++) {
        if (nodes[i].kind == SIM_NODE_MEM_ALLOC && nodes[i].block->in_exec)
            rc = CUDA_ERROR_INVALID_VALUE; /* one executable at a time */
    }
    for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++) {
        if (nodes[i].kind == SIM_NODE_MEM_ALLOC)
            nodes[i].block->in_exec = true;
        else if (nodes[i].kind == SIM_NODE_MEM_FREE)
            nodes[i].block->free_refs++;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

void sim_graph_mem_exec_destroyed(const struct sim_graph_node *nodes, size_t count)
{
    pthread_mutex_lock(&sim_cuda.mu);
    for (size_t i = 0; i < count; i++)
        let_go(&nodes[i], true);
    pthread_mutex_unlock(&sim_cuda.mu);
}

CUresult sim_graph_mem_prepare_launch(const struct sim_graph_node *nodes, size_t count)
{
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&sim_cuda.mu);
    for (size_t i = 0; i < count; i++) {
        if (nodes[i].kind == SIM_NODE_MEM_ALLOC && nodes[i].block->live)
            rc = CUDA_ERROR_INVALID_VALUE; /* freed neither in the graph nor since */
    }
    size_t taken = 0;
    for (; taken < count && rc == CUDA_SUCCESS; taken++) {
        struct sim_graph_block *b = nodes[taken].block;
        if (nodes[taken].kind != SIM_NODE_MEM_ALLOC || b->reserved)
            continue;
        rc = sim_devmem_reserve(b->device, physical_bytes(b), &b->handle);
        if (rc != CUDA_SUCCESS)
            break;
        b->reserved = true;
        struct sim_graph_mem *m = &devices[b->device];
        m->reserved += physical_bytes(b);
        if (m->reserved > m->reserved_high)
            m->reserved_high = m->reserved;
        /* Marked live now, so that a failure below gives back only what this launch took. */
        b->live = true;
    }
    for (size_t i = 0; i < taken; i++) {
        struct sim_graph_block *b = nodes[i].block;
        if (nodes[i].kind != SIM_NODE_MEM_ALLOC || !b->live)
            continue;
        b->live = false;
        if (rc != CUDA_SUCCESS)
            unreserve(b);
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

void sim_graph_mem_run(const struct sim_graph_node *node, CUcontext ctx)
{
    struct sim_graph_block *b = node->block;
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_graph_mem *m = &devices[b->device];
    if (node->kind == SIM_NODE_MEM_ALLOC && !b->live) {
        b->live = true;
        b->rec.ctx = ctx;
        sim_link_alloc(&b->rec);
        m->used += physical_bytes(b);
        if (m->used > m->used_high)
            m->used_high = m->used;
    } else if (node->kind == SIM_NODE_MEM_FREE && b->live) {
        sim_graph_mem_free(&b->rec);
    }
    pthread_mutex_unlock(&sim_cuda.mu);
}

void sim_graph_mem_free(struct sim_alloc_rec *rec)
{
    struct sim_graph_block *b = rec->graph_block;
    sim_unlink_alloc(rec);
    b->live = false;
    devices[b->device].used -= physical_bytes(b);
    collect(b);
}

/* ---- Stream capture: cuMemAllocAsync and cuMemFreeAsync become memory nodes. ---- */

CUresult sim_graph_capture_alloc(CUgraph graph, CUdevice dev, size_t bytes, CUdeviceptr *dptr)
{
    return add_alloc(graph, dev, bytes, NULL, dptr);
}

CUresult sim_graph_capture_free(CUgraph graph, CUdeviceptr dptr)
{
    return sim_graph_mem_add_free(graph, dptr, NULL);
}

/* ---- Entry points ---- */

SIMGPU_API CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph,
                                           const CUgraphNode *deps, size_t numDeps,
                                           CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    SIM_ENTER();
    if (node == NULL || graph == NULL || graph->tag != TAG_GRAPH || params == NULL ||
        (numDeps > 0 && deps == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_graph_mem_add_alloc(graph, params, node);
}

SIMGPU_API CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph,
                                          const CUgraphNode *deps, size_t numDeps,
                                          CUdeviceptr dptr)
{
    SIM_ENTER();
    if (node == NULL || graph == NULL || graph->tag != TAG_GRAPH || (numDeps > 0 && deps == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_graph_mem_add_free(graph, dptr, node);
}

static const struct sim_graph_node *memory_node(CUgraphNode node, enum sim_node_kind kind)
{
    const struct sim_graph_node *n = (const struct sim_graph_node *)node;
    return n != NULL && n->tag == TAG_GRAPH_NODE && n->kind == kind ? n : NULL;
}

SIMGPU_API CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node,
                                                 CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    SIM_ENTER();
    const struct sim_graph_node *n = memory_node(node, SIM_NODE_MEM_ALLOC);
    if (n == NULL || params == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *params = (CUDA_MEM_ALLOC_NODE_PARAMS){
        .poolProps = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                      .location = {CU_MEM_LOCATION_TYPE_DEVICE, n->block->device}},
        .bytesize = n->block->rec.size,
        .dptr = n->block->rec.base,
    };
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr *dptr)
{
    SIM_ENTER();
    const struct sim_graph_node *n = memory_node(node, SIM_NODE_MEM_FREE);
    if (n == NULL || dptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = n->block->rec.base;
    return CUDA_SUCCESS;
}

/* The checks the attribute calls share: a usable device, then a value to read or write. */
static CUresult attribute_args(CUdevice device, const void *value)
{
    CUresult rc = sim_check_device(device);
    return rc != CUDA_SUCCESS ? rc : value == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                 void *value)
{
    SIM_ENTER();
    CUresult rc = attribute_args(device, value);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    const struct sim_graph_mem *m = &devices[device];
    rc = CUDA_SUCCESS;
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = m->used;
        break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = m->used_high;
        break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = m->reserved;
        break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = m->reserved_high;
        break;
    default:
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                 void *value)
{
    SIM_ENTER();
    CUresult rc = attribute_args(device, value);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* Only the high-water marks can be set, and only reset to 0 (to the current value). */
    if (*(cuuint64_t *)value != 0 ||
        (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_graph_mem *m = &devices[device];
    if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
        m->used_high = m->used;
    else
        m->reserved_high = m->reserved;
    pthread_mutex_unlock(&sim_cuda.mu);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    SIM_ENTER();
    CUresult rc = sim_check_device(device);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    for (struct sim_graph_block *b = blocks, *next = NULL; b != NULL; b = next) {
        next = b->next;
        if (b->device == device && b->reserved && !b->live) {
            unreserve(b);
            collect(b);
        }
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return CUDA_SUCCESS;
}
