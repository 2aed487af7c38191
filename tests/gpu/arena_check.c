/*
 * arena_check.c - the shared-arena tests' common part (arena_check.h): the set's groups, the
 * step's host data, the copies compared bit for bit, and the FSDP2 call script.
 */
#include "arena_check.h"

#include "api/comm.h"
#include "program/check_ring.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Three groups of 2 or 3 parameters, different sizes per group, rows not divisible by N
 * (padding); ring slots 0, 1, 0: the third block takes over the first block's slot. */
static void arena_describe(arena_run_t *a) {
    for (int i = 0; i < ARENA_G; ++i) {
        const int np = 2 + i % 2;
        for (int p = 0; p < np; ++p) {
            a->shapes[i][p].dim0 = (uint64_t)(5 + 7 * i + 3 * p);
            a->shapes[i][p].inner = (uint64_t)(9 + 4 * i + 2 * p);
        }
        a->desc[i] = (tide_group_desc_t){np, a->shapes[i], TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                                         TIDE_DTYPE_BF16};
        snprintf(a->names[i], sizeof(a->names[i]), "layers.%d", i);
        a->entries[i] = (tide_group_entry_t){&a->cfg, &a->desc[i], i % 2, a->names[i]};
    }
}

void arena_run_init(arena_run_t *a, int m, int l, int me, tide_rs_mode_t mode) {
    memset(a, 0, sizeof(*a));
    a->m = m;
    a->l = l;
    a->n = m * l;
    a->me = me;
    a->mode = mode;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    cfg.mode = mode;
    a->cfg = cfg;
    arena_describe(a);
}

void arena_run_free(arena_run_t *a) {
    for (int i = 0; i < ARENA_G; ++i) {
        free(a->h_shards[i]);
        free(a->h_landing[i]);
        a->h_shards[i] = a->h_landing[i] = NULL;
    }
    for (int k = 0; k < a->num_rec; ++k) {
        cudaFreeHost(a->rec[k].a);
        cudaFreeHost(a->rec[k].b);
    }
    free(a->rec);
    a->rec = NULL;
    a->num_rec = a->cap_rec = 0;
}

int arena_fail(arena_run_t *a, const char *fmt, ...) {
    printf("%s %dx%d %s", a->expect_fail ? "(expected failure)" : "FAIL", a->m, a->l,
           a->mode == TIDE_RS_IN_PLACE ? "in_place" : "slot_reuse");
    if (a->me >= 0) printf(" rank %d", a->me);
    printf(": ");
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout); /* a rank may be killed next */
    ++a->bad;
    return 0;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void arena_fill(uint16_t *buf, uint64_t elems, uint64_t seed) {
    uint64_t s = seed;
    for (uint64_t i = 0; i < elems; ++i) {
        const uint64_t x = rng_next(&s);
        const uint16_t exp = (uint16_t)(127 - 40 + (int)(x % 81));
        buf[i] = (uint16_t)(((x >> 20) & 1) << 15 | exp << 7 | ((x >> 32) & 0x7f));
    }
}

void arena_fill_grads(const arena_run_t *a, int i, int r, int step, uint16_t *buf) {
    arena_fill(buf, arena_grad_elems(a, i), (uint64_t)(2 << 24 | i << 16 | r << 8 | step));
}

uint64_t arena_grad_elems(const arena_run_t *a, int i) {
    uint64_t e = 0;
    for (int p = 0; p < a->desc[i].num_params; ++p)
        e += a->shapes[i][p].dim0 * a->shapes[i][p].inner;
    return e;
}

void arena_grad_ptrs(const arena_run_t *a, int i, const uint8_t *base, const void **out) {
    uint64_t off = 0;
    for (int p = 0; p < a->desc[i].num_params; ++p) {
        out[p] = base + off;
        off += a->shapes[i][p].dim0 * a->shapes[i][p].inner * 2;
    }
}

int arena_learn_plans(arena_run_t *a, const tide_group_t *alone) {
    for (int i = 0; i < ARENA_G; ++i) {
        tide_plan_t plan;
        ARENA_TRY(a, tide_group_plan(alone[i], &plan), "group_plan");
        ARENA_TRY(a, tide_plan_get_summary(plan, &a->sum[i]), "plan_get_summary");
        for (int p = 0; p < a->desc[i].num_params; ++p)
            ARENA_TRY(a, tide_plan_get_param(plan, p, &a->geo[i][p]), "plan_get_param");
        a->h_shards[i] = calloc((size_t)a->n, a->sum[i].shard_bytes);
        a->h_landing[i] = calloc(1, a->sum[i].group_bytes);
        if (a->h_shards[i] == NULL || a->h_landing[i] == NULL)
            return arena_fail(a, "%s", "out of host memory");
    }
    return 1;
}

