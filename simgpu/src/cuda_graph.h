/*
 * Graphs, shared by the launch code that runs them (cuda_launch.c) and the memory nodes
 * (cuda_graph_mem.c). Nodes run in insertion order, which respects any dependencies given.
 */
#ifndef SIMGPU_CUDA_GRAPH_H
#define SIMGPU_CUDA_GRAPH_H

#include "cuda_internal.h"

enum sim_node_kind { SIM_NODE_KERNEL, SIM_NODE_MEM_ALLOC, SIM_NODE_MEM_FREE };

struct sim_graph_block; /* cuda_graph_mem.c: one allocation node's memory */

struct sim_graph_node {
    uint32_t tag; /* TAG_GRAPH_NODE while its graph lives */
    enum sim_node_kind kind;
    uint64_t duration_ns;          /* kernels: captured when the node is added, as CUDA does */
    struct sim_graph_block *block; /* memory nodes: what they allocate or free */
    struct sim_graph_node *next;
};

struct CUgraph_st {
    uint32_t tag;
    struct sim_graph_node *first, *last;
};

struct CUgraphExec_st {
    uint32_t tag;
    size_t count;
    struct sim_graph_node nodes[];
};

/* Append a node (its kind, duration and block as given) to `graph`; the node is the handle. */
CUresult sim_graph_append_node(CUgraph graph, const struct sim_graph_node *node,
                               CUgraphNode *out);

/* Memory nodes (cuda_graph_mem.c). The graph owns its allocation nodes' virtual addresses; an
 * executable graph holds them while it exists (at most one per graph, as CUDA allows). */
CUresult sim_graph_mem_add_alloc(CUgraph graph, CUDA_MEM_ALLOC_NODE_PARAMS *params,
                                 CUgraphNode *out);
CUresult sim_graph_mem_add_free(CUgraph graph, CUdeviceptr dptr, CUgraphNode *out);
void sim_graph_mem_graph_destroyed(const struct sim_graph_node *node);
CUresult sim_graph_mem_instantiate(const struct sim_graph_node *nodes, size_t count);
void sim_graph_mem_exec_destroyed(const struct sim_graph_node *nodes, size_t count);

/* Launch: refuse while one of the executable's allocations is still live (CUDA refuses a
 * relaunch until they are freed), and take the physical memory of all its allocations up front,
 * all or nothing; then run each memory node in order on `ctx`. */
CUresult sim_graph_mem_prepare_launch(const struct sim_graph_node *nodes, size_t count);
void sim_graph_mem_run(const struct sim_graph_node *node, CUcontext ctx);

#endif
