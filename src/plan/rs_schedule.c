/*
 * rs_schedule.c - the TIDE-RS schedule (§4, §5.2-5.3, App. D/E): Latin-square waves, inbox
 * generations, stale-block zero masks, wave-aligned network rounds, the outbox depth, and the
 * sub-slice pieces and Level-1 copy-descriptor counts of a geometry.
 *
 * Contributors c = 1..M of a destination node (c = M is the own node, c̄ = c mod M = 0) are cut
 * in increasing order into W = ceil(M / W_wave) waves.  Contributor c's partial for sub-slice s
 * lands on destination GPU j(s, c) = (s - c̄) mod L (eq. 8), so a wave is collision-free iff its
 * contributors have distinct c̄ mod L.  Inside one pass all waves but the last hold only remote
 * contributors, at most L consecutive integers, hence distinct residues; only the last wave
 * can pair the own node (c̄ = 0) with a remote multiple of L (App. D).
 *
 * Inbox blocks are tracked as one 64-bit word per generation, bit s L + j for block s on
 * local GPU j (L L <= 64), so that the blocks one wave writes are the OR of one "diagonal"
 * word per contributor residue.
 */
#include "core/checks.h"
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

/* Bits s L + j for j = j(s, c) over all s: the blocks of contributors with c̄ mod L = x. */
static uint64_t diagonal_word(int L, int x) {
    uint64_t word = 0;
    for (int s = 0; s < L; ++s)
        word |= (uint64_t)1 << (s * L + ((s - x) % L + L) % L);
    return word;
}

/* Blocks written by the wave holding contributors [first, first + count), given the
 * diagonal word of every residue. */
static uint64_t wave_written(const uint64_t *diag, int nodes, int L, int first, int count) {
    uint64_t word = 0;
    for (int c = first; c < first + count; ++c)
        word |= diag[c == nodes ? 0 : c % L];
    return word;
}

bool tide_rs_find_collision(int nodes, int L, int wave_width, tide_validation_t *report_out) {
    if (nodes < 1 || L < 1 || L > TIDE_MAX_GPUS_PER_NODE || wave_width < 1) return false;
    int wave = 0;
    for (int64_t first = 1; first <= nodes; first += wave_width, ++wave) {
        int64_t last = first + wave_width - 1;
        if (last > nodes) last = nodes;
        /* owner[x]: the contributor of this wave with c̄ mod L = x, 0 if none yet. */
        int owner[TIDE_MAX_GPUS_PER_NODE] = {0};
        /* c̄ mod L advances with c (one division per wave: the sweep of tide-plan calls this
         * for every M), except at c = M where c̄ = 0. */
        int next_x = (int)(first % L);
        for (int c = (int)first; c <= (int)last; ++c) {
            int x = c == nodes ? 0 : next_x;
            if (++next_x == L) next_x = 0;
            if (owner[x] == 0) {
                owner[x] = c;
                continue;
            }
            if (report_out != NULL) {
                tide_validation_t r = {0};
                r.accepted = 0;
                r.wave = wave;
                r.subslice = 0; /* equal residues collide in every sub-slice; report s = 0 */
                r.gpu = tide_rs_dest_gpu(nodes, L, 0, c);
                r.contributor0 = owner[x];
                r.contributor1 = c;
                *report_out = r;
            }
            return true;
        }
    }
    return false;
}

/* Rounds of one pass: the W - 1 full waves are remote only; the last one holds the own node. */
int tide_rs_count_rounds(int nodes, int wave_width, int round_width) {
    if (nodes < 1 || wave_width < 1 || round_width < 1) return -1;
    int64_t waves = ((int64_t)nodes + wave_width - 1) / wave_width;
    int64_t last_remote = nodes - 1 - (waves - 1) * wave_width;
    int64_t rounds = (waves - 1) * (((int64_t)wave_width + round_width - 1) / round_width) +
                     (last_remote + round_width - 1) / round_width;
    return (int)rounds; /* <= M - 1 */
}

