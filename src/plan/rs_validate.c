/*
 * rs_validate.c - the TIDE-RS schedule validator (App. D, invariant I1 of App. E).
 *
 * The validator does not reuse how the schedule derived its masks.  It replays the inbox of a
 * destination node block by block from the sender side: in step c, local rank j of sender
 * node n fills sub-slice s = (j + c̄) mod L (eq. 7) and puts it over rail j into block s of
 * GPU j on the destination, in the generation of the wave that carries c.  It then applies the
 * schedule's zero masks and requires every landing to see, in each block of its generation,
 * either one fresh partial of this wave or a zero; every (pass, s) must receive each
 * contributor 1..M exactly once per call.  Two consecutive calls are replayed from an all-zero
 * inbox, so stale data that a call leaves behind is caught in the next one.
 *
 * State per generation is one 64-bit word of fresh blocks and one of stale blocks, bit s L + j
 * for block s on GPU j (L L <= 64): one sender costs O(1), a call O(n_part M + n_part W L).
 */
#include "core/checks.h"
#include "plan/plan.h"

#include <string.h>

#define SEEN_WORDS (TIDE_MAX_NODES / 64 + 1)
/* Zero masks packed into block words once per validation for the first waves: enough for
 * every schedule up to M = 1024 at n_part = 4 (tide-plan's sweep); later waves pack on use. */
#define ZERO_CACHE 4096

typedef struct {
    const tide_rs_schedule_t *sched;
    int M, L, n_par;
    uint64_t inv_L;                               /* ceil(2^32 / L) */
    uint64_t sender_word[TIDE_MAX_GPUS_PER_NODE]; /* blocks of one sender node, by c̄ mod L */
    uint64_t fresh[2], stale[2];                  /* per generation */
    uint64_t seen[TIDE_MAX_PASSES][SEEN_WORDS];   /* contributors landed this call, per pass */
    uint64_t landed[TIDE_MAX_PASSES];             /* blocks landed this call, per pass */
    uint64_t zero_word[ZERO_CACHE];               /* packed zero masks of waves [0, ZERO_CACHE) */
    tide_validation_t *rep;
} sim_t;

static bool reject(sim_t *sim, int wave, int s, int j, int c0, int c1, const char *why) {
    tide_validation_t *r = sim->rep;
    r->accepted = 0;
    r->wave = wave;
    r->subslice = s;
    r->gpu = j;
    r->contributor0 = c0;
    r->contributor1 = c1;
    TIDE_INFO("TIDE-RS validator: M = %d, L = %d, W_wave = %d, k = %d, n_part = %d rejected at "
              "wave %d (s = %d, j = %d, c = %d/%d): %s",
              sim->M, sim->L, sim->sched->wave_width, sim->sched->round_width, sim->sched->passes,
              wave, s, j, c0, c1, why);
    return false;
}

static int lowest_bit(uint64_t w) {
    return __builtin_ctzll(w);
}

/* The blocks that sender node n's L local ranks fill for contributor index c (eq. 7). */
static uint64_t sender_blocks(const sim_t *sim, int c) {
    if (c == sim->M) return sim->sender_word[0];
    /* c mod L through the reciprocal ceil(2^32 / L): exact for c < 2^32 / L, far above
     * TIDE_MAX_NODES, and without a division per sender. */
    uint32_t quot = (uint32_t)(((uint64_t)(uint32_t)c * sim->inv_L) >> 32);
    return sim->sender_word[(uint32_t)c - quot * (uint32_t)sim->L];
}

/* The replay enumerates sender nodes: n = (m - c) mod M is the node whose step c targets m
 * (c = M: m itself), and its contributor index c(m, n) of eq. 6 selects its blocks.  Both run
 * about n_part M times per call, so they avoid divisions. */
static int sender_node(int M, int m, int c) {
    return c == M ? m : (m >= c ? m - c : m - c + M);
}
static int contributor_of(int M, int m, int n) {
    return n == m ? M : (m >= n ? m - n : m - n + M);
}

/* A wave's zero mask as a block word: bit s L + j for zero_mask[s] bit j. */
static uint64_t packed_zero(const sim_t *sim, const tide_rs_wave_t *wv) {
    uint64_t zero = 0;
    for (int sub = 0; sub < sim->L; ++sub)
        zero |= (uint64_t)wv->zero_mask[sub] << (sub * sim->L);
    return zero;
}

