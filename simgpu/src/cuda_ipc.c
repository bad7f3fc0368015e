/*
 * Interprocess memory handles for device memory from cuMemAlloc (cuIpcGetMemHandle,
 * cuIpcOpenMemHandle, cuIpcCloseMemHandle). Simulated device memory is private host memory, so
 * exporting moves an allocation's backing, in place and with its contents, into a file beside
 * the node's state file, named in the handle: a process of the node that opens the handle maps
 * the same bytes. The memory stays counted once, to the exporting process; an importer's
 * mapping is an ALLOC_IPC record that counts nothing and only cuIpcCloseMemHandle (or the
 * destruction of its context) removes. Differences from a real driver: docs/simgpu.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_memory.h"

#define IPC_MAGIC 0x53495043u /* "SIPC" */

/* What the 64 opaque bytes of a CUipcMemHandle hold. */
struct ipc_wire {
    uint32_t magic;
    uint32_t pad;
    uint64_t size;
    char name[SIM_IPC_NAME_MAX];
};

_Static_assert(sizeof(struct ipc_wire) <= sizeof(CUipcMemHandle), "IPC handle too small");

static unsigned ipc_counter;

static int ipc_path(const char *name, char *out, size_t n)
{
    int len = snprintf(out, n, "%s.ipc-%s", sim_cuda.rt.cfg.state_file, name);
    return len > 0 && (size_t)len < n ? 0 : -1;
}

/* Copy the pages of [src, src + size) that were ever touched (the rest read as zeros, as the
 * file does) to `dst`. */
static void copy_touched(void *dst, const void *src, size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (size + page - 1) / page;
    unsigned char *resident = malloc(pages);
    if (resident == NULL || mincore((void *)src, size, resident) != 0) {
        memcpy(dst, src, size); /* cannot tell: copy everything */
        free(resident);
        return;
    }
    for (size_t i = 0; i < pages; i++) {
        if (!(resident[i] & 1))
            continue;
        size_t off = i * page;
        memcpy((char *)dst + off, (const char *)src + off, off + page <= size ? page : size - off);
    }
    free(resident);
}

/* Move `rec`'s backing into a new file (once). Needs mu. */
static CUresult export_rec(struct sim_alloc_rec *rec)
{
    if (rec->exported)
        return CUDA_SUCCESS;
    char name[SIM_IPC_NAME_MAX];
    snprintf(name, sizeof name, "%llx-%d-%u", (unsigned long long)sim_cuda.rt.node.me.ns_ino,
             (int)sim_cuda.rt.node.me.pid, __atomic_add_fetch(&ipc_counter, 1, __ATOMIC_RELAXED));
    char path[PATH_MAX + 64];
    if (ipc_path(name, path, sizeof path) != 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        sim_log("cannot create %s for an IPC handle: %s", path, strerror(errno));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    CUresult rc = CUDA_ERROR_OPERATING_SYSTEM;
    void *staging = MAP_FAILED;
    if (ftruncate(fd, (off_t)rec->size) == 0)
        staging = mmap(NULL, rec->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (staging != MAP_FAILED) {
        copy_touched(staging, (const void *)rec->base, rec->size);
        munmap(staging, rec->size);
        if (mmap((void *)rec->base, rec->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                 0) != MAP_FAILED) {
            rec->exported = true;
            memcpy(rec->ipc_name, name, sizeof name);
            rc = CUDA_SUCCESS;
        }
    }
    if (rc != CUDA_SUCCESS) {
        sim_log("cannot back an allocation with %s: %s", path, strerror(errno));
        unlink(path);
    }
    close(fd);
    return rc;
}

void sim_ipc_forget(const struct sim_alloc_rec *rec)
{
    char path[PATH_MAX + 64];
    if (rec->kind != ALLOC_IPC && ipc_path(rec->ipc_name, path, sizeof path) == 0)
        unlink(path);
}

SIMGPU_API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    SIM_ENTER();
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_alloc_rec *rec = sim_find_alloc((uintptr_t)dptr);
    if (rec == NULL || (rec->kind != ALLOC_DEVICE && rec->kind != ALLOC_IPC))
        rc = CUDA_ERROR_INVALID_VALUE; /* only cuMemAlloc memory (and re-export of an import) */
    else if (rec->kind == ALLOC_DEVICE)
        rc = export_rec(rec);
    if (rc == CUDA_SUCCESS) {
        struct ipc_wire w = {.magic = IPC_MAGIC, .size = rec->size};
        memcpy(w.name, rec->ipc_name, sizeof w.name);
        memset(pHandle, 0, sizeof *pHandle);
        memcpy(pHandle->reserved, &w, sizeof w);
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

/* This context's open import of `name`, or NULL. Needs mu. */
static struct sim_alloc_rec *find_import(const char *name, CUcontext ctx)
{
    for (struct sim_alloc_rec *r = sim_first_alloc(); r != NULL; r = r->next) {
        if (r->kind == ALLOC_IPC && r->ctx == ctx && strcmp(r->ipc_name, name) == 0)
            return r;
    }
    return NULL;
}

SIMGPU_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                          unsigned int Flags)
{
    SIM_ENTER();
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct ipc_wire w;
    memcpy(&w, handle.reserved, sizeof w);
    if (pdptr == NULL || (Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0 ||
        w.magic != IPC_MAGIC || w.size == 0 || memchr(w.name, 0, sizeof w.name) == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_alloc_rec *open_already = find_import(w.name, ctx);
    if (open_already != NULL) { /* as CUDA does: one more reference, the same pointer */
        open_already->ipc_refs++;
        *pdptr = open_already->base;
        pthread_mutex_unlock(&sim_cuda.mu);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    char path[PATH_MAX + 64];
    if (ipc_path(w.name, path, sizeof path) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_INVALID_VALUE; /* freed by its exporter, or not of this node */
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == w.size)
        map = mmap(NULL, w.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return CUDA_ERROR_MAP_FAILED;
    struct sim_alloc_rec *rec = calloc(1, sizeof *rec);
    if (rec == NULL) {
        munmap(map, w.size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rec->base = (uintptr_t)map;
    rec->size = w.size;
    rec->ctx = ctx;
    rec->kind = ALLOC_IPC;
    rec->ipc_refs = 1;
    memcpy(rec->ipc_name, w.name, sizeof rec->ipc_name);
    pthread_mutex_lock(&sim_cuda.mu);
    sim_link_alloc(rec);
    pthread_mutex_unlock(&sim_cuda.mu);
    *pdptr = rec->base;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_alloc_rec *rec = sim_find_alloc((uintptr_t)dptr);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (rec != NULL && rec->kind == ALLOC_IPC) {
        if (--rec->ipc_refs == 0)
            sim_free_rec(rec);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}