static tide_result_t check_args(const tide_topo_t *topo, const tide_geom_t *geom, int wave_width,
                                int round_width, tide_rs_mode_t mode, int passes,
                                int staging_slots) {
    TIDE_ARG_CHECK(topo != NULL, "TIDE-RS: topo is NULL");
    TIDE_ARG_CHECK(topo->nodes >= 1 && topo->nodes <= TIDE_MAX_NODES,
                   "TIDE-RS: nodes M = %d outside [1, %d]", topo->nodes, TIDE_MAX_NODES);
    TIDE_ARG_CHECK(topo->gpus_per_node >= 1 && topo->gpus_per_node <= TIDE_MAX_GPUS_PER_NODE,
                   "TIDE-RS: gpus_per_node L = %d outside [1, %d]", topo->gpus_per_node,
                   TIDE_MAX_GPUS_PER_NODE);
    TIDE_ARG_CHECK(wave_width >= 1 && wave_width <= topo->gpus_per_node,
                   "TIDE-RS: wave width W_wave = %d outside [1, L = %d]", wave_width,
                   topo->gpus_per_node);
    TIDE_ARG_CHECK(round_width >= 1 && round_width <= TIDE_MAX_ROUND_WIDTH,
                   "TIDE-RS: round width k = %d outside [1, %d]", round_width,
                   TIDE_MAX_ROUND_WIDTH);
    TIDE_ARG_CHECK(passes >= 1 && passes <= TIDE_MAX_PASSES,
                   "TIDE-RS: passes n_part = %d outside [1, %d]", passes, TIDE_MAX_PASSES);
    TIDE_ARG_CHECK((int)mode >= 0 && mode < TIDE_RS_MODE_COUNT,
                   "TIDE-RS: mode = %d is not a tide_rs_mode_t", (int)mode);
    TIDE_ARG_CHECK(staging_slots >= 1 && staging_slots <= TIDE_MAX_STAGING_SLOTS,
                   "TIDE-RS: staging slots n_stg = %d outside [1, %d]", staging_slots,
                   TIDE_MAX_STAGING_SLOTS);
    if (geom != NULL) {
        TIDE_ARG_CHECK(geom->ranks == topo->nodes * topo->gpus_per_node,
                       "TIDE-RS: geometry is for N = %d ranks, topology has %d", geom->ranks,
                       topo->nodes * topo->gpus_per_node);
        TIDE_ARG_CHECK(geom->num_params >= 1 && geom->params != NULL,
                       "TIDE-RS: geometry has no parameters");
    }
    return TIDE_SUCCESS;
}