/* Wave fields the replay indexes with; a malformed wave is a rejection, not a crash. */
static bool check_wave(sim_t *sim, int g) {
    const tide_rs_schedule_t *s = sim->sched;
    const tide_rs_wave_t *wv = &s->waves[g];
    if (wv->pass < 0 || wv->pass >= s->passes || (g > 0 && wv->pass < s->waves[g - 1].pass))
        return reject(sim, g, -1, -1, -1, -1, "pass out of range or out of order");
    if (wv->first < 1 || wv->count < 1 || wv->count > sim->L || wv->first > sim->M - wv->count + 1)
        return reject(sim, g, -1, -1, -1, -1, "contributors outside [1, M] or wider than L");
    if (wv->generation < 0 || wv->generation >= sim->n_par)
        return reject(sim, g, -1, -1, -1, -1, "generation outside [0, n_par)");
    /* Wave g's transfers may arrive while wave g - 1 lands (the reason for n_par = 2), so
     * with two generations consecutive waves of a call must alternate.  Across calls the
     * network phase runs behind the previous call's completion. */
    if (sim->n_par == 2 && g > 0 && wv->generation == s->waves[g - 1].generation)
        return reject(sim, g, -1, -1, -1, -1, "two consecutive waves share a generation");
    for (int sub = 0; sub < sim->L; ++sub)
        if (wv->zero_mask[sub] >> sim->L)
            return reject(sim, g, sub, -1, -1, -1, "zero mask names a GPU >= L");
    if (g < ZERO_CACHE) sim->zero_word[g] = packed_zero(sim, wv);
    return true;
}

/* One wave of one call towards destination node m. */
static bool replay_wave(sim_t *sim, int m, int g) {
    const tide_rs_wave_t *wv = &sim->sched->waves[g];
    const int M = sim->M, L = sim->L, q = wv->generation, pass = wv->pass;

    /* Arrivals: every sender node whose contributor index falls in this wave. */
    uint64_t fresh = sim->fresh[q], stale = sim->stale[q];
    uint64_t *seen = sim->seen[pass];
    for (int c = wv->first; c < wv->first + wv->count; ++c) {
        int cn = contributor_of(M, m, sender_node(M, m, c));
        uint64_t blocks = sender_blocks(sim, cn);
        if (fresh & blocks) {
            int bit = lowest_bit(fresh & blocks), c0 = -1; /* c0: who wrote it earlier */
            for (int e = wv->first; e < c; ++e) {
                int ce = contributor_of(M, m, sender_node(M, m, e));
                if (sender_blocks(sim, ce) & ((uint64_t)1 << bit)) c0 = ce;
            }
            return reject(sim, g, bit / L, bit % L, c0, cn, "two contributors write one block");
        }
        uint64_t mark = (uint64_t)1 << (cn & 63);
        if (seen[cn >> 6] & mark)
            return reject(sim, g, -1, -1, cn, cn, "contributor lands twice in one pass");
        seen[cn >> 6] |= mark;
        fresh |= blocks; /* an RDMA put overwrites whatever was there */
        stale &= ~blocks;
    }
    sim->fresh[q] = fresh;
    sim->stale[q] = stale;
    sim->rep->blocks_checked += (uint64_t)wv->count * (uint64_t)L;

    /* Zeroing races with the arrivals, so it must never touch a block this wave writes. */
    uint64_t zero = g < ZERO_CACHE ? sim->zero_word[g] : packed_zero(sim, wv);
    if (zero & sim->fresh[q]) {
        int bit = lowest_bit(zero & sim->fresh[q]);
        return reject(sim, g, bit / L, bit % L, -1, -1, "zero mask clobbers a fresh block");
    }
    sim->stale[q] &= ~zero;

    /* Landing reads every block of the generation through the multicast pointer. */
    if (sim->stale[q]) {
        int bit = lowest_bit(sim->stale[q]);
        return reject(sim, g, bit / L, bit % L, -1, -1, "landing reads a stale block");
    }
    /* Each sender word holds one block per sub-slice (checked once), so the count of fresh
     * blocks is L times the partials landed in every sub-slice. */
    sim->landed[pass] += (uint64_t)__builtin_popcountll(sim->fresh[q]);
    sim->stale[q] |= sim->fresh[q]; /* landing reads, it does not clear */
    sim->fresh[q] = 0;
    return true;
}

static bool replay_call(sim_t *sim, int m) {
    const tide_rs_schedule_t *s = sim->sched;
    const size_t words = (size_t)(sim->M >> 6) + 1;
    for (int p = 0; p < s->passes; ++p) {
        memset(sim->seen[p], 0, words * sizeof(uint64_t));
        sim->landed[p] = 0;
    }
    for (int g = 0; g < s->num_waves; ++g)
        if (!replay_wave(sim, m, g)) return false;
    for (int p = 0; p < s->passes; ++p) {
        /* Contributors are marked at most once and lie in [1, M], so M L landed blocks mean
         * all of them landed, each once in every sub-slice. */
        if (sim->landed[p] == (uint64_t)sim->M * (uint64_t)sim->L) continue;
        for (int c = 1; c <= sim->M; ++c)
            if (!(sim->seen[p][c >> 6] & ((uint64_t)1 << (c & 63))))
                return reject(sim, -1, -1, -1, c, -1, "a contributor never lands in a pass");
        return reject(sim, -1, -1, -1, -1, -1, "a pass lands a wrong partial count");
    }
    return true;
}

