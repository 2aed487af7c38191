/*
 * handles.c - the process-wide set of live communicator and group objects (handles.h).
 *
 * Open addressing over object addresses, one mutex: lookups happen once per public call,
 * which costs far more than a short critical section, and live objects are few (N
 * communicators plus their groups).
 */
#include "core/handles.h"

#include "core/checks.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TOMBSTONE ((uintptr_t)1)

typedef struct {
    uintptr_t addr; /* 0: empty, TOMBSTONE: removed */
    int kind;
} entry_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t *table;
static size_t capacity, used; /* used counts live entries and tombstones */
static void *quarantine[TIDE_HANDLE_QUARANTINE];
static size_t quarantine_next;

static size_t slot_of(uintptr_t addr, size_t cap) {
    uint64_t h = (uint64_t)addr * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

/* Rehash into a table of `cap` entries (a power of two), dropping tombstones. */
static bool rehash(size_t cap) {
    entry_t *t = calloc(cap, sizeof(*t));
    if (t == NULL) return false;
    size_t live = 0;
    for (size_t i = 0; i < capacity; ++i) {
        if (table[i].addr == 0 || table[i].addr == TOMBSTONE) continue;
        size_t j = slot_of(table[i].addr, cap);
        while (t[j].addr != 0)
            j = (j + 1) & (cap - 1);
        t[j] = table[i];
        ++live;
    }
    free(table);
    table = t;
    capacity = cap;
    used = live;
    return true;
}

/* Index of addr's entry, or SIZE_MAX; the caller holds the lock. */
static size_t find(uintptr_t addr) {
    if (capacity == 0) return SIZE_MAX;
    for (size_t j = slot_of(addr, capacity), n = 0; n < capacity; j = (j + 1) & (capacity - 1), ++n) {
        if (table[j].addr == 0) return SIZE_MAX;
        if (table[j].addr == addr) return j;
    }
    return SIZE_MAX;
}

tide_result_t tide_handle_add(void *obj, tide_handle_kind_t kind) {
    const uintptr_t addr = (uintptr_t)obj;
    pthread_mutex_lock(&lock);
    if ((used + 1) * 2 > capacity && !rehash(capacity < 64 ? 64 : capacity * 2)) {
        pthread_mutex_unlock(&lock);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "handle table: out of host memory for %zu entries",
                        capacity * 2);
    }
    size_t j = slot_of(addr, capacity);
    while (table[j].addr != 0 && table[j].addr != TOMBSTONE)
        j = (j + 1) & (capacity - 1);
    if (table[j].addr == 0) ++used;
    table[j].addr = addr;
    table[j].kind = (int)kind;
    pthread_mutex_unlock(&lock);
    return TIDE_SUCCESS;
}

bool tide_handle_live(const void *obj, tide_handle_kind_t kind) {
    if (obj == NULL) return false;
    pthread_mutex_lock(&lock);
    const size_t j = find((uintptr_t)obj);
    const bool live = j != SIZE_MAX && table[j].kind == (int)kind;
    pthread_mutex_unlock(&lock);
    return live;
}

tide_result_t tide_handle_check(const void *obj, tide_handle_kind_t kind, const char *call) {
    const char *what = kind == TIDE_HANDLE_COMM ? "communicator" : "group";
    if (obj == NULL) return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, what);
    if (!tide_handle_live(obj, kind))
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "%s: %p is not a live %s handle (already %s, or never created by "
                        "libtide)",
                        call, obj, what,
                        kind == TIDE_HANDLE_COMM ? "destroyed" : "deregistered");
    return TIDE_SUCCESS;
}

void tide_handle_release(void *obj, tide_handle_kind_t kind, size_t bytes) {
    if (obj == NULL) return;
    pthread_mutex_lock(&lock);
    const size_t j = find((uintptr_t)obj);
    if (j != SIZE_MAX && table[j].kind == (int)kind) table[j].addr = TOMBSTONE;
    /* Poisoned once it is out of the set, so that code reading it by mistake sees garbage
     * rather than a valid object. */
    memset(obj, 0xdb, bytes);
    void *evicted = quarantine[quarantine_next];
    quarantine[quarantine_next] = obj;
    quarantine_next = (quarantine_next + 1) % TIDE_HANDLE_QUARANTINE;
    pthread_mutex_unlock(&lock);
    free(evicted);
}