/* Waves in call order (pass-major), their rounds, generations and zero masks. */
static tide_result_t build_waves(tide_rs_schedule_t *s) {
    const int M = s->nodes, L = s->gpus_per_node, W = s->waves_per_pass;
    const int k = s->round_width, n_par = s->inbox_generations;
    const int rounds_per_pass = tide_rs_count_rounds(M, s->wave_width, k);

    s->waves = calloc((size_t)s->num_waves, sizeof(*s->waves));
    if (s->waves == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "TIDE-RS: %d waves", s->num_waves);
    /* All zero masks share one block owned through waves[0].zero_mask (see the free). */
    uint16_t *masks = calloc((size_t)s->num_waves * (size_t)L, sizeof(uint16_t));
    if (masks == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "TIDE-RS: zero masks of %d waves", s->num_waves);
    for (int g = 0; g < s->num_waves; ++g)
        s->waves[g].zero_mask = masks + (size_t)g * (size_t)L;

    s->num_rounds = s->passes * rounds_per_pass;
    if (s->num_rounds > 0) {
        s->rounds = calloc((size_t)s->num_rounds, sizeof(*s->rounds));
        if (s->rounds == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "TIDE-RS: %d rounds", s->num_rounds);
    }

    int next_round = 0;
    for (int g = 0; g < s->num_waves; ++g) {
        tide_rs_wave_t *wv = &s->waves[g];
        int w = g % W;
        wv->pass = g / W;
        wv->first = w * s->wave_width + 1;
        wv->count = (w == W - 1) ? M - wv->first + 1 : s->wave_width;
        wv->generation = g % n_par;
        wv->has_own = (w == W - 1);
        /* Rounds carry remote contributors only: the own node lands from the spare. */
        int remote = wv->count - (wv->has_own ? 1 : 0);
        wv->first_round = next_round;
        for (int c = wv->first; c < wv->first + remote; c += k) {
            tide_rs_round_t *rd = &s->rounds[next_round++];
            rd->wave = g;
            rd->first = c;
            rd->count = (wv->first + remote - c < k) ? wv->first + remote - c : k;
        }
        wv->num_rounds = next_round - wv->first_round;
    }
    if (next_round != s->num_rounds)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "TIDE-RS: built %d rounds, counted %d", next_round,
                        s->num_rounds);

    /*
     * Stale-block zeroing (§4.2): a generation's blocks hold what its previous wave wrote
     * until someone overwrites or zeroes them.  prev(g) is the previous wave of the same
     * generation in call order; for the first waves of a call it is the last one of the
     * previous call, because every call runs the same schedule.  Zeroing written(prev) minus
     * written(g) leaves exactly g's fresh blocks and zeros at g's landing (by induction, every
     * other block was already zero at prev's landing).  In the very first call those blocks
     * are still zero, and zeroing them again is harmless.
     */
    const uint64_t gpu_bits = ((uint64_t)1 << L) - 1;
    uint64_t diag[TIDE_MAX_GPUS_PER_NODE];
    for (int x = 0; x < L; ++x)
        diag[x] = diagonal_word(L, x);
    for (int g = 0; g < s->num_waves; ++g) {
        int prev = g - n_par;
        if (prev < 0) /* the last wave of the call with g's generation (possibly g itself) */
            prev = s->num_waves - 1 - ((s->num_waves - 1 - g) % n_par);
        const tide_rs_wave_t *wv = &s->waves[g], *pv = &s->waves[prev];
        uint64_t zero = wave_written(diag, M, L, pv->first, pv->count) &
                        ~wave_written(diag, M, L, wv->first, wv->count);
        for (int sub = 0; sub < L; ++sub)
            wv->zero_mask[sub] = (uint16_t)((zero >> (sub * L)) & gpu_bits);
    }
    return TIDE_SUCCESS;
}

/*
 * Outbox depth per bank.  In-Place: a block for every remote destination of the call, so the
 * read phase never waits for the network.  Slot-Reuse (eq. 9): the destinations of two
 * consecutive rounds, because the next round's sums run while this round is in flight.
 */
static int outbox_depth(const tide_rs_schedule_t *s) {
    if (s->nodes == 1) return 0;
    if (s->mode == TIDE_RS_IN_PLACE) return s->passes * (s->nodes - 1);
    int depth = 0, prev = 0;
    for (int i = 0; i < s->num_rounds; ++i) {
        int need = s->rounds[i].count + prev;
        if (need > depth) depth = need;
        prev = s->rounds[i].count;
    }
    return depth;
}

/*
 * Sub-slice pieces.  The sub-slice of an element decides its arithmetic: it names the Level-1
 * owner (whose contribution is added last) and the inbox GPU of every contributor (the
 * landing's order), so it must not depend on a tuning knob (§4.3, DESIGN.md §4).  Parameter p
 * is therefore cut first into L sub-slices of a_p = round_up(ceil(E_p / L), 4) elements
 * (16-byte fp32 vectors), element x going to sub-slice s = x / a_p whatever n_part is, and
 * only then each sub-slice into n_part pieces of e_p = round_up(ceil(a_p / n_part), 4)
 * elements, piece `pass` of sub-slice s covering [s a_p + pass e_p, s a_p + min((pass + 1)
 * e_p, a_p)) clipped to E_p.  A pass moves elements between calls' rounds, never between
 * sub-slices, so passes leave the sums bitwise unchanged.  Every piece sits at column
 * col_p = sum_{q<p} e_q of its row, and every row has the same capacity E_sub = sum_p e_p.
 */
