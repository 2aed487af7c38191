/*
 * lib.c - loading libnccl.so.2 at run time (lib.h).
 */
#include "core/checks.h"
#include "fabric/nccl/lib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SONAME "libnccl.so.2"

static pthread_mutex_t lib_mu = PTHREAD_MUTEX_INITIALIZER;
static tide_nccl_lib_t lib_table;
static int lib_loaded;

/* NVLink multicast off before NCCL reads its environment (at its first communicator). */
static tide_result_t nvls_off(void) {
    const char *v = getenv("NCCL_NVLS_ENABLE");
    if (v == NULL) {
        if (setenv("NCCL_NVLS_ENABLE", "0", 0) != 0)
            return TIDE_ERR(TIDE_ERR_FABRIC, "nccl fabric: setenv(NCCL_NVLS_ENABLE=0) failed");
        /* NCCL reads its parameters once per process: with a library already loaded (torch's)
         * a communicator it created before may have read the variable unset. */
        void *h = dlopen(SONAME, RTLD_NOW | RTLD_NOLOAD);
        if (h != NULL) {
            tide_log(TIDE_LOG_WARN, __FILE__, __LINE__,
                     "nccl fabric: NCCL_NVLS_ENABLE was unset while %s was already loaded; set "
                     "to 0 now, which NCCL may not read again: set NCCL_NVLS_ENABLE=0 before "
                     "the process's first NCCL communicator (torch.distributed init)",
                     SONAME);
            dlclose(h);
        }
        return TIDE_SUCCESS;
    }
    if (strcmp(v, "0") != 0)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "nccl fabric: NCCL_NVLS_ENABLE=%s; this fabric runs with NVLink multicast "
                        "off: set NCCL_NVLS_ENABLE=0 (or leave it unset)",
                        v);
    return TIDE_SUCCESS;
}

static tide_result_t open_library(void **handle_out, char *path, size_t path_bytes) {
    /* 1. The library already in the process (torch's), found by its soname. */
    void *h = dlopen(SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (h != NULL) {
        snprintf(path, path_bytes, "%s (already loaded)", SONAME);
        *handle_out = h;
        return TIDE_SUCCESS;
    }
    /* 2. TIDE_NCCL_LIBRARY, else the default search path. */
    const char *env = getenv("TIDE_NCCL_LIBRARY");
    const char *name = env != NULL && env[0] != '\0' ? env : SONAME;
    h = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        const char *why = dlerror();
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "nccl fabric: no NCCL library: %s is not loaded in this process "
                        "(dlopen RTLD_NOLOAD) and dlopen(\"%s\")%s failed: %s; install NCCL >= "
                        "2.28 (or import torch first), or set TIDE_NCCL_LIBRARY",
                        SONAME, name, env != NULL && env[0] != '\0' ? " (TIDE_NCCL_LIBRARY)" : "",
                        why != NULL ? why : "?");
    }
    snprintf(path, path_bytes, "%s", name);
    *handle_out = h;
    return TIDE_SUCCESS;
}