/*
 * Rounds and outbox: each wave's remote contributors are cut in increasing order into rounds
 * of at most k that never leave the wave; remote destination J (in send order) uses outbox
 * block J mod n_out.  While round i is in flight, round i + 1's sums fill their blocks, so the
 * destinations of two consecutive rounds, consecutive J, must occupy distinct blocks: at most
 * n_out of them.
 */
static bool check_rounds(sim_t *sim) {
    const tide_rs_schedule_t *s = sim->sched;
    const int M = sim->M;
    const int64_t d_rem = (int64_t)s->passes * (M - 1);
    int next = 0, prev_count = 0;
    int64_t sent = 0;
    if (s->outbox_depth < 0 || s->outbox_depth > d_rem || (d_rem > 0 && s->outbox_depth < 1))
        return reject(sim, -1, -1, -1, -1, -1, "outbox depth outside [1, D_rem]");
    for (int g = 0; g < s->num_waves; ++g) {
        const tide_rs_wave_t *wv = &s->waves[g];
        int remote_end = wv->first + wv->count;
        if (remote_end > M) remote_end = M; /* the own node lands from the spare */
        if (wv->first_round != next || wv->num_rounds < 0 || wv->num_rounds > s->num_rounds - next)
            return reject(sim, g, -1, -1, -1, -1, "rounds not listed in wave order");
        int c = wv->first;
        for (int i = next; i < next + wv->num_rounds; ++i) {
            const tide_rs_round_t *rd = &s->rounds[i];
            if (rd->wave != g || rd->first != c || rd->count < 1 || rd->count > s->round_width ||
                rd->count > remote_end - c)
                return reject(sim, g, -1, -1, rd->first, -1, "round spans waves or exceeds k");
            if (rd->count + prev_count > s->outbox_depth)
                return reject(sim, g, -1, -1, rd->first, -1,
                              "consecutive rounds share an outbox block");
            c += rd->count;
            sent += rd->count;
            prev_count = rd->count;
        }
        if (c != remote_end)
            return reject(sim, g, -1, -1, c, -1, "a remote contributor is never sent");
        next += wv->num_rounds;
    }
    if (next != s->num_rounds || sent != d_rem)
        return reject(sim, -1, -1, -1, -1, -1, "round list does not cover D_rem destinations");
    return true;
}

static tide_result_t check_shape(const tide_rs_schedule_t *s) {
    TIDE_ARG_CHECK(s->nodes >= 1 && s->nodes <= TIDE_MAX_NODES,
                   "validator: nodes M = %d outside [1, %d]", s->nodes, TIDE_MAX_NODES);
    TIDE_ARG_CHECK(s->gpus_per_node >= 1 && s->gpus_per_node <= TIDE_MAX_GPUS_PER_NODE,
                   "validator: L = %d outside [1, %d]", s->gpus_per_node, TIDE_MAX_GPUS_PER_NODE);
    TIDE_ARG_CHECK(s->passes >= 1 && s->passes <= TIDE_MAX_PASSES,
                   "validator: passes n_part = %d outside [1, %d]", s->passes, TIDE_MAX_PASSES);
    TIDE_ARG_CHECK(s->inbox_generations == 1 || s->inbox_generations == 2,
                   "validator: inbox generations n_par = %d, need 1 or 2", s->inbox_generations);
    TIDE_ARG_CHECK(s->round_width >= 1, "validator: round width k = %d", s->round_width);
    TIDE_ARG_CHECK(s->num_waves >= 1 && s->waves != NULL, "validator: schedule has no waves");
    TIDE_ARG_CHECK(s->num_rounds >= 0 && (s->num_rounds == 0 || s->rounds != NULL),
                   "validator: schedule has %d rounds and no round list", s->num_rounds);
    for (int g = 0; g < s->num_waves; ++g)
        TIDE_ARG_CHECK(s->waves[g].zero_mask != NULL, "validator: wave %d has no zero mask", g);
    return TIDE_SUCCESS;
}