static tide_result_t build_subslices(const tide_geom_t *geom, tide_rs_schedule_t *s) {
    const int L = s->gpus_per_node, parts = s->passes * L, P = geom->num_params;
    s->num_pieces = calloc((size_t)parts, sizeof(int));
    s->pieces = calloc((size_t)parts, sizeof(tide_rs_piece_t *));
    if (s->num_pieces == NULL || s->pieces == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "TIDE-RS: piece lists of %d sub-slices", parts);
    for (int i = 0; i < parts; ++i) {
        s->pieces[i] = calloc((size_t)P, sizeof(tide_rs_piece_t));
        if (s->pieces[i] == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "TIDE-RS: %d pieces of sub-slice %d", P, i);
    }
    uint64_t col = 0;
    for (int p = 0; p < P; ++p) {
        const uint64_t elems = geom->params[p].shard_elems;
        const uint64_t a = tide_align_up_u64(tide_div_ceil_u64(elems, (uint64_t)L), 4);
        const uint64_t e = tide_align_up_u64(tide_div_ceil_u64(a, (uint64_t)s->passes), 4);
        for (int sub = 0; sub < L; ++sub) {
            const uint64_t first = (uint64_t)sub * a; /* < L (E_p / L + 4): no overflow */
            for (int pass = 0; pass < s->passes; ++pass) {
                const uint64_t off = (uint64_t)pass * e;
                if (off >= a || first + off >= elems) break; /* later pieces are empty too */
                uint64_t len = a - off < e ? a - off : e;
                if (elems - (first + off) < len) len = elems - (first + off);
                const int idx = pass * L + sub;
                tide_rs_piece_t *pc = &s->pieces[idx][s->num_pieces[idx]++];
                pc->param = p;
                pc->begin = first + off;
                pc->len = len;
                pc->col = col;
            }
        }
        if (!tide_add_u64(col, e, &col))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "TIDE-RS: sub-slice row overflows at param %d", p);
    }
    s->subslice_elems = col;
    return TIDE_SUCCESS;
}

/*
 * Level-1 copy descriptors per rank per call (§4.1, "Coalescing the destination-rank axis").
 * Rank (n, i) pushes, for every pass, destination node t (its own node included: its Level 1
 * needs the other local ranks' pushes too) and owner j != i, the pieces of sub-slice
 * s = (j + c̄(t, n)) mod L for the L destination ranks r = t L + l.  Rank r's part of a piece
 * [begin, begin + len) holds clamp(D_p K_p - (r E_p + begin), 0, len) valid elements; rows past
 * D_p are padding and are not copied.  Flat: one copy per rank with valid elements.  Coalesced:
 * the fully valid ranks form a prefix in l with constant pitches (E_p b_grad in G_p, E_sub
 * b_grad in the staging rows), so one strided copy, plus a flat tail for a partial rank.
 *
 * Let f_s(t) count the descriptors of all pieces of sub-slice s towards node t.  Rank (n, i)
 * issues sum_{s,t} f_s(t) minus, for every t, the sub-slice it owns itself,
 * s = (c̄ + i) mod L with c̄ = (t - n) mod M.  The count is not the same on every rank: a piece
 * that is empty for some s (tiny parameters) is skipped by whichever rank owns that s, and
 * padded nodes t meet different owned sub-slices from different n.  So the maximum is taken
 * over all (n, i): f_s is a step function of t (full nodes, one boundary node, empty nodes),
 * built from difference arrays, and the owned term is a sum of f_s over one residue class of t
 * mod L on [n, M) and on [0, n), read from per-residue prefix sums: O(n_part L (P + L M)).
 * Every count is below n_part M L P L < 2^35, so plain uint64 arithmetic cannot overflow.
 */

