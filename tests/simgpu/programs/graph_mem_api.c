/*
 * Graph memory nodes: allocation and free nodes added directly, through cuGraphAddNode and by
 * capturing cuMemAllocAsync/cuMemFreeAsync; the device's graph memory attributes, its cache and
 * cuDeviceGraphMemTrim; what cuMemGetInfo sees at each step. Expects device 0 with 1 GiB and
 * nothing else using it.
 */
#include "simgpu_test.h"

#define MiB (1024ull * 1024)

static void *lib;

static uint64_t graph_attr(CUgraphMem_attribute attr)
{
    LOAD(lib, cuDeviceGetGraphMemAttribute);
    cuuint64_t value = ~0ull;
    EXPECT_EQ(p_cuDeviceGetGraphMemAttribute(0, attr, &value), CUDA_SUCCESS);
    return value;
}

static uint64_t free_bytes(void)
{
    LOAD(lib, cuMemGetInfo_v2);
    size_t free_b = 0, total = 0;
    EXPECT_EQ(p_cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    return free_b;
}

static CUDA_MEM_ALLOC_NODE_PARAMS alloc_params(size_t bytes)
{
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    return p;
}

/* An allocation node and a free node: memory is taken at launch, cached after, trimmed. */
static void alloc_and_free_nodes(CUstream stream, uint64_t baseline)
{
    LOAD(lib, cuGraphCreate);
    LOAD(lib, cuGraphAddMemAllocNode);
    LOAD(lib, cuGraphAddMemFreeNode);
    LOAD(lib, cuGraphMemAllocNodeGetParams);
    LOAD(lib, cuGraphMemFreeNodeGetParams);
    LOAD(lib, cuGraphGetNodes);
    LOAD(lib, cuGraphNodeGetType);
    LOAD(lib, cuGraphInstantiateWithFlags);
    LOAD(lib, cuGraphLaunch);
    LOAD(lib, cuGraphExecDestroy);
    LOAD(lib, cuGraphDestroy);
    LOAD(lib, cuStreamSynchronize);
    LOAD(lib, cuDeviceGraphMemTrim);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);

    CUgraph g = NULL;
    EXPECT_EQ(p_cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUDA_MEM_ALLOC_NODE_PARAMS p = alloc_params(64 * MiB);
    CUgraphNode a = NULL, f = NULL;
    EXPECT_EQ(p_cuGraphAddMemAllocNode(&a, g, NULL, 0, &p), CUDA_SUCCESS);
    EXPECT_TRUE(p.dptr != 0);
    EXPECT_EQ(free_bytes(), baseline); /* an address only, until launch */
    CUDA_MEM_ALLOC_NODE_PARAMS got;
    EXPECT_EQ(p_cuGraphMemAllocNodeGetParams(a, &got), CUDA_SUCCESS);
    EXPECT_EQ(got.dptr, p.dptr);
    EXPECT_EQ(got.bytesize, 64 * MiB);
    EXPECT_EQ(got.poolProps.location.id, 0);
    EXPECT_EQ(p_cuGraphAddMemFreeNode(&f, g, &a, 1, p.dptr), CUDA_SUCCESS);
    CUdeviceptr freed = 0;
    EXPECT_EQ(p_cuGraphMemFreeNodeGetParams(f, &freed), CUDA_SUCCESS);
    EXPECT_EQ(freed, p.dptr);
    /* Each node answers only its own kind's query. */
    EXPECT_EQ(p_cuGraphMemFreeNodeGetParams(a, &freed), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuGraphMemAllocNodeGetParams(f, &got), CUDA_ERROR_INVALID_VALUE);
    /* An allocation is freed once in a graph, and only graph allocations by free nodes. */
    CUgraphNode again = NULL;
    EXPECT_EQ(p_cuGraphAddMemFreeNode(&again, g, &f, 1, p.dptr), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr plain = 0;
    EXPECT_EQ(p_cuMemAlloc_v2(&plain, MiB), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphAddMemFreeNode(&again, g, NULL, 0, plain), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemFree_v2(plain), CUDA_SUCCESS);

    CUgraphNode nodes[4] = {NULL};
    size_t count = 1; /* room for fewer than there are: filled, and the count left as it was */
    EXPECT_EQ(p_cuGraphGetNodes(g, nodes, &count), CUDA_SUCCESS);
    EXPECT_EQ(count, 1);
    EXPECT_TRUE(nodes[0] == a);
    EXPECT_EQ(p_cuGraphGetNodes(g, NULL, &count), CUDA_SUCCESS);
    EXPECT_EQ(count, 2);
    count = 4;
    EXPECT_EQ(p_cuGraphGetNodes(g, nodes, &count), CUDA_SUCCESS);
    EXPECT_EQ(count, 2);
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL;
    EXPECT_EQ(p_cuGraphNodeGetType(nodes[0], &type), CUDA_SUCCESS);
    EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    EXPECT_EQ(p_cuGraphNodeGetType(nodes[1], &type), CUDA_SUCCESS);
    EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_MEM_FREE);

    CUgraphExec e = NULL, second = NULL;
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    /* A graph with memory nodes has one executable at a time. */
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&second, g, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuGraphLaunch(e, stream), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 0);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH), 64 * MiB);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 64 * MiB);
    EXPECT_EQ(free_bytes(), baseline - 64 * MiB); /* the cache keeps it reserved */
    /* Freed within the graph, so it can run again, from the cache. */
    EXPECT_EQ(p_cuGraphLaunch(e, stream), CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH), 64 * MiB);
    EXPECT_EQ(p_cuGraphExecDestroy(e), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&second, g, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphExecDestroy(second), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(g), CUDA_SUCCESS);
    EXPECT_EQ(free_bytes(), baseline - 64 * MiB); /* destroying graphs does not trim */
    EXPECT_EQ(p_cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 0);
    EXPECT_EQ(free_bytes(), baseline);
}

