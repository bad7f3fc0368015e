/*
 * Memory shared between processes (IPC memory handles, VMM allocations exported as file
 * descriptors) and peer access between two GPUs: the behaviour, across a forked pair of
 * processes, and every error path, one table row per call. Needs a node of two GPUs. Exit status
 * 0 and "PASS" when everything holds; failures are reported on stderr. The error codes are
 * those NVIDIA documents for these calls; where it documents none, the simulator's choice
 * (docs/simgpu.md).
 */
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simgpu_test.h"

#define ROW(call, want) {#call, (int)(call), (int)(want)}
#define MiB (1ULL << 20)

struct row {
    const char *call;
    int got, want;
};

static void *lib;

#define SYM(fn) ((__typeof__(&fn))test_sym(lib, #fn))
#define OK(call) EXPECT_EQ((call), CUDA_SUCCESS)

static void check(const struct row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (rows[i].got != rows[i].want) {
            fprintf(stderr, "%s = %d, expected %d\n", rows[i].call, rows[i].got, rows[i].want);
            test_failures++;
        }
    }
}

struct msg {
    CUipcMemHandle ipc;
    CUipcMemHandle freed; /* a handle whose allocation its exporter has freed */
};

static void send_fd(int sock, const struct msg *m, int fd)
{
    struct iovec iov = {.iov_base = (void *)m, .iov_len = sizeof *m};
    char ctrl[CMSG_SPACE(sizeof(int))];
    memset(ctrl, 0, sizeof ctrl);
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl,
                       .msg_controllen = sizeof ctrl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    EXPECT_EQ(sendmsg(sock, &h, 0), (long long)sizeof *m);
}

static int recv_fd(int sock, struct msg *m)
{
    struct iovec iov = {.iov_base = m, .iov_len = sizeof *m};
    char ctrl[CMSG_SPACE(sizeof(int))];
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl,
                       .msg_controllen = sizeof ctrl};
    int fd = -1;
    if (recvmsg(sock, &h, MSG_WAITALL) == (ssize_t)sizeof *m && CMSG_FIRSTHDR(&h) != NULL)
        memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&h)), sizeof fd);
    return fd;
}

static CUcontext start(int device)
{
    CUcontext ctx = NULL;
    OK(SYM(cuInit)(0));
    OK(SYM(cuDevicePrimaryCtxRetain)(&ctx, device));
    OK(SYM(cuCtxSetCurrent)(ctx));
    return ctx;
}

static uint64_t driver_used(void)
{
    size_t f = 0, t = 0;
    OK(SYM(cuMemGetInfo_v2)(&f, &t));
    return t - f;
}

static const CUmemAllocationProp fd_prop = {
    .type = CU_MEM_ALLOCATION_TYPE_PINNED,
    .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};

