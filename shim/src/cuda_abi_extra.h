/*
 * CUDA driver ABI the shim needs beyond what simgpu/include/simgpu_cuda.h declares: the
 * per-thread-default-stream entry points (real drivers export them as <name>_ptsz / _ptds; the
 * CUDA headers select them when a program is built with per-thread default streams) and the
 * capture query. Same layouts and values as the public CUDA API documentation.
 */
#ifndef TESSERA_CUDA_ABI_EXTRA_H
#define TESSERA_CUDA_ABI_EXTRA_H

#include "simgpu_cuda.h"

/* CUstreamCaptureStatus comes from simgpu_cuda.h. */

CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus);
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status);
CUresult cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus *status);

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream stream,
                             void **kernelParams, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream stream, void **kernelParams);
CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream);

/* Stream capture (the mode is the CUstreamCaptureMode enum: an unsigned int in the ABI). */
CUresult cuStreamBeginCapture(CUstream stream);
CUresult cuStreamBeginCapture_ptsz(CUstream stream);
CUresult cuStreamBeginCapture_v2(CUstream stream, unsigned int mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, unsigned int mode);
CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const CUgraphNode *deps,
                                     const void *edgeData, size_t count, unsigned int mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph, const CUgraphNode *deps,
                                          const void *edgeData, size_t count, unsigned int mode);

/* Graph memory nodes and mipmapped arrays (refused while a memory limit is in force). The node
 * parameters are passed by pointer; the shim reads only the leading CUgraphNodeType of
 * CUgraphNodeParams. */
typedef struct CUmipmappedArray_st *CUmipmappedArray;
#define TESSERA_CU_GRAPH_NODE_TYPE_MEM_ALLOC 10
CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                size_t count, void *params);
CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t count,
                        void *params);
CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                           const void *edgeData, size_t count, void *params);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                unsigned int levels);

/* The CUDA 2.x ABI of the memory entry points (32-bit sizes and device pointers), still exported
 * by drivers and returned by cuGetProcAddress for versions before 3020. */
CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize);
CUresult cuMemAllocPitch(unsigned int *dptr, unsigned int *pitch, unsigned int widthInBytes,
                         unsigned int height, unsigned int elementSizeBytes);
CUresult cuArrayCreate(CUarray *array, const void *desc);
CUresult cuArray3DCreate(CUarray *array, const void *desc);
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes);
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);

#endif