static tide_result_t resolve(tide_nccl_lib_t *t) {
#define SYM(field, name)                                                                           \
    do {                                                                                           \
        void *tide_sym_ = dlsym(t->handle, name);                                                  \
        memcpy(&t->field, &tide_sym_, sizeof(tide_sym_));                                          \
        if (tide_sym_ == NULL)                                                                     \
            return TIDE_ERR(TIDE_ERR_UNSUPPORTED,                                                  \
                            "nccl fabric: %s has no %s (NCCL >= 2.28 needed)", t->path, name);     \
    } while (0)
    SYM(GetVersion, "ncclGetVersion");
    SYM(GetErrorString, "ncclGetErrorString");
    SYM(GetLastError, "ncclGetLastError");
    SYM(GetUniqueId, "ncclGetUniqueId");
    SYM(CommInitRankConfig, "ncclCommInitRankConfig");
    SYM(CommSplit, "ncclCommSplit");
    SYM(CommDestroy, "ncclCommDestroy");
    SYM(CommAbort, "ncclCommAbort");
    SYM(CommCount, "ncclCommCount");
    SYM(CommUserRank, "ncclCommUserRank");
    SYM(CommCuDevice, "ncclCommCuDevice");
    SYM(CommGetAsyncError, "ncclCommGetAsyncError");
    SYM(MemAlloc, "ncclMemAlloc");
    SYM(MemFree, "ncclMemFree");
    SYM(CommWindowRegister, "ncclCommWindowRegister");
    SYM(CommWindowDeregister, "ncclCommWindowDeregister");
    SYM(AllGather, "ncclAllGather");
    SYM(Send, "ncclSend");
    SYM(Recv, "ncclRecv");
    SYM(GroupStart, "ncclGroupStart");
    SYM(GroupEnd, "ncclGroupEnd");
    SYM(TeamLsa, "ncclTeamLsa");
#undef SYM
    t->has_rma = false;
#if TIDE_NCCL_HAVE_RMA
    /* Optional: a library older than the headers (2.28 under 2.29+ headers) lacks them, and
     * the fabric then uses the two-sided rails. */
#define OPT_SYM(field, name)                                                                       \
    do {                                                                                           \
        void *tide_sym_ = dlsym(t->handle, name);                                                  \
        memcpy(&t->field, &tide_sym_, sizeof(tide_sym_));                                          \
    } while (0)
    OPT_SYM(PutSignal, "ncclPutSignal");
    OPT_SYM(Signal, "ncclSignal");
    OPT_SYM(WaitSignal, "ncclWaitSignal");
#undef OPT_SYM
    t->has_rma = t->PutSignal != NULL && t->Signal != NULL && t->WaitSignal != NULL;
#endif
    const ncclResult_t r = t->GetVersion(&t->version);
    if (r != ncclSuccess)
        return TIDE_ERR(TIDE_ERR_FABRIC, "nccl fabric: ncclGetVersion of %s failed (%d)", t->path,
                        (int)r);
    if (t->version < TIDE_NCCL_MIN_VERSION)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "nccl fabric: %s is NCCL %d; the fabric needs >= %d (symmetric windows, "
                        "the LSA team)",
                        t->path, t->version, TIDE_NCCL_MIN_VERSION);
    /* lsa.cu reads NCCL's window descriptor (struct ncclWindow_vidmem) with the layout of the
     * headers TIDE was built with; NCCL does not promise that layout across releases. */
    if (t->version / 100 != NCCL_VERSION_CODE / 100)
        tide_log(TIDE_LOG_WARN, __FILE__, __LINE__,
                 "nccl fabric: %s is NCCL %d, TIDE was built with the headers of NCCL %d: the "
                 "LSA pointers are read with the headers' window layout (a mismatch is caught "
                 "by the pointer and marker checks of each registration)",
                 t->path, t->version, NCCL_VERSION_CODE);
    return TIDE_SUCCESS;
}

tide_result_t tide_nccl_lib_get(const tide_nccl_lib_t **lib_out) {
    TIDE_CHECK(nvls_off());
    pthread_mutex_lock(&lib_mu);
    tide_result_t res = TIDE_SUCCESS;
    if (!lib_loaded) {
        tide_nccl_lib_t t;
        memset(&t, 0, sizeof(t));
        res = open_library(&t.handle, t.path, sizeof(t.path));
        if (res == TIDE_SUCCESS) res = resolve(&t);
        if (res == TIDE_SUCCESS) {
            lib_table = t;
            lib_loaded = 1;
            TIDE_INFO("nccl fabric: %s, NCCL version %d%s", t.path, t.version,
                      t.has_rma ? " (ncclPutSignal / ncclWaitSignal present)" : "");
        } else if (t.handle != NULL) {
            dlclose(t.handle);
        }
    }
    pthread_mutex_unlock(&lib_mu);
    if (res == TIDE_SUCCESS) *lib_out = &lib_table;
    return res;
}

tide_result_t tide_nccl_error(const tide_nccl_lib_t *lib, ncclResult_t r, const char *file,
                              int line, const char *what) {
    const char *str = lib->GetErrorString != NULL ? lib->GetErrorString(r) : NULL;
    const char *last = lib->GetLastError != NULL ? lib->GetLastError(NULL) : NULL;
    return tide_error_set(TIDE_ERR_FABRIC, file, line, "nccl fabric: %s: %s (%d)%s%s", what,
                          str != NULL ? str : "?", (int)r, last != NULL && last[0] ? ": " : "",
                          last != NULL ? last : "");
}
