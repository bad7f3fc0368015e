/*
 * Virtual memory management. A physical allocation (cuMemCreate) is a memfd counted against the
 * device; a reserved range is PROT_NONE address space; cuMemMap maps the memfd into the range
 * (still inaccessible) and cuMemSetAccess opens it, so - as on a GPU - touching memory before
 * granting access faults, and two mappings of one allocation alias the same bytes. Exported as a
 * POSIX file descriptor (a duplicate of the memfd) and imported in another process, the
 * allocation is the same bytes there; it stays counted once, to the process that created it.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_memory.h"
#include "devmem.h"

#define VMM_GRANULARITY (2u << 20)

struct sim_phys {
    int fd;
    size_t size;
    uint32_t handle;
    int refs;   /* handle references plus one per mapping */
    int handles; /* 1 from cuMemCreate/import, plus one per cuMemRetainAllocationHandle, less
                  * one per cuMemRelease */
    CUdevice device; /* where cuMemCreate placed it; -1 if imported */
    bool imported; /* cuMemImportFromShareableHandle: counted to the exporter, not here */
    CUmemAllocationHandleType handle_types; /* what cuMemCreate allowed exporting as */
    struct sim_phys *next;
};

struct sim_mapping {
    uintptr_t va;
    size_t size;
    struct sim_phys *phys;
    struct sim_mapping *next;
};

struct sim_reservation {
    uintptr_t va;
    size_t size;
    struct sim_reservation *next;
};

static struct sim_phys *physicals;
static struct sim_mapping *mappings;
static struct sim_reservation *reservations;

static bool valid_prop(const CUmemAllocationProp *prop)
{
    return prop != NULL && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
           prop->location.id < sim_cuda.rt.cfg.gpu_count;
}

