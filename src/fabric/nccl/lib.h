/*
 * lib.h - the NCCL library of the NCCL fabric, loaded at run time (docs/nccl-fabric.md).
 *
 * libtide is built against NCCL's headers (>= 2.28) but never links libnccl: a torch job
 * already has one loaded, and two copies in one process would not share communicators.  So
 * every NCCL call goes through this table, filled by dlsym from
 *
 *   1. the libnccl.so.2 already loaded in the process (dlopen RTLD_NOLOAD): torch's;
 *   2. else TIDE_NCCL_LIBRARY when set (a path or a file name), else libnccl.so.2 on the
 *      default search path.
 *
 * Each function pointer has the type of its declaration in nccl.h (__typeof__), so a
 * mismatch between the table and the headers does not compile.
 *
 * NVLink multicast stays off: before the first NCCL call NCCL_NVLS_ENABLE is set to 0 when
 * unset, and a value other than 0 is refused (TIDE_ERR_UNSUPPORTED).
 */
#ifndef TIDE_FABRIC_NCCL_LIB_H_
#define TIDE_FABRIC_NCCL_LIB_H_

#include "tide.h"

#include <nccl.h>
#include <stdbool.h>

/* The oldest library the fabric runs on: symmetric windows, ncclTeamLsa, CTA policy ZERO. */
#define TIDE_NCCL_MIN_VERSION 22800

/* One-sided transfers (ncclPutSignal, ncclSignal, ncclWaitSignal: NCCL >= 2.29) exist in this
 * build only when its headers declare them; the loaded library must also have the symbols
 * (tide_nccl_lib_t.has_rma).  The 2.28 build contains none of it. */
#if defined(NCCL_VERSION_CODE) && defined(NCCL_VERSION) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
#define TIDE_NCCL_HAVE_RMA 1
#else
#define TIDE_NCCL_HAVE_RMA 0
#endif

/* nccl_device/core.h's ncclTeam_t (a C++ header); the layout of NCCL 2.28's struct ncclTeam. */
typedef struct {
    int nRanks, rank, stride;
} tide_nccl_team_t;

typedef struct {
    void *handle;
    int version; /* ncclGetVersion of the loaded library */
    char path[256];
    __typeof__(ncclGetVersion) *GetVersion;
    __typeof__(ncclGetErrorString) *GetErrorString;
    __typeof__(ncclGetLastError) *GetLastError;
    __typeof__(ncclGetUniqueId) *GetUniqueId;
    __typeof__(ncclCommInitRankConfig) *CommInitRankConfig;
    __typeof__(ncclCommSplit) *CommSplit;
    __typeof__(ncclCommDestroy) *CommDestroy;
    __typeof__(ncclCommAbort) *CommAbort;
    __typeof__(ncclCommCount) *CommCount;
    __typeof__(ncclCommUserRank) *CommUserRank;
    __typeof__(ncclCommCuDevice) *CommCuDevice;
    __typeof__(ncclCommGetAsyncError) *CommGetAsyncError;
    __typeof__(ncclMemAlloc) *MemAlloc;
    __typeof__(ncclMemFree) *MemFree;
    __typeof__(ncclCommWindowRegister) *CommWindowRegister;
    __typeof__(ncclCommWindowDeregister) *CommWindowDeregister;
    __typeof__(ncclAllGather) *AllGather;
    /* The rails' point-to-point transfers (fabric/nccl/rails.c). */
    __typeof__(ncclSend) *Send;
    __typeof__(ncclRecv) *Recv;
    __typeof__(ncclGroupStart) *GroupStart;
    __typeof__(ncclGroupEnd) *GroupEnd;
    tide_nccl_team_t (*TeamLsa)(ncclComm_t comm);
#if TIDE_NCCL_HAVE_RMA
    /* Optional (the one-sided rails, fabric/nccl/rails_put.c): NULL when the loaded library
     * lacks one of them; has_rma says all three resolved. */
    __typeof__(ncclPutSignal) *PutSignal;
    __typeof__(ncclSignal) *Signal;
    __typeof__(ncclWaitSignal) *WaitSignal;
#endif
    bool has_rma;
} tide_nccl_lib_t;

/* Check NCCL_NVLS_ENABLE (set it to 0 when unset), load the library once per process and
 * resolve the table.  TIDE_ERR_UNSUPPORTED, naming every place tried, when no library is
 * found, a symbol is missing, or the library is older than TIDE_NCCL_MIN_VERSION. */
tide_result_t tide_nccl_lib_get(const tide_nccl_lib_t **lib_out);

/* TIDE_ERR_FABRIC for a failed NCCL call: the call, NCCL's error string and last error. */
tide_result_t tide_nccl_error(const tide_nccl_lib_t *lib, ncclResult_t r, const char *file,
                              int line, const char *what);

#define TIDE_NCCL_CALL(lib, call, what)                                                            \
    do {                                                                                           \
        ncclResult_t tide_nccl_r_ = (call);                                                        \
        if (tide_nccl_r_ != ncclSuccess)                                                           \
            return tide_nccl_error((lib), tide_nccl_r_, __FILE__, __LINE__, (what));               \
    } while (0)

#endif /* TIDE_FABRIC_NCCL_LIB_H_ */
