/*
 * mp_agree.c - what every rank of a one-process-per-rank world must agree on, settled once
 * at world creation (docs/cuda-fabric.md, "Bootstrap").
 *
 * Each process reads its own environment.  Four settings change which signals, flags and
 * exchanges the ranks use, so a rank whose value differs from its peers' would wait for a
 * signal no peer writes (a hang until TIDE_TIMEOUT_MS whose error names a healthy peer) or
 * meet a peer's socket exchange it does not run:
 *
 *   TIDE_CUDA_MP_FLAGS   where the flags live and what a wait is (mp_flags.c)
 *   TIDE_CUDA_MP_DIRECT  direct mode's per-call header exchange (mp_direct.c, mp_export.c)
 *   TIDE_SYNC_ELIDE      which signals a call drops (mp_elide.c)
 *   TIDE_CUDA_MP_RAILS   cross-node puts as rail steps or as copies (mp_rails.c)
 *
 * One all-gather carries every rank's device, MPS state, these settings and whether its part
 * of the world failed so far; every rank takes rank 0's settings (as the control block has
 * always carried rank 0's flag placement), and a rank whose own differ says so once.  A rank
 * that failed before the exchange (a refused variable, no CUDA context) still takes part, so
 * that every other rank fails at once with an error naming it instead of waiting out the
 * join deadline; it returns its own error once every rank joined (or at that deadline).
 * The variables that only shape a rank's own work (batching, grids, slicing, timeouts) may
 * differ.
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"

#include <string.h>

enum { AGREE_FLAGS, AGREE_DIRECT, AGREE_ELIDE, AGREE_RAILS };

static const char *const agree_names[TIDE_MP_BOOT_CHOICES] = {
    "TIDE_CUDA_MP_FLAGS", "TIDE_CUDA_MP_DIRECT", "TIDE_SYNC_ELIDE", "TIDE_CUDA_MP_RAILS"};

tide_result_t tide_cuda_mp_world_agree(tide_mp_world_t *w, tide_result_t local,
                                       int64_t timeout_ms) {
    tide_mp_rank_info_t mine;
    memset(&mine, 0, sizeof(mine));
    memcpy(mine.uuid, w->uuid, sizeof(mine.uuid));
    mine.mps = local == TIDE_SUCCESS && tide_cuda_mp_device_mps(w->device);
    mine.status = local;
    mine.choice[AGREE_FLAGS] = w->flags;
    mine.choice[AGREE_DIRECT] = w->direct;
    mine.choice[AGREE_ELIDE] = w->elide;
    mine.choice[AGREE_RAILS] = w->rails != NULL;
    tide_mp_world_info_t d;
    const tide_result_t res = tide_mp_boot_agree(&w->boot, &mine, timeout_ms, &d);
    if (local != TIDE_SUCCESS) return local; /* reported where it failed (mp_world.c) */
    TIDE_CHECK(res);
    if (d.failed >= 0)
        return TIDE_ERR((tide_result_t)d.failed_status,
                        "cuda mp fabric '%s': rank %d could not create its part of the world "
                        "(%s; its own log says why)",
                        w->boot.name, d.failed, tide_get_error_string(d.failed_status));
    for (int k = 0; k < TIDE_MP_BOOT_CHOICES; ++k)
        if (d.choice0[k] != mine.choice[k])
            TIDE_WARN("cuda mp fabric: rank %d: %s differs from rank 0's, which holds for "
                      "the world",
                      w->base.rank, agree_names[k]);
    w->flags = d.choice0[AGREE_FLAGS];
    w->direct = d.choice0[AGREE_DIRECT] != 0;
    w->elide = d.choice0[AGREE_ELIDE] != 0;
    if (!d.choice0[AGREE_RAILS])
        w->rails = NULL;
    else if (w->rails == NULL)
        /* Only the emulated transport is chosen by the environment (mp_world.c), and only
         * with more than one node, the same on every rank. */
        TIDE_CHECK(tide_cuda_mp_world_set_rails(w, &tide_cuda_mp_rails_emulated));
    tide_cuda_mp_flags_resolve(w, d.shared, d.timeshared);
    return TIDE_SUCCESS;
}