SIMGPU_API CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                  const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option)
{
    SIM_ENTER();
    if (granularity == NULL || !valid_prop(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

static struct sim_phys *find_phys(CUmemGenericAllocationHandle handle)
{
    for (struct sim_phys *p = physicals; p != NULL; p = p->next) {
        if ((CUmemGenericAllocationHandle)(uintptr_t)p == handle)
            return p;
    }
    return NULL;
}

/* Drop one reference; the memory goes back to the device with the last one. Needs mu. */
static void phys_unref(struct sim_phys *p)
{
    if (--p->refs > 0)
        return;
    for (struct sim_phys **link = &physicals; *link != NULL; link = &(*link)->next) {
        if (*link == p) {
            *link = p->next;
            break;
        }
    }
    close(p->fd);
    if (!p->imported)
        sim_mem_release(&sim_cuda.rt.node, p->handle);
    free(p);
}

SIMGPU_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                const CUmemAllocationProp *prop, unsigned long long flags)
{
    SIM_ENTER();
    if (handle == NULL || !valid_prop(prop) || flags != 0 || size == 0 ||
        size % VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_check_device(prop->location.id);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_phys *p = calloc(1, sizeof *p);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = sim_devmem_reserve(prop->location.id, size, &p->handle);
    if (rc != CUDA_SUCCESS) {
        free(p);
        return rc;
    }
    p->fd = memfd_create("simgpu-vmm", MFD_CLOEXEC);
    if (p->fd < 0 || ftruncate(p->fd, (off_t)size) != 0) {
        if (p->fd >= 0)
            close(p->fd);
        sim_mem_release(&sim_cuda.rt.node, p->handle);
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->size = size;
    p->refs = 1;
    p->handles = 1;
    p->device = prop->location.id;
    p->handle_types = prop->requestedHandleTypes;
    pthread_mutex_lock(&sim_cuda.mu);
    p->next = physicals;
    physicals = p;
    pthread_mutex_unlock(&sim_cuda.mu);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_phys *p = find_phys(handle);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (p != NULL && p->handles > 0) {
        p->handles--;
        phys_unref(p);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                                 CUmemGenericAllocationHandle handle,
                                                 CUmemAllocationHandleType handleType,
                                                 unsigned long long flags)
{
    SIM_ENTER();
    if (shareableHandle == NULL || flags != 0 ||
        handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    const struct sim_phys *p = find_phys(handle);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (p != NULL && p->handles > 0 && (p->handle_types & handleType) != 0) {
        int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
        rc = fd >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        if (fd >= 0)
            *(int *)shareableHandle = fd;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                   void *osHandle,
                                                   CUmemAllocationHandleType shHandleType)
{
    SIM_ENTER();
    int fd = (int)(intptr_t)osHandle;
    struct stat st;
    if (handle == NULL || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size % VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_phys *p = calloc(1, sizeof *p);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (p->fd < 0) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->size = (size_t)st.st_size;
    p->refs = 1;
    p->handles = 1;
    p->device = -1;
    p->imported = true;
    p->handle_types = shHandleType;
    pthread_mutex_lock(&sim_cuda.mu);
    p->next = physicals;
    physicals = p;
    pthread_mutex_unlock(&sim_cuda.mu);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                        CUdeviceptr addr, unsigned long long flags)
{
    SIM_ENTER();
    (void)addr; /* a hint only; the simulator lets the kernel choose */
    if (ptr == NULL || size == 0 || size % VMM_GRANULARITY != 0 || flags != 0 ||
        (alignment & (alignment - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment < VMM_GRANULARITY)
        alignment = VMM_GRANULARITY;
    struct sim_reservation *r = calloc(1, sizeof *r);
    if (r == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t span = size + alignment;
    void *map = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uintptr_t start = ((uintptr_t)map + alignment - 1) & ~(uintptr_t)(alignment - 1);
    if (start > (uintptr_t)map)
        munmap(map, start - (uintptr_t)map);
    munmap((void *)(start + size), (uintptr_t)map + span - (start + size));
    r->va = start;
    r->size = size;
    pthread_mutex_lock(&sim_cuda.mu);
    r->next = reservations;
    reservations = r;
    pthread_mutex_unlock(&sim_cuda.mu);
    *ptr = start;
    return CUDA_SUCCESS;
}

static bool inside_reservation(uintptr_t va, size_t size)
{
    for (const struct sim_reservation *r = reservations; r != NULL; r = r->next) {
        if (va >= r->va && size <= r->size && va - r->va <= r->size - size)
            return true;
    }
    return false;
}

static bool overlaps_mapping(uintptr_t va, size_t size)
{
    for (const struct sim_mapping *m = mappings; m != NULL; m = m->next) {
        if (va < m->va + m->size && m->va < va + size)
            return true;
    }
    return false;
}

bool sim_vmm_range_mapped(uintptr_t ptr, size_t bytes)
{
    for (const struct sim_mapping *m = mappings; m != NULL; m = m->next) {
        if (ptr >= m->va && bytes <= m->size && ptr - m->va <= m->size - bytes)
            return true;
    }
    return false;
}

bool sim_vmm_mapping_at(uintptr_t ptr, uintptr_t *base, size_t *size,
                        unsigned long long *handle_types)
{
    for (const struct sim_mapping *m = mappings; m != NULL; m = m->next) {
        if (ptr >= m->va && ptr - m->va < m->size) {
            *base = m->va;
            *size = m->size;
            *handle_types = (unsigned long long)m->phys->handle_types;
            return true;
        }
    }
    return false;
}

SIMGPU_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    SIM_ENTER();
    uintptr_t va = (uintptr_t)ptr;
    if (flags != 0 || size == 0 || size % VMM_GRANULARITY != 0 || offset % VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_mapping *m = calloc(1, sizeof *m);
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_phys *p = find_phys(handle);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (p != NULL && p->handles > 0 && offset <= p->size && size <= p->size - offset &&
        inside_reservation(va, size) && !overlaps_mapping(va, size)) {
        if (mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset) ==
            MAP_FAILED) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            m->va = va;
            m->size = size;
            m->phys = p;
            m->next = mappings;
            mappings = m;
            p->refs++;
            m = NULL;
            rc = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    free(m);
    return rc;
}

SIMGPU_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                   size_t count)
{
    SIM_ENTER();
    if (desc == NULL || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= sim_cuda.rt.cfg.gpu_count)
            return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
            prot = PROT_READ;
        else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
                 desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ)
            return CUDA_ERROR_INVALID_VALUE;
    }
    /* The whole range must be covered by mappings. */
    pthread_mutex_lock(&sim_cuda.mu);
    uintptr_t at = (uintptr_t)ptr, end = (uintptr_t)ptr + size;
    bool covered = true;
    while (covered && at < end) {
        covered = false;
        for (const struct sim_mapping *m = mappings; m != NULL; m = m->next) {
            if (at >= m->va && at < m->va + m->size) {
                at = m->va + m->size;
                covered = true;
                break;
            }
        }
    }
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (covered)
        rc = mprotect((void *)ptr, size, prot) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

/* Replace the mapping with inaccessible address space: the range stays reserved. Needs mu. */
static void unmap_one(struct sim_mapping *m)
{
    mmap((void *)m->va, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
    phys_unref(m->phys);
    free(m);
}

SIMGPU_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    SIM_ENTER();
    uintptr_t va = (uintptr_t)ptr;
    pthread_mutex_lock(&sim_cuda.mu);
    /* The range must consist of whole mappings: check first, then unmap. */
    size_t covered = 0;
    for (const struct sim_mapping *m = mappings; m != NULL; m = m->next) {
        if (m->va >= va && m->va + m->size <= va + size)
            covered += m->size;
        else if (m->va < va + size && va < m->va + m->size)
            covered = SIZE_MAX; /* a mapping sticks out of the range */
        if (covered == SIZE_MAX)
            break;
    }
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (size > 0 && covered == size) {
        struct sim_mapping **link = &mappings;
        while (*link != NULL) {
            struct sim_mapping *m = *link;
            if (m->va >= va && m->va + m->size <= va + size) {
                *link = m->next;
                unmap_one(m);
            } else {
                link = &m->next;
            }
        }
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (struct sim_reservation **link = &reservations; *link != NULL; link = &(*link)->next) {
        struct sim_reservation *r = *link;
        if (r->va != (uintptr_t)ptr || r->size != size)
            continue;
        if (overlaps_mapping(r->va, r->size))
            break; /* still mapped: unmap first */
        *link = r->next;
        munmap((void *)r->va, r->size);
        free(r);
        rc = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

/* The handle behind a mapped address (any address inside a mapping), with a handle reference
 * taken: each retain needs its own cuMemRelease, as CUDA documents, and the memory stays until
 * the last of those and the last unmapping. */
SIMGPU_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    SIM_ENTER();
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t va = (uintptr_t)addr;
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (const struct sim_mapping *m = mappings; m != NULL; m = m->next) {
        if (va >= m->va && va - m->va < m->size) {
            m->phys->handles++;
            m->phys->refs++;
            *handle = (CUmemGenericAllocationHandle)(uintptr_t)m->phys;
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

/* What cuMemCreate was asked for. An imported handle's device is not known here (the
 * descriptor carries no properties): CUDA_ERROR_NOT_SUPPORTED. */
SIMGPU_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                           CUmemGenericAllocationHandle handle)
{
    SIM_ENTER();
    if (prop == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    const struct sim_phys *p = find_phys(handle);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (p != NULL && p->handles > 0 && p->imported) {
        rc = CUDA_ERROR_NOT_SUPPORTED;
    } else if (p != NULL && p->handles > 0) {
        memset(prop, 0, sizeof *prop);
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->requestedHandleTypes = p->handle_types;
        prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = p->device;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}