/* sum of f(t) over t in [0, b) with t = rho (mod L), from per-residue prefix sums R. */
static uint64_t residue_prefix(const uint64_t *R, int L, int b, int rho) {
    if (b <= 0) return 0;
    int last = b - 1;
    int t = last - ((last - rho) % L + L) % L;
    return t >= 0 ? R[t] : 0;
}

/* Adds one piece's descriptors towards every node t to the difference arrays (size M + 1). */
static tide_result_t add_piece(const tide_geom_param_t *q, const tide_rs_piece_t *pc, int M, int L,
                               uint64_t *d_flat, uint64_t *d_coal) {
    const uint64_t N = (uint64_t)M * (uint64_t)L, E = q->shard_elems;
    uint64_t valid_total, end = pc->begin + pc->len; /* <= E_p */
    if (!tide_mul_u64(q->dim0, q->inner, &valid_total))
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "TIDE-RS: D_p K_p of param %d overflows", pc->param);
    /* Ranks [0, full) hold the whole piece; rank `full` may hold a part of it. */
    uint64_t full = valid_total >= end ? (valid_total - end) / E + 1 : 0;
    if (full > N) full = N;
    int partial = full < N && full * E + pc->begin < valid_total;
    uint64_t t_b = full / (uint64_t)L; /* node of the first rank that is not full */
    d_flat[0] += (uint64_t)L;
    d_coal[0] += 1;
    if (t_b < (uint64_t)M) {
        uint64_t in_node = full - t_b * (uint64_t)L;
        uint64_t flat_b = in_node + (uint64_t)partial, coal_b = (in_node > 0) + (uint64_t)partial;
        /* unsigned wrap-around cancels in the prefix sum */
        d_flat[t_b] += flat_b - (uint64_t)L;
        d_flat[t_b + 1] -= flat_b;
        d_coal[t_b] += coal_b - 1;
        d_coal[t_b + 1] -= coal_b;
    }
    return TIDE_SUCCESS;
}

static tide_result_t count_descriptors(const tide_geom_t *geom, tide_rs_schedule_t *s) {
    const int M = s->nodes, L = s->gpus_per_node;
    const size_t row = (size_t)M + 1, f_len = 2 * (size_t)L * row, acc_len = 2 * (size_t)M * L;
    tide_result_t res = TIDE_SUCCESS;
    uint64_t *buf = malloc((f_len + acc_len) * sizeof(uint64_t));
    if (buf == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "TIDE-RS: descriptor tables for M = %d", M);
    uint64_t *f_flat = buf, *f_coal = buf + (size_t)L * row;                /* f[s * row + t] */
    uint64_t *acc_flat = buf + f_len, *acc_coal = acc_flat + (size_t)M * L; /* [n L + i] */
    memset(acc_flat, 0, acc_len * sizeof(uint64_t));
    uint64_t total_flat = 0, total_coal = 0;

    for (int pass = 0; pass < s->passes; ++pass) {
        memset(buf, 0, f_len * sizeof(uint64_t));
        for (int sub = 0; sub < L; ++sub) {
            int idx = pass * L + sub;
            uint64_t *df = f_flat + (size_t)sub * row, *dc = f_coal + (size_t)sub * row;
            for (int i = 0; i < s->num_pieces[idx]; ++i) {
                const tide_rs_piece_t *pc = &s->pieces[idx][i];
                TIDE_CHECK_GOTO(add_piece(&geom->params[pc->param], pc, M, L, df, dc), res, out);
            }
            /* difference arrays -> f_s(t) -> per-residue prefix sums R_s(t) */
            for (int t = 1; t < M; ++t) {
                df[t] += df[t - 1];
                dc[t] += dc[t - 1];
            }
            for (int t = 0; t < M; ++t) {
                total_flat += df[t];
                total_coal += dc[t];
            }
            for (int t = L; t < M; ++t) {
                df[t] += df[t - L];
                dc[t] += dc[t - L];
            }
        }
        /* Subtract what rank (n, i) owns itself: sub-slice (c̄ + i) mod L of every node t. */
        for (int n = 0; n < M; ++n) {
            for (int i = 0; i < L; ++i) {
                uint64_t own_flat = 0, own_coal = 0;
                for (int sub = 0; sub < L; ++sub) {
                    const uint64_t *rf = f_flat + (size_t)sub * row,
                                   *rc = f_coal + (size_t)sub * row;
                    int rho = n + sub - i; /* t in [n, M): c̄ = t - n */
                    own_flat += residue_prefix(rf, L, M, rho) - residue_prefix(rf, L, n, rho) +
                                residue_prefix(rf, L, n, rho - M); /* t < n: c̄ = t - n + M */
                    own_coal += residue_prefix(rc, L, M, rho) - residue_prefix(rc, L, n, rho) +
                                residue_prefix(rc, L, n, rho - M);
                }
                acc_flat[(size_t)n * L + i] += own_flat;
                acc_coal[(size_t)n * L + i] += own_coal;
            }
        }
    }
    uint64_t min_flat = UINT64_MAX, min_coal = UINT64_MAX;
    for (size_t r = 0; r < (size_t)M * L; ++r) {
        if (acc_flat[r] < min_flat) min_flat = acc_flat[r];
        if (acc_coal[r] < min_coal) min_coal = acc_coal[r];
    }
    s->descriptors_flat = total_flat - min_flat;
    s->descriptors_coalesced = total_coal - min_coal;
out:
    free(buf);
    return res;
}