/* An allocation nothing in the graph frees: live after launch, usable as device memory, and the
 * executable cannot run again until cuMemFree or cuMemFreeAsync frees it. */
static void allocation_left_live(CUstream stream, uint64_t baseline)
{
    LOAD(lib, cuGraphCreate);
    LOAD(lib, cuGraphAddMemAllocNode);
    LOAD(lib, cuGraphInstantiateWithFlags);
    LOAD(lib, cuGraphLaunch);
    LOAD(lib, cuGraphExecDestroy);
    LOAD(lib, cuGraphDestroy);
    LOAD(lib, cuMemcpyHtoD_v2);
    LOAD(lib, cuMemcpyDtoH_v2);
    LOAD(lib, cuMemFree_v2);
    LOAD(lib, cuMemFreeAsync);
    LOAD(lib, cuDeviceGraphMemTrim);

    CUgraph g = NULL;
    CUgraphNode a = NULL;
    CUgraphExec e = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS p = alloc_params(32 * MiB);
    EXPECT_EQ(p_cuGraphCreate(&g, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphAddMemAllocNode(&a, g, NULL, 0, &p), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphLaunch(e, stream), CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 32 * MiB);
    EXPECT_EQ(free_bytes(), baseline - 32 * MiB);
    unsigned int in = 0x5eed, out = 0;
    EXPECT_EQ(p_cuMemcpyHtoD_v2(p.dptr, &in, sizeof in), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemcpyDtoH_v2(&out, p.dptr, sizeof out), CUDA_SUCCESS);
    EXPECT_EQ(out, in);
    EXPECT_EQ(p_cuGraphLaunch(e, stream), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemFree_v2(p.dptr), CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 0);
    EXPECT_EQ(p_cuMemFree_v2(p.dptr), CUDA_ERROR_INVALID_VALUE); /* freed already */
    EXPECT_EQ(p_cuGraphLaunch(e, stream), CUDA_SUCCESS);
    /* A live allocation outlives its graph and executable; trimming keeps what is live. */
    EXPECT_EQ(p_cuGraphExecDestroy(e), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(g), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
    EXPECT_EQ(p_cuMemcpyDtoH_v2(&out, p.dptr, sizeof out), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFreeAsync(p.dptr, stream), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    EXPECT_EQ(free_bytes(), baseline);
}

/* A free node in another graph than the allocation's frees it, and keeps naming it after the
 * allocating graph and executable are gone. */
static void freed_by_another_graph(CUstream stream, uint64_t baseline)
{
    LOAD(lib, cuGraphCreate);
    LOAD(lib, cuGraphAddMemAllocNode);
    LOAD(lib, cuGraphAddMemFreeNode);
    LOAD(lib, cuGraphInstantiateWithFlags);
    LOAD(lib, cuGraphLaunch);
    LOAD(lib, cuGraphExecDestroy);
    LOAD(lib, cuGraphDestroy);
    LOAD(lib, cuDeviceGraphMemTrim);

    CUgraph alloc_graph = NULL, free_graph = NULL;
    CUgraphNode a = NULL, f = NULL;
    CUgraphExec alloc_exec = NULL, free_exec = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS p = alloc_params(8 * MiB);
    EXPECT_EQ(p_cuGraphCreate(&alloc_graph, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphCreate(&free_graph, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphAddMemAllocNode(&a, alloc_graph, NULL, 0, &p), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphAddMemFreeNode(&f, free_graph, NULL, 0, p.dptr), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&alloc_exec, alloc_graph, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&free_exec, free_graph, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphLaunch(alloc_exec, stream), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphExecDestroy(alloc_exec), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(alloc_graph), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(free_graph), CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 8 * MiB);
    EXPECT_EQ(p_cuGraphLaunch(free_exec, stream), CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 0);
    EXPECT_EQ(p_cuGraphLaunch(free_exec, stream), CUDA_SUCCESS); /* nothing live to free */
    EXPECT_EQ(p_cuGraphExecDestroy(free_exec), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    EXPECT_EQ(free_bytes(), baseline);
}

/* More than the device has: the node is only an address, the launch is out of memory. */
static void launch_beyond_the_device(CUstream stream, uint64_t baseline)
{
    LOAD(lib, cuGraphCreate);
    LOAD(lib, cuGraphAddMemAllocNode);
    LOAD(lib, cuGraphInstantiateWithFlags);
    LOAD(lib, cuGraphLaunch);
    LOAD(lib, cuGraphExecDestroy);
    LOAD(lib, cuGraphDestroy);

    CUgraph g = NULL;
    CUgraphNode a = NULL, b = NULL;
    CUgraphExec e = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS small = alloc_params(MiB), big = alloc_params(2048 * MiB);
    EXPECT_EQ(p_cuGraphCreate(&g, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphAddMemAllocNode(&a, g, NULL, 0, &small), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphAddMemAllocNode(&b, g, &a, 1, &big), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphLaunch(e, stream), CUDA_ERROR_OUT_OF_MEMORY);
    /* All or nothing: the small allocation's memory was given back too. */
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 0);
    EXPECT_EQ(free_bytes(), baseline);
    EXPECT_EQ(p_cuGraphExecDestroy(e), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(g), CUDA_SUCCESS);
}

/* cuGraphAddNode's allocation and free nodes are the same nodes; other types it does not model
 * are not supported, and node parameters are checked. */
static void generic_node_additions(void)
{
    LOAD(lib, cuGraphCreate);
    LOAD(lib, cuGraphAddNode);
    LOAD(lib, cuGraphAddNode_v2);
    LOAD(lib, cuGraphAddMemAllocNode);
    LOAD(lib, cuGraphMemFreeNodeGetParams);
    LOAD(lib, cuGraphDestroy);

    CUgraph g = NULL;
    CUgraphNode a = NULL, f = NULL, x = NULL;
    EXPECT_EQ(p_cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.alloc = alloc_params(4 * MiB);
    EXPECT_EQ(p_cuGraphAddNode(&a, g, NULL, 0, &np), CUDA_SUCCESS);
    EXPECT_TRUE(np.alloc.dptr != 0);
    CUdeviceptr dptr = np.alloc.dptr;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    np.free.dptr = dptr;
    EXPECT_EQ(p_cuGraphAddNode_v2(&f, g, &a, NULL, 1, &np), CUDA_SUCCESS);
    CUdeviceptr freed = 0;
    EXPECT_EQ(p_cuGraphMemFreeNodeGetParams(f, &freed), CUDA_SUCCESS);
    EXPECT_EQ(freed, dptr);
    np.type = (CUgraphNodeType)5; /* an empty node: not modelled */
    EXPECT_EQ(p_cuGraphAddNode(&x, g, NULL, 0, &np), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(p_cuGraphAddNode(&x, g, NULL, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    int edge = 0; /* edge data other than the default is not modelled */
    EXPECT_EQ(p_cuGraphAddNode_v2(&x, g, &a, &edge, 1, &np), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuGraphAddNode(&x, g, NULL, 1, &np), CUDA_ERROR_INVALID_VALUE);
    CUDA_MEM_ALLOC_NODE_PARAMS bad = alloc_params(0);
    EXPECT_EQ(p_cuGraphAddMemAllocNode(&x, g, NULL, 0, &bad), CUDA_ERROR_INVALID_VALUE);
    bad = alloc_params(MiB);
    bad.poolProps.location.id = 7;
    EXPECT_EQ(p_cuGraphAddMemAllocNode(&x, g, NULL, 0, &bad), CUDA_ERROR_INVALID_VALUE);
    bad = alloc_params(MiB);
    bad.poolProps.location.type = CU_MEM_LOCATION_TYPE_HOST;
    EXPECT_EQ(p_cuGraphAddMemAllocNode(&x, g, NULL, 0, &bad), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuGraphAddMemAllocNode(&x, g, NULL, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuGraphDestroy(g), CUDA_SUCCESS);
}

/* Stream-ordered allocations captured into a graph become its memory nodes. */
static void captured_allocation(CUstream stream, uint64_t baseline)
{
    LOAD(lib, cuStreamBeginCapture_v2);
    LOAD(lib, cuStreamEndCapture);
    LOAD(lib, cuMemAllocAsync);
    LOAD(lib, cuMemFreeAsync);
    LOAD(lib, cuGraphGetNodes);
    LOAD(lib, cuGraphNodeGetType);
    LOAD(lib, cuGraphInstantiateWithFlags);
    LOAD(lib, cuGraphLaunch);
    LOAD(lib, cuGraphExecDestroy);
    LOAD(lib, cuGraphDestroy);
    LOAD(lib, cuDeviceGraphMemTrim);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);

    CUgraph g = NULL;
    CUdeviceptr dptr = 0;
    EXPECT_EQ(p_cuStreamBeginCapture_v2(stream, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAllocAsync(&dptr, 16 * MiB, stream), CUDA_SUCCESS);
    EXPECT_TRUE(dptr != 0);
    EXPECT_EQ(free_bytes(), baseline); /* recorded, not allocated */
    EXPECT_EQ(p_cuMemFreeAsync(dptr, stream), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamEndCapture(stream, &g), CUDA_SUCCESS);
    CUgraphNode nodes[2] = {NULL};
    size_t count = 2;
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL;
    EXPECT_EQ(p_cuGraphGetNodes(g, nodes, &count), CUDA_SUCCESS);
    EXPECT_EQ(count, 2);
    EXPECT_EQ(p_cuGraphNodeGetType(nodes[0], &type), CUDA_SUCCESS);
    EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    EXPECT_EQ(p_cuGraphNodeGetType(nodes[1], &type), CUDA_SUCCESS);
    EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_MEM_FREE);
    CUgraphExec e = NULL;
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    /* Freeing in a capture what no graph allocated is refused; an executable with memory nodes
     * is not launched into a capture (a child graph with memory nodes is not modelled). */
    CUdeviceptr plain = 0;
    CUgraph other = NULL;
    EXPECT_EQ(p_cuMemAlloc_v2(&plain, MiB), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamBeginCapture_v2(stream, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFreeAsync(plain, stream), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuGraphLaunch(e, stream), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(p_cuStreamEndCapture(stream, &other), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(other), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFree_v2(plain), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphLaunch(e, stream), CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 16 * MiB);
    EXPECT_EQ(p_cuGraphExecDestroy(e), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(g), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    EXPECT_EQ(free_bytes(), baseline);
}

/* The attributes: high-water marks reset to the current value by setting 0, nothing else. */
static void attributes(void)
{
    LOAD(lib, cuDeviceSetGraphMemAttribute);
    LOAD(lib, cuDeviceGetGraphMemAttribute);
    LOAD(lib, cuDeviceGraphMemTrim);
    cuuint64_t zero = 0, one = 1, value = 0;
    EXPECT_EQ(p_cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero),
              CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH), 0);
    EXPECT_EQ(p_cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero),
              CUDA_SUCCESS);
    EXPECT_EQ(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH), 0);
    EXPECT_EQ(p_cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &one),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &zero),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, NULL),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuDeviceGetGraphMemAttribute(0, (CUgraphMem_attribute)9, &value),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, NULL),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuDeviceGetGraphMemAttribute(9, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &value),
              CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(p_cuDeviceSetGraphMemAttribute(9, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero),
              CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(p_cuDeviceGraphMemTrim(9), CUDA_ERROR_INVALID_DEVICE);
}

int main(void)
{
    lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    test_use_device0(lib);
    LOAD(lib, cuStreamCreate);
    CUstream stream = NULL;
    EXPECT_EQ(p_cuStreamCreate(&stream, 0), CUDA_SUCCESS);
    uint64_t baseline = free_bytes();
    alloc_and_free_nodes(stream, baseline);
    allocation_left_live(stream, baseline);
    freed_by_another_graph(stream, baseline);
    launch_beyond_the_device(stream, baseline);
    generic_node_additions();
    captured_allocation(stream, baseline);
    attributes();
    if (test_failures > 0)
        return 1;
    printf("PASS\n");
    return 0;
}