/* The importing process: opens what the exporter sent, checks and writes it. */
static int importer(int sock)
{
    start(0);
    struct msg m;
    int fd = recv_fd(sock, &m);
    EXPECT_TRUE(fd >= 0);
    uint64_t before = driver_used();

    CUdeviceptr p = 0, again = 0;
    OK(SYM(cuIpcOpenMemHandle_v2)(&p, m.ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    OK(SYM(cuIpcOpenMemHandle_v2)(&again, m.ipc, 0));
    EXPECT_EQ(again, p); /* opened twice in one context: the same pointer, one more reference */
    uint32_t word = 0;
    OK(SYM(cuMemcpyDtoH_v2)(&word, p, sizeof word));
    EXPECT_EQ(word, 0x1234u);
    OK(SYM(cuMemsetD32_v2)(p, 0x5678u, MiB / 4));

    CUmemGenericAllocationHandle h = 0;
    OK(SYM(cuMemImportFromShareableHandle)(&h, (void *)(intptr_t)fd,
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUdeviceptr va = 0;
    OK(SYM(cuMemAddressReserve)(&va, 2 * MiB, 0, 0, 0));
    OK(SYM(cuMemMap)(va, 2 * MiB, 0, h, 0));
    CUmemAccessDesc access = {.location = fd_prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    OK(SYM(cuMemSetAccess)(va, 2 * MiB, &access, 1));
    OK(SYM(cuMemcpyDtoH_v2)(&word, va, sizeof word));
    EXPECT_EQ(word, 0xabcdu);
    OK(SYM(cuMemsetD32_v2)(va, 0xef01u, 2 * MiB / 4));
    EXPECT_EQ(driver_used(), before); /* imports count nothing */

    CUdeviceptr q = 0;
    struct row rows[] = {
        ROW(SYM(cuMemFree_v2)(p), CUDA_ERROR_INVALID_VALUE), /* not this process's allocation */
        ROW(SYM(cuIpcOpenMemHandle_v2)(&q, m.freed, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuIpcCloseMemHandle)(p), CUDA_SUCCESS),
        ROW(SYM(cuIpcCloseMemHandle)(p), CUDA_SUCCESS), /* the second reference */
        ROW(SYM(cuIpcCloseMemHandle)(p), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemUnmap)(va, 2 * MiB), CUDA_SUCCESS),
        ROW(SYM(cuMemRelease)(h), CUDA_SUCCESS),
        ROW(SYM(cuMemRelease)(h), CUDA_ERROR_INVALID_VALUE),
    };
    check(rows, sizeof rows / sizeof rows[0]);
    EXPECT_EQ(driver_used(), before);
    char done = 'd';
    EXPECT_EQ(write(sock, &done, 1), 1);
    return test_failures;
}

static void errors(CUcontext ctx0)
{
    CUcontext ctx1 = NULL, other0 = NULL;
    OK(SYM(cuCtxCreate_v2)(&ctx1, 0, 1));
    OK(SYM(cuCtxCreate_v2)(&other0, 0, 0));
    OK(SYM(cuCtxSetCurrent)(ctx0));
    CUdeviceptr p = 0, host_like = 0, q = 0;
    OK(SYM(cuMemAlloc_v2)(&p, MiB));
    OK(SYM(cuMemAllocManaged)(&host_like, MiB, CU_MEM_ATTACH_GLOBAL));
    CUipcMemHandle h, garbage;
    memset(&garbage, 0x7f, sizeof garbage);
    CUmemGenericAllocationHandle plain = 0, released = 0, imported = 0;
    CUmemAllocationProp no_types = fd_prop;
    no_types.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    OK(SYM(cuMemCreate)(&plain, 2 * MiB, &no_types, 0));
    OK(SYM(cuMemCreate)(&released, 2 * MiB, &fd_prop, 0));
    OK(SYM(cuMemRelease)(released));
    /* Forged from a real handle (the simulator's layout: magic, pad, size, name): a size that
     * is not the memory's, and a name without its terminator. */
    CUipcMemHandle wrong_size, unterminated;
    OK(SYM(cuIpcGetMemHandle)(&wrong_size, p));
    unterminated = wrong_size;
    uint64_t bigger = 2 * MiB;
    memcpy(wrong_size.reserved + 8, &bigger, sizeof bigger);
    memset(unterminated.reserved + 16, 'x', sizeof unterminated.reserved - 16);
    int fd = -1, devnull = open("/dev/null", O_RDONLY);
    int can = -1;
    CUdeviceptr a = 0;
    OK(SYM(cuMemAlloc_v2)(&a, MiB));
    struct row rows[] = {
        ROW(SYM(cuIpcGetMemHandle)(NULL, p), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuIpcGetMemHandle)(&h, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuIpcGetMemHandle)(&h, p + 512), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuIpcGetMemHandle)(&h, host_like), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuIpcOpenMemHandle_v2)(NULL, garbage, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuIpcOpenMemHandle_v2)(&q, garbage, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuIpcGetMemHandle)(&h, p), CUDA_SUCCESS),
        ROW(SYM(cuIpcGetMemHandle)(&h, p), CUDA_SUCCESS), /* exported once, asked twice */
        ROW(SYM(cuIpcOpenMemHandle_v2)(&q, h, 2), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuIpcOpenMemHandle_v2)(&q, wrong_size, 0), CUDA_ERROR_MAP_FAILED),
        ROW(SYM(cuIpcOpenMemHandle_v2)(&q, unterminated, 0), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuIpcCloseMemHandle)(p), CUDA_ERROR_INVALID_VALUE), /* not an import */
        ROW(SYM(cuIpcCloseMemHandle)(0), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemExportToShareableHandle)(NULL, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                              0), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemExportToShareableHandle)(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                              0), CUDA_ERROR_INVALID_VALUE), /* not requested */
        ROW(SYM(cuMemExportToShareableHandle)(&fd, released,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemExportToShareableHandle)(&fd, plain, CU_MEM_HANDLE_TYPE_NONE, 0),
            CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemExportToShareableHandle)(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                              1), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemImportFromShareableHandle)(NULL, (void *)(intptr_t)devnull,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemImportFromShareableHandle)(&imported, (void *)(intptr_t)-1,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemImportFromShareableHandle)(&imported, (void *)(intptr_t)devnull,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_INVALID_VALUE), /* not a whole number of granules */
        ROW(SYM(cuMemImportFromShareableHandle)(&imported, (void *)(intptr_t)devnull,
                                                CU_MEM_HANDLE_TYPE_NONE),
            CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuDeviceCanAccessPeer)(NULL, 0, 1), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuDeviceCanAccessPeer)(&can, 0, 7), CUDA_ERROR_INVALID_DEVICE),
        ROW(SYM(cuDeviceCanAccessPeer)(&can, 0, 0), CUDA_SUCCESS),
        ROW(can, 0),
        ROW(SYM(cuCtxEnablePeerAccess)(ctx1, 1), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuCtxEnablePeerAccess)(NULL, 0), CUDA_ERROR_INVALID_CONTEXT),
        ROW(SYM(cuCtxEnablePeerAccess)(other0, 0), CUDA_ERROR_INVALID_DEVICE),
        ROW(SYM(cuCtxDisablePeerAccess)(ctx1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED),
        ROW(SYM(cuCtxDisablePeerAccess)(NULL), CUDA_ERROR_INVALID_CONTEXT),
        ROW(SYM(cuCtxEnablePeerAccess)(ctx1, 0), CUDA_SUCCESS),
        ROW(SYM(cuCtxEnablePeerAccess)(ctx1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
        ROW(SYM(cuCtxDisablePeerAccess)(ctx1), CUDA_SUCCESS),
        ROW(SYM(cuMemcpyPeer)(a, ctx0, p, NULL, MiB), CUDA_ERROR_INVALID_CONTEXT),
        ROW(SYM(cuMemcpyPeer)(a, NULL, p, ctx0, MiB), CUDA_ERROR_INVALID_CONTEXT),
        ROW(SYM(cuMemcpyPeer)(a, ctx1, p, ctx0, 2 * MiB), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemcpyPeer)(0, ctx1, p, ctx0, MiB), CUDA_ERROR_INVALID_VALUE),
        ROW(SYM(cuMemcpyPeer)(a, ctx1, p, ctx0, 0), CUDA_SUCCESS),
        ROW(SYM(cuMemcpyPeerAsync)(a, ctx1, p, ctx0, MiB, NULL), CUDA_SUCCESS),
        ROW(SYM(cuMemcpyPeer_ptds)(a, ctx1, p, ctx0, MiB), CUDA_SUCCESS),
        ROW(SYM(cuMemcpyPeerAsync_ptsz)(a, ctx1, p, ctx0, MiB, NULL), CUDA_SUCCESS),
    };
    check(rows, sizeof rows / sizeof rows[0]);
    /* The exporter's own cuMemFree of an exported allocation works and removes its file. */
    OK(SYM(cuMemFree_v2)(p));
    EXPECT_EQ(SYM(cuIpcOpenMemHandle_v2)(&q, h, 0), CUDA_ERROR_INVALID_VALUE);
    OK(SYM(cuMemRelease)(plain));
    OK(SYM(cuMemFree_v2)(a));
    OK(SYM(cuMemFree_v2)(host_like));
    OK(SYM(cuCtxDestroy_v2)(ctx1));
    OK(SYM(cuCtxDestroy_v2)(other0));
    close(devnull);
}