tide_result_t tide_rs_validate(const tide_rs_schedule_t *sched, tide_validation_t *report_out) {
    TIDE_ARG_CHECK(sched != NULL && report_out != NULL, "validator: sched or report_out is NULL");
    TIDE_CHECK(check_shape(sched));

    tide_validation_t rep = {0};
    rep.accepted = 1;
    rep.wave = rep.subslice = rep.gpu = rep.contributor0 = rep.contributor1 = -1;
    sim_t sim;
    sim.sched = sched;
    sim.M = sched->nodes;
    sim.L = sched->gpus_per_node;
    sim.n_par = sched->inbox_generations;
    sim.inv_L = (((uint64_t)1 << 32) + (uint64_t)sim.L - 1) / (uint64_t)sim.L;
    sim.rep = &rep;
    /* eq. 7 from the sender side: local rank j fills s = (j + c̄) mod L and uses rail j, so
     * its block lands on GPU j.  c̄ mod L < M, hence it is a valid contributor index too. */
    bool ok = true;
    const uint64_t gpu_bits = ((uint64_t)1 << sim.L) - 1;
    for (int x = 0; x < sim.L && x < sim.M; ++x) {
        sim.sender_word[x] = 0;
        for (int j = 0; j < sim.L; ++j)
            sim.sender_word[x] |= (uint64_t)1 << (tide_rs_subslice(sim.M, sim.L, j, x) * sim.L + j);
        /* One partial per sub-slice per sender: the landing counts below rely on it. */
        for (int sub = 0; ok && sub < sim.L; ++sub)
            if (__builtin_popcountll((sim.sender_word[x] >> (sub * sim.L)) & gpu_bits) != 1)
                ok =
                    reject(&sim, -1, sub, -1, x, -1, "a sender does not fill every sub-slice once");
    }

    for (int g = 0; ok && g < sched->num_waves; ++g)
        ok = check_wave(&sim, g);
    /* Destination nodes 0 and M - 1 cover both ends of the wrap-around in c(m, n). */
    const int dests[2] = {0, sim.M - 1};
    for (int d = 0; ok && d < (sim.M > 1 ? 2 : 1); ++d) {
        memset(sim.fresh, 0, sizeof(sim.fresh)); /* the first call meets an all-zero inbox */
        memset(sim.stale, 0, sizeof(sim.stale));
        for (int call = 0; ok && call < 2; ++call)
            ok = replay_call(&sim, dests[d]);
    }
    ok = ok && check_rounds(&sim);
    *report_out = rep;
    return TIDE_SUCCESS;
}

tide_result_t tide_validate_schedule(int nodes, int gpus_per_node, int wave_width, int round_width,
                                     tide_rs_mode_t mode, int passes,
                                     tide_validation_t *report_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(report_out != NULL, "validate: report_out is NULL");
    TIDE_ARG_CHECK(nodes >= 1 && nodes <= TIDE_MAX_NODES, "validate: nodes M = %d outside [1, %d]",
                   nodes, TIDE_MAX_NODES);
    TIDE_ARG_CHECK(gpus_per_node >= 1 && gpus_per_node <= TIDE_MAX_GPUS_PER_NODE,
                   "validate: gpus_per_node L = %d outside [1, %d]", gpus_per_node,
                   TIDE_MAX_GPUS_PER_NODE);
    TIDE_ARG_CHECK(wave_width >= 1 && wave_width <= gpus_per_node,
                   "validate: wave width W_wave = %d outside [1, L = %d]", wave_width,
                   gpus_per_node);
    TIDE_ARG_CHECK(round_width >= 1 && round_width <= TIDE_MAX_ROUND_WIDTH,
                   "validate: round width k = %d outside [1, %d]", round_width,
                   TIDE_MAX_ROUND_WIDTH);
    TIDE_ARG_CHECK(passes >= 1 && passes <= TIDE_MAX_PASSES,
                   "validate: passes n_part = %d outside [1, %d]", passes, TIDE_MAX_PASSES);
    TIDE_ARG_CHECK((int)mode >= 0 && mode < TIDE_RS_MODE_COUNT,
                   "validate: mode = %d is not a tide_rs_mode_t", (int)mode);

    /* A colliding partition is an ordinary verdict here, not an error: report it without
     * going through the schedule builder, which logs the rejection.  The builder rejects
     * exactly the partitions this scan flags, so past it a build failure is a real error. */
    tide_validation_t rep;
    if (tide_rs_find_collision(nodes, gpus_per_node, wave_width, &rep)) {
        *report_out = rep;
        return TIDE_SUCCESS;
    }
    tide_topo_t topo;
    TIDE_CHECK(tide_topo_init(nodes, gpus_per_node, &topo));
    tide_rs_schedule_t sched;
    TIDE_CHECK(
        tide_rs_schedule_build(&topo, NULL, wave_width, round_width, mode, passes, 1, &sched));
    tide_result_t res = tide_rs_validate(&sched, &rep);
    tide_rs_schedule_free(&sched);
    if (res == TIDE_SUCCESS) *report_out = rep;
    return res;
}