tide_result_t tide_rs_schedule_build(const tide_topo_t *topo, const tide_geom_t *geom,
                                     int wave_width, int round_width, tide_rs_mode_t mode,
                                     int passes, int staging_slots, tide_rs_schedule_t *sched_out) {
    TIDE_CHECK(check_args(topo, geom, wave_width, round_width, mode, passes, staging_slots));
    TIDE_ARG_CHECK(sched_out != NULL, "TIDE-RS: sched_out is NULL");
    const int M = topo->nodes, L = topo->gpus_per_node;

    tide_validation_t col;
    if (tide_rs_find_collision(M, L, wave_width, &col))
        return TIDE_ERR(TIDE_ERR_PLAN_REJECTED,
                        "TIDE-RS: M = %d, L = %d, W_wave = %d collides: wave %d puts sub-slice "
                        "s = %d of contributors c0 = %d and c1 = %d on the same GPU j = %d "
                        "(W_wave does not divide L; App. D)",
                        M, L, wave_width, col.wave, col.subslice, col.contributor0,
                        col.contributor1, col.gpu);

    tide_result_t res = TIDE_SUCCESS;
    tide_rs_schedule_t s;
    memset(&s, 0, sizeof(s));
    s.nodes = M;
    s.gpus_per_node = L;
    s.wave_width = wave_width;
    s.round_width = round_width;
    s.passes = passes;
    s.mode = mode;
    s.staging_slots = staging_slots;
    s.waves_per_pass = (M + wave_width - 1) / wave_width;
    s.inbox_generations = s.waves_per_pass == 1 ? 1 : 2;
    s.num_waves = passes * s.waves_per_pass;

    TIDE_CHECK_GOTO(build_waves(&s), res, fail);
    s.outbox_depth = outbox_depth(&s);
    if (geom != NULL) {
        TIDE_CHECK_GOTO(build_subslices(geom, &s), res, fail);
        TIDE_CHECK_GOTO(count_descriptors(geom, &s), res, fail);
    }
    *sched_out = s;
    return TIDE_SUCCESS;

fail:
    tide_rs_schedule_free(&s);
    return res;
}

void tide_rs_schedule_free(tide_rs_schedule_t *sched) {
    if (sched == NULL) return;
    if (sched->waves != NULL) free(sched->waves[0].zero_mask); /* the shared mask block */
    free(sched->waves);
    free(sched->rounds);
    if (sched->pieces != NULL)
        for (int i = 0; i < sched->passes * sched->gpus_per_node; ++i)
            free(sched->pieces[i]);
    free(sched->pieces);
    free(sched->num_pieces);
    memset(sched, 0, sizeof(*sched));
}