int main(void)
{
    lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 2;
    pid_t child = fork(); /* before cuInit, as CUDA requires */
    if (child == 0) {
        close(sv[0]);
        _exit(importer(sv[1]) == 0 ? 0 : 1);
    }
    close(sv[1]);
    CUcontext ctx0 = start(0);

    /* Export a cuMemAlloc buffer and an exportable VMM allocation, with data in each. */
    CUdeviceptr buf = 0, gone = 0, va = 0;
    OK(SYM(cuMemAlloc_v2)(&buf, MiB));
    OK(SYM(cuMemsetD32_v2)(buf, 0x1234u, MiB / 4));
    struct msg m;
    OK(SYM(cuIpcGetMemHandle)(&m.ipc, buf));
    OK(SYM(cuMemAlloc_v2)(&gone, MiB));
    OK(SYM(cuIpcGetMemHandle)(&m.freed, gone));
    OK(SYM(cuMemFree_v2)(gone));
    CUmemGenericAllocationHandle h = 0;
    OK(SYM(cuMemCreate)(&h, 2 * MiB, &fd_prop, 0));
    OK(SYM(cuMemAddressReserve)(&va, 2 * MiB, 0, 0, 0));
    OK(SYM(cuMemMap)(va, 2 * MiB, 0, h, 0));
    CUmemAccessDesc access = {.location = fd_prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    OK(SYM(cuMemSetAccess)(va, 2 * MiB, &access, 1));
    OK(SYM(cuMemsetD32_v2)(va, 0xabcdu, 2 * MiB / 4));
    int fd = -1;
    OK(SYM(cuMemExportToShareableHandle)(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    uint64_t used = driver_used();
    send_fd(sv[0], &m, fd);
    close(fd);
    char done = 0;
    EXPECT_EQ(read(sv[0], &done, 1), 1);
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* What the importer wrote is here; what it did counted nothing. */
    uint32_t word = 0;
    OK(SYM(cuMemcpyDtoH_v2)(&word, buf, sizeof word));
    EXPECT_EQ(word, 0x5678u);
    OK(SYM(cuMemcpyDtoH_v2)(&word, va, sizeof word));
    EXPECT_EQ(word, 0xef01u);
    EXPECT_EQ(driver_used(), used);
    OK(SYM(cuMemUnmap)(va, 2 * MiB));
    OK(SYM(cuMemRelease)(h));
    OK(SYM(cuMemFree_v2)(buf));
    EXPECT_EQ(driver_used(), used - 3 * MiB);

    errors(ctx0);
    if (test_failures == 0)
        printf("PASS\n");
    return test_failures == 0 ? 0 : 1;
}
