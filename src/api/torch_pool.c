/*
 * torch_pool.c - the PyTorch allocator hooks of tide.h (docs/memory.md "Counted by PyTorch").
 *
 * tide.fsdp makes an arena segment the fabric allocated visible to PyTorch's accounting by
 * allocating one tensor of the segment's size in a torch.cuda.MemPool whose
 * CUDAPluggableAllocator calls tide_torch_pool_alloc / tide_torch_pool_free.  Those hooks
 * only hand out and take back pointers registered here: the fabric allocated the memory
 * (exportable to the peers, which PyTorch's own segments may not be) and frees it at
 * deregistration.  A small registry of offers, under a mutex because PyTorch may call the
 * hooks from any thread.
 */
#include "core/checks.h"
#include "api/comm.h"
#include "core/handles.h"

#include <pthread.h>
#include <stdbool.h>

/* One communicator's set per entry; a job has one or a few. */
#define POOL_ENTRIES 64

typedef struct {
    void *ptr;      /* NULL: free entry */
    uint64_t bytes; /* the offered segment */
    int device;
    bool handed;   /* PyTorch holds it (alloc returned it, free not seen yet) */
    uint64_t size; /* the size PyTorch asked for */
} pool_entry_t;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pool_entry_t pool[POOL_ENTRIES];

static pool_entry_t *find(const void *ptr) {
    for (int i = 0; i < POOL_ENTRIES; ++i)
        if (pool[i].ptr != NULL && pool[i].ptr == ptr) return &pool[i];
    return NULL;
}

tide_result_t tide_group_segment(tide_group_t group, void **ptr_out, uint64_t *bytes_out,
                                 int *device_out) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "group_segment"));
    TIDE_ARG_CHECK(ptr_out != NULL && bytes_out != NULL && device_out != NULL,
                   "group_segment: ptr_out, bytes_out and device_out must be non-NULL");
#ifdef TIDE_HAVE_CUDA
    if (tide_cuda_mp_is(group->arena)) {
        tide_cuda_mp_segment(group->arena, ptr_out, bytes_out, device_out);
        return TIDE_SUCCESS;
    }
#endif
    return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                    "group_segment: the %s fabric does not allocate one device segment per rank "
                    "(the one-process-per-rank CUDA fabric and the NCCL fabric do)",
                    group->comm->ops->name);
}

tide_result_t tide_torch_pool_offer(void *ptr, uint64_t bytes, int device) {
    tide_error_clear();
    TIDE_ARG_CHECK(ptr != NULL && bytes > 0 && device >= 0,
                   "torch_pool_offer: ptr = %p, bytes = %llu, device = %d: need a pointer, a "
                   "positive size and a device",
                   ptr, (unsigned long long)bytes, device);
    tide_result_t res = TIDE_SUCCESS;
    pthread_mutex_lock(&pool_lock);
    if (find(ptr) != NULL) {
        res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                       "torch_pool_offer: %p is already offered or held by PyTorch", ptr);
        goto out;
    }
    pool_entry_t *e = NULL;
    for (int i = 0; e == NULL && i < POOL_ENTRIES; ++i)
        if (pool[i].ptr == NULL) e = &pool[i];
    if (e == NULL) {
        res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "torch_pool_offer: %d segments offered already",
                       POOL_ENTRIES);
        goto out;
    }
    *e = (pool_entry_t){.ptr = ptr, .bytes = bytes, .device = device};
out:
    pthread_mutex_unlock(&pool_lock);
    return res;
}

tide_result_t tide_torch_pool_withdraw(void *ptr, int *state_out) {
    tide_error_clear();
    pthread_mutex_lock(&pool_lock);
    pool_entry_t *e = ptr == NULL ? NULL : find(ptr);
    const int state = e == NULL ? 0 : e->handed ? 2 : 1;
    if (e != NULL) *e = (pool_entry_t){0};
    pthread_mutex_unlock(&pool_lock);
    if (state_out != NULL) *state_out = state;
    return TIDE_SUCCESS;
}

tide_result_t tide_torch_pool_state(void *ptr, int *state_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(state_out != NULL, "torch_pool_state: state_out is NULL");
    pthread_mutex_lock(&pool_lock);
    const pool_entry_t *e = ptr == NULL ? NULL : find(ptr);
    *state_out = e == NULL ? 0 : e->handed ? 2 : 1;
    pthread_mutex_unlock(&pool_lock);
    return TIDE_SUCCESS;
}

void *tide_torch_pool_alloc(ptrdiff_t size, int device, void *stream) {
    (void)stream; /* nothing is enqueued: the memory exists already */
    void *out = NULL;
    int pending = 0;
    pthread_mutex_lock(&pool_lock);
    /* The one pending offer of this device (tide.fsdp offers right before it allocates). */
    pool_entry_t *e = NULL;
    for (int i = 0; i < POOL_ENTRIES; ++i)
        if (pool[i].ptr != NULL && !pool[i].handed && pool[i].device == device) {
            e = e == NULL ? &pool[i] : e;
            ++pending;
        }
    if (e != NULL && pending == 1 && size > 0 && (uint64_t)size <= e->bytes) {
        e->handed = true;
        e->size = (uint64_t)size;
        out = e->ptr;
    }
    pthread_mutex_unlock(&pool_lock);
    if (out == NULL)
        TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                 "torch_pool_alloc: refused %td bytes on device %d (%s); the hooks hand out an "
                 "arena segment offered just before, they never allocate",
                 size, device,
                 e == NULL     ? "no offer pending"
                 : pending > 1 ? "more than one offer pending"
                               : "size not in (0, the offered bytes]");
    return out;
}

void tide_torch_pool_free(void *ptr, ptrdiff_t size, int device, void *stream) {
    (void)stream;
    bool ok = false;
    pthread_mutex_lock(&pool_lock);
    pool_entry_t *e = ptr == NULL ? NULL : find(ptr);
    if (e != NULL && e->handed && e->device == device && (uint64_t)size == e->size) {
        *e = (pool_entry_t){0}; /* forgotten; the fabric frees the memory */
        ok = true;
    }
    pthread_mutex_unlock(&pool_lock);
    if (!ok)
        TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                 "torch_pool_free: %p (%td bytes, device %d) was not handed out by "
                 "tide_torch_pool_alloc; ignored (nothing is freed here)",
                 ptr, size, device);
}