void arena_host_step(arena_run_t *a, int step) {
    for (int i = 0; i < ARENA_G; ++i) {
        const uint64_t S = a->sum[i].shard_bytes;
        for (int r = 0; r < a->n; ++r)
            arena_fill(a->h_shards[i] + r * S / 2, S / 2,
                       (uint64_t)(1 << 24 | i << 16 | r << 8 | step));
        /* The expected landing: Landing(p, r) = o_p N + r s_p holds rank r's shard of p. */
        memset(a->h_landing[i], 0, a->sum[i].group_bytes);
        for (int p = 0; p < a->desc[i].num_params; ++p)
            for (int r = 0; r < a->n; ++r)
                memcpy((uint8_t *)a->h_landing[i] + a->geo[i][p].shard_offset * a->n +
                           (uint64_t)r * a->geo[i][p].shard_bytes,
                       (uint8_t *)a->h_shards[i] + r * S + a->geo[i][p].shard_offset,
                       a->geo[i][p].shard_bytes);
    }
}

int arena_record(arena_run_t *a, const void *a_dev, cudaStream_t sa, const void *b_dev,
                 cudaStream_t sb, uint64_t bytes, const void *want, const char *what) {
    if (a->num_rec == a->cap_rec) {
        const int cap = a->cap_rec ? 2 * a->cap_rec : 64;
        arena_record_t *rec = realloc(a->rec, (size_t)cap * sizeof(*rec));
        if (rec == NULL) return arena_fail(a, "%s", "out of host memory");
        a->rec = rec;
        a->cap_rec = cap;
    }
    arena_record_t *rc = &a->rec[a->num_rec++];
    memset(rc, 0, sizeof(*rc));
    rc->bytes = bytes;
    rc->want = want;
    snprintf(rc->what, sizeof(rc->what), "%s", what);
    ARENA_CU(a, cudaMallocHost(&rc->a, bytes), "cudaMallocHost");
    ARENA_CU(a, cudaMallocHost(&rc->b, bytes), "cudaMallocHost");
    ARENA_CU(a, cudaMemcpyAsync(rc->a, a_dev, bytes, cudaMemcpyDeviceToHost, sa), "copy out (set)");
    ARENA_CU(a, cudaMemcpyAsync(rc->b, b_dev, bytes, cudaMemcpyDeviceToHost, sb),
             "copy out (alone)");
    return 1;
}

int arena_compare(arena_run_t *a, int step) {
    int ok = 1;
    for (int k = 0; k < a->num_rec; ++k) {
        arena_record_t *rc = &a->rec[k];
        if (memcmp(rc->a, rc->b, rc->bytes) != 0)
            ok = arena_fail(a,
                            "step %d %s: the shared arena's bytes differ from the group "
                            "registered alone",
                            step, rc->what);
        if (rc->want != NULL && memcmp(rc->a, rc->want, rc->bytes) != 0)
            ok = arena_fail(a, "step %d %s: the landing does not hold the shards", step, rc->what);
        if (rc->want == NULL) {
            int nonzero = 0;
            for (uint64_t e = 0; e < rc->bytes / 4; ++e)
                nonzero |= ((const float *)rc->a)[e] != 0.0f;
            if (!nonzero) ok = arena_fail(a, "step %d %s: the output is all zero", step, rc->what);
        }
        cudaFreeHost(rc->a);
        cudaFreeHost(rc->b);
    }
    a->num_rec = 0;
    return ok;
}

int arena_check_read_done(arena_run_t *a, const tide_group_t *set, cudaStream_t s) {
    void *ev[ARENA_G] = {0};
    for (int i = 0; i < ARENA_G; ++i)
        ARENA_TRY(a, tide_group_read_done_event(set[i], &ev[i]), "group_read_done_event");
    for (int i = 0; i < ARENA_G; ++i)
        for (int j = 0; j < i; ++j)
            if (ev[i] == NULL || ev[i] == ev[j])
                return arena_fail(a, "%s", "read-done events of a set's groups are not distinct");
    for (int i = 0; i < ARENA_G; ++i)
        ARENA_CU(a, cudaStreamWaitEvent(s, (cudaEvent_t)ev[i], 0), "wait on read-done");
    ARENA_CU(a, cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return 1;
}

uint64_t arena_fences(const tide_group_t *set, int count) {
    uint64_t fences = 0;
    for (int i = 0; i < count; ++i)
        fences += set[i]->fences;
    return fences;
}

int arena_script(arena_run_t *a, const arena_ops_t *ops) {
    tide_ring_call_t *calls = NULL;
    int n = 0;
    ARENA_TRY(a, tide_ring_fsdp_calls(ARENA_G, 0, a->mode, ARENA_STEPS, &calls, &n),
              "ring_fsdp_calls");
    const int per_step = n / ARENA_STEPS;
    int ok = 1;
    for (int k = 0; k < n && ok; ++k) {
        const int step = k / per_step, i = calls[k].group;
        if (ops->before != NULL) ops->before(a, k, per_step);
        if (k % per_step == 0) ok = ops->sync(a) && ops->new_step(a, step);
        if (!ok) break;
        switch (calls[k].kind) {
        case TIDE_RING_CALL_AG:
            ok = ops->gather(a, i);
            break;
        case TIDE_RING_CALL_RESHARD:
            ok = ops->reshard(a, i);
            break;
        default:
            ok = ops->reduce(a, i, step);
            break;
        }
        if (ok && (k + 1) % per_step == 0) ok = ops->sync(a) && arena_compare(a, step);
    }
    free(calls);
    return ok;
}
