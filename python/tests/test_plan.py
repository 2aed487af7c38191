"""tide planning API: Config, Plan, memory_bounds, solve, validate_schedule, errors.

Expected values come from the paper's definitions (§2.1, §5.4, App. D, App. G) written out
here, or from figures the paper prints.
"""

import ctypes
import math

import pytest

import tide

# One Llama 3 70B decoder layer (hidden 8192, GQA 64/8, MLP 28672), in FSDP2 order.
LLAMA3_70B_LAYER = [(8192, 8192), (1024, 8192), (1024, 8192), (8192, 8192), (28672, 8192),
                    (28672, 8192), (8192, 28672), (8192,), (8192,)]
LLAMA3_70B_LAYER_PARAMS = 855_654_400  # 2 (8192^2 + 1024 8192) + 3 28672 8192 + 2 8192


def div_ceil(a, b):
    return -(-a // b)


def expected_geometry(shapes, ranks, b_ag):
    """[(R_p, s_p, o_p, fp32 offset)] straight from §2.1."""
    out, offset, elems = [], 0, 0
    for shape in shapes:
        d, k = shape[0], math.prod(shape[1:])
        rows = div_ceil(d, ranks)
        out.append((d, k, rows, rows * k * b_ag, offset, 4 * elems))
        offset += rows * k * b_ag
        elems += rows * k
    return out


# ------------------------------------------------------------------------------- basics


def test_version_and_error_strings():
    assert tide.version() == (0, 1, 0)
    assert tide.VERSION_CODE == 100
    for code in tide.Result:
        assert tide.error_string(code)
    assert tide.error_string(tide.Result.UNSUPPORTED).startswith("unsupported")
    assert tide.error_string(99) == "unknown result code"


def test_config_mirrors_tide_config_init():
    c = tide.Config(4, 8)
    assert c.size == ctypes.sizeof(tide.Config) == 64
    assert c.magic == 0x54494445 and c.version == tide.VERSION_CODE
    assert (c.nodes, c.gpus_per_node, c.ranks) == (4, 8, 32)
    assert (c.wave_width, c.round_width, c.passes, c.staging_slots) == (0, 0, 0, 0)
    assert (c.mode, c.sum_ctas, c.landing_ctas, c.multicast) == (0, 0, 0, 0)
    c = tide.Config(2, 4, wave_width=2, round_width=1, passes=2, staging_slots=3,
                    mode="slot-reuse", sum_ctas=6, landing_ctas=5, multicast=True)
    assert (c.wave_width, c.round_width, c.passes, c.staging_slots) == (2, 1, 2, 3)
    assert (c.mode, c.mode_name, c.sum_ctas, c.landing_ctas, c.multicast) == (
        1, "slot-reuse", 6, 5, 1)
    assert c.copy(mode="in-place").mode == 0 and c.copy().landing_ctas == 5
    # tide_lane_t: auto by default, by name or value, kept by copy(); the library checks range
    assert tide.Config(4, 1).lane == 0 and tide.Config(4, 1, lane="rail").lane == 2
    assert tide.Config(4, 1, lane="generic").copy().lane == 1
    assert "lane='rail'" in repr(tide.Config(4, 1, lane=2))
    with pytest.raises(ValueError):
        tide.Config(4, 1, lane="fast")
    # The header is what the library checks: a struct not built by TIDE_CONFIG_INIT is refused.
    bad = tide.Config(1, 2)
    bad.magic = 0
    with pytest.raises(tide.TideError) as err:
        tide.Plan(bad, [(4, 4)])
    assert err.value.code == tide.Result.INVALID_ARGUMENT and "magic" in err.value.message
    bad = tide.Config(1, 2)
    bad.size = 48
    with pytest.raises(tide.TideError):
        tide.Plan(bad, [(4, 4)])
    with pytest.raises(ValueError):
        tide.Config(1, 2, mode="sideways")
    with pytest.raises(ValueError):
        tide.Config(1.5, 2)


# ------------------------------------------------------------------------------- plans


@pytest.mark.parametrize("nodes,gpus,dtype", [(64, 8, "bf16"), (8, 8, "bf16"), (3, 5, "fp32"),
                                              (1, 1, "bf16")])
def test_llama_plan_against_definitions(nodes, gpus, dtype):
    n = nodes * gpus
    b = 2 if dtype == "bf16" else 4
    with tide.Plan(tide.Config(nodes, gpus), LLAMA3_70B_LAYER, ag_dtype=dtype,
                   grad_dtype=dtype) as plan:
        s = plan.summary
        geo = expected_geometry(LLAMA3_70B_LAYER, n, b)
        elems = sum(g[2] * g[1] for g in geo)
        assert (s["nodes"], s["gpus_per_node"], s["ranks"], s["num_params"]) == (
            nodes, gpus, n, 9)
        assert s["shard_bytes"] == b * elems
        assert s["group_bytes"] == n * b * elems
        assert s["grad_shard_bytes"] == b * elems
        assert s["fp32_shard_bytes"] == 4 * elems
        assert s["fsdp2_pack_bytes"] == 4 * n * elems  # eq. 3: N fp32 blocks of S_fp32
        assert s["ag_rounds"] == math.ceil(math.log2(nodes))
        # Defaults: W_wave = L, one pass, k = min(2, max(1, M-1)), n_par = 1 iff one wave.
        assert s["rs_wave_width"] == gpus
        assert s["rs_waves"] == div_ceil(nodes, gpus)
        assert s["rs_inbox_generations"] == (1 if s["rs_waves"] == 1 else 2)
        assert s["rs_passes"] == 1
        assert s["rs_round_width"] == min(2, max(1, nodes - 1))
        for p, want in enumerate(geo):
            assert tuple(plan.param(p)) == want
        for p in (0, 4, 8):
            for r in (0, 1 % n, n - 1):
                assert plan.landing_offset(p, r) == geo[p][4] * n + r * geo[p][3]
        regions = plan.regions()
        end = 0
        for name in tide.REGION_NAMES:  # layout order, aligned, disjoint, inside the arena
            reg = regions[name]
            assert reg.offset % tide.ARENA_ALIGN == 0 and reg.offset >= end
            end = reg.offset + reg.bytes
        assert end <= s["arena_bytes"]
        assert regions["landing0"].bytes >= s["group_bytes"]
        assert regions["landing1"].bytes >= s["group_bytes"]
        assert regions["recv_stage"].bytes >= (nodes - 1) * s["shard_bytes"]
        assert regions["resident"].bytes >= s["shard_bytes"]
        assert plan.region(0) == regions["landing0"]


def test_llama_plan_paper_scale_figures():
    """M = 64, L = 8 (N = 512): every dim0 divides by 512, so nothing is padded."""
    with tide.Plan(tide.Config(64, 8), LLAMA3_70B_LAYER) as plan:
        s = plan.summary
        assert s["group_bytes"] == 2 * LLAMA3_70B_LAYER_PARAMS
        assert s["shard_bytes"] == 2 * LLAMA3_70B_LAYER_PARAMS // 512 == 3_342_400
        assert s["fp32_shard_bytes"] == 6_684_800
        assert s["fsdp2_pack_bytes"] == 4 * LLAMA3_70B_LAYER_PARAMS
        assert s["ag_rounds"] == 6
        assert (s["rs_waves"], s["rs_inbox_generations"]) == (8, 2)
        # §5.2: at most (L-1) P M L flat Level-1 copies; one strided copy replaces the L flat
        # copies of an owner's destination node (no tails here: no padded rows).
        assert s["rs_descriptors_flat"] == 8 * s["rs_descriptors"]
        assert 0 < s["rs_descriptors"] <= 7 * 9 * 64
        # Strided-run merging keeps the Bruck all-gather at O(P log M) descriptors per local
        # landing (the unicast fallback writes each of the L local landings), well below one
        # copy per (parameter, slot, local GPU).
        assert 9 * 8 <= s["ag_descriptors_max"] <= 9 * 8 * (1 + 4 * 6) < 9 * 64 * 8


def test_padding_and_cast_geometry():
    shapes = [(5, 3), (1,), (9, 2, 2)]
    with tide.Plan(tide.Config(2, 2), shapes, ag_dtype="bf16", grad_dtype="fp32",
                   shard_dtype="fp32") as plan:
        s = plan.summary
        assert [tuple(g) for g in plan.params] == expected_geometry(shapes, 4, 2)
        elems = 2 * 3 + 1 * 1 + 3 * 4
        assert (s["shard_bytes"], s["grad_shard_bytes"], s["fp32_shard_bytes"]) == (
            2 * elems, 4 * elems, 4 * elems)
        # With a cast the receive stage holds M shards and nothing is resident (tide.h).
        assert plan.region("recv_stage").bytes >= 2 * s["shard_bytes"]
        assert plan.region("resident").bytes == 0


def test_plan_lane():
    # AUTO resolves to the rail lane exactly at L = 1, M >= 2 (docs/protocol.md); the arena
    # then has no receive stage (the generic one has (M - 1) S, none at M = 1).
    for (m, l), want in {(2, 1): "rail", (5, 1): "rail", (1, 2): "generic",
                         (2, 2): "generic", (1, 1): "generic"}.items():
        with tide.Plan(tide.Config(m, l), [(5, 3)]) as plan:
            assert plan.lane == want, (m, l)
            assert (plan.region("recv_stage").bytes == 0) == (want == "rail" or m == 1)
    with tide.Plan(tide.Config(4, 1, lane="generic"), [(5, 3)]) as plan:
        assert plan.lane == "generic"
    plan = tide.Plan(tide.Config(2, 1), [(5, 3)])
    plan.close()
    with pytest.raises(ValueError):
        plan.lane


def test_pack_shard_and_split_output():
    import numpy as np

    shapes = [(5, 3), (2,)]
    params = [np.arange(15, dtype=np.float32).reshape(5, 3), np.array([7.0, 8.0], np.float32)]
    with tide.Plan(tide.Config(1, 4), shapes, ag_dtype="fp32", grad_dtype="fp32") as plan:
        # R = (2, 1): rank 2 holds rows 4..5 of p0 (row 5 padding) and row 2 of p1 (padding).
        assert plan.pack_shard(params, 2).tolist() == [12, 13, 14, 0, 0, 0, 0]
        assert plan.pack_shard(params, 0).tolist() == [0, 1, 2, 3, 4, 5, 7]
        views = plan.split_output(np.arange(7, dtype=np.float32))
        assert views[0].shape == (2, 3) and views[1].tolist() == [[6.0]]


def test_plan_errors():
    with pytest.raises(tide.TideError) as err:
        tide.Plan(tide.Config(1, 2), [(3, 3)] * 257)
    assert err.value.code == tide.Result.UNSUPPORTED
    assert err.value.message and "UNSUPPORTED" in str(err.value)
    with tide.Plan(tide.Config(1, 2), [(3, 3)] * 256) as plan:
        assert plan.num_params == 256
    with pytest.raises(tide.TideError) as err:
        tide.Plan(tide.Config(1, 9), [(3, 3)])
    assert err.value.code == tide.Result.INVALID_ARGUMENT and err.value.message
    with pytest.raises(tide.TideError) as err:
        tide.Plan(tide.Config(2, 2), [(3, 3)], ag_dtype="fp16", grad_dtype="fp16")
    assert err.value.code == tide.Result.UNSUPPORTED
    with pytest.raises(tide.TideError) as err:
        tide.Plan(tide.Config(2, 2), [(3, 3)], ag_dtype="fp32", shard_dtype="bf16")
    assert err.value.code in (tide.Result.INVALID_ARGUMENT, tide.Result.UNSUPPORTED)
    with pytest.raises(ValueError):
        tide.Plan(tide.Config(2, 2), [(3, 0)])
    with pytest.raises(ValueError):
        tide.Plan(tide.Config(2, 2), [])
    with pytest.raises(ValueError):
        tide.Plan(tide.Config(2, 2), [(3, 3)], ag_dtype="int8")
    with pytest.raises(ValueError):
        tide.Plan((2, 2), [(3, 3)])
    plan = tide.Plan(tide.Config(2, 2), [(3, 3)])
    with pytest.raises(IndexError):
        plan.param(1)
    with pytest.raises(IndexError):
        plan.landing_offset(0, 4)
    with pytest.raises(ValueError):
        plan.region("lobby")
    plan.close()
    plan.close()
    with pytest.raises(ValueError):
        plan.summary


def test_tide_error_pickles():
    import pickle

    e = pickle.loads(pickle.dumps(tide.TideError(2, "why")))
    assert e.code == tide.Result.UNSUPPORTED and e.message == "why"


# ------------------------------------------------------------------------------- closed forms


def test_memory_bounds_paper_figures():
    b = tide.memory_bounds(64, 8, round_width=4, inbox_generations=2)
    assert b["in_place_staging_ns"] == pytest.approx(0.59375, abs=1e-12)
    assert b["slot_reuse_staging_ns"] == pytest.approx(0.1640625, abs=1e-12)
    assert b["in_place_total_ns"] == pytest.approx(3.71875, abs=1e-12)
    assert b["slot_reuse_total_ns"] == pytest.approx(2.2890625, abs=1e-12)
    assert b["fsdp2_total_ns"] == 4.0
    # As printed in §5.4: 0.594, 0.164, 3.72, 2.29.
    assert (round(b["in_place_staging_ns"], 3), round(b["slot_reuse_staging_ns"], 3),
            round(b["in_place_total_ns"], 2), round(b["slot_reuse_total_ns"], 2)) == (
        0.594, 0.164, 3.72, 2.29)


@pytest.mark.parametrize("m", [2, 3, 8, 9, 16, 64, 100])
def test_memory_bounds_eqs_11_12_at_l8(m):
    for k in (1, 2, 4):
        for n_par in (1, 2):
            b = tide.memory_bounds(m, 8, k, n_par)
            assert b["in_place_staging_ns"] == pytest.approx(0.5 + (2 * n_par + 2) / m)
            assert b["slot_reuse_staging_ns"] == pytest.approx((2 * k + 4 * n_par + 5) / (2 * m))


def test_memory_bounds_errors():
    with pytest.raises(tide.TideError) as err:
        tide.memory_bounds(64, 8, 0, 2)
    assert err.value.code == tide.Result.INVALID_ARGUMENT
    with pytest.raises(tide.TideError):
        tide.memory_bounds(64, 8, 4, 3)


def test_solve_paper_calibration():
    out = tide.solve(8, 8, fp32_shard_bytes=32 << 20, **tide.PAPER_CALIBRATION)
    # §6.3: "the solver selects k = 4 and four sum CTAs".
    assert out["round_width"] == 4 and out["sum_ctas"] == 4
    assert out["landing_ctas"] == 4  # floor(90 / 21) under the landing ceiling
    assert out["rounds"] == 2  # 7 remote contributors in one wave of 8, four per round
    assert out["t_nic_ms"] == pytest.approx(7 * (32 << 20) / 47.5e9 * 1e3, rel=1e-12)


@pytest.mark.parametrize("gpus,dtype", [(8, "bf16"), (8, "fp32"), (4, "bf16"), (2, "fp32")])
def test_solve_sum_ctas_eq13(gpus, dtype):
    """C_sum: the fewest CTAs whose rate covers 1.5 (L b / 4 + 1) BW_NIC."""
    cal = dict(tide.PAPER_CALIBRATION)
    out = tide.solve(4, gpus, fp32_shard_bytes=8 << 20, grad_dtype=dtype, **cal)
    b = 2 if dtype == "bf16" else 4
    need = 1.5 * (gpus * b / 4 + 1) * cal["bw_nic_gbps"]
    assert out["sum_ctas"] == math.ceil(need / cal["bw_sum_gbps"] - 1e-12)


@pytest.mark.parametrize("gpus,dtype", [(2, "bf16"), (4, "bf16"), (8, "bf16"), (8, "fp32"),
                                        (1, "bf16")])
def test_solve_one_node_link(gpus, dtype):
    """M = 1 with bw_link_gbps: C_sum keeps pace with the link, 1.5 (L b / 4 + 1) BW_link /
    (max(L - 1, 1) b / 4) of sum throughput; without it, eq. 13 as at M > 1."""
    cal = dict(tide.PAPER_CALIBRATION)
    out = tide.solve(1, gpus, fp32_shard_bytes=8 << 20, grad_dtype=dtype,
                     bw_link_gbps=tide.LINK_RATE_GBPS, **cal)
    b = 2 if dtype == "bf16" else 4
    need = 1.5 * (gpus * b / 4 + 1) * tide.LINK_RATE_GBPS / (max(gpus - 1, 1) * b / 4)
    assert out["sum_ctas"] == math.ceil(need / cal["bw_sum_gbps"] - 1e-12)
    if (gpus, dtype) == (8, "bf16"):
        assert out["sum_ctas"] == 10
    rail = tide.solve(1, gpus, fp32_shard_bytes=8 << 20, grad_dtype=dtype, **cal)
    assert rail["sum_ctas"] == math.ceil(1.5 * (gpus * b / 4 + 1) * cal["bw_nic_gbps"]
                                         / cal["bw_sum_gbps"] - 1e-12)
    with pytest.raises(tide.TideError):
        tide.solve(1, gpus, fp32_shard_bytes=8 << 20, bw_link_gbps=-5.0, **cal)


@pytest.mark.parametrize("gpus,dtype,want", [(2, "bf16", 33), (4, "bf16", 15), (8, "bf16", 10),
                                             (2, "fp32", 21), (4, "fp32", 12)])
def test_solve_default_calibration(gpus, dtype, want):
    """bw_sum_gbps 0 (DEFAULT_CALIBRATION): the library's rate per sum CTA for L sources, the
    paper's 99 at L = 8 scaled by the measured rate over L (bf16; fp32 keeps 99), the rate the
    planner's default C_sum at M = 1 uses (test_solver.c checks that default)."""
    assert tide.DEFAULT_CALIBRATION["bw_sum_gbps"] == 0
    out = tide.solve(1, gpus, fp32_shard_bytes=8 << 20, grad_dtype=dtype,
                     bw_link_gbps=tide.LINK_RATE_GBPS, **tide.DEFAULT_CALIBRATION)
    assert out["sum_ctas"] == want
    paper = tide.solve(1, gpus, fp32_shard_bytes=8 << 20, grad_dtype=dtype,
                       bw_link_gbps=tide.LINK_RATE_GBPS, **tide.PAPER_CALIBRATION)
    assert out["sum_ctas"] >= paper["sum_ctas"]  # the rate never exceeds the paper's


def test_solve_errors():
    with pytest.raises(tide.TideError) as err:
        tide.solve(8, 8, fp32_shard_bytes=1 << 20, **dict(tide.PAPER_CALIBRATION,
                                                          bw_nic_gbps=-1.0))
    assert err.value.code == tide.Result.INVALID_ARGUMENT
    with pytest.raises(ValueError):
        tide.solve(8, 8, fp32_shard_bytes=1 << 20, **dict(tide.PAPER_CALIBRATION,
                                                          bw_nic_gbps="fast"))


# ------------------------------------------------------------------------------- validation


def test_validate_schedule_paper_cases():
    ok = tide.validate_schedule(9, 8, wave_width=8, round_width=2)
    assert ok["accepted"] is True and ok["blocks_checked"] > 0
    bad = tide.validate_schedule(9, 8, wave_width=3, round_width=2)
    assert bad["accepted"] is False
    # The reported pair really collides: both contributors sit in the reported wave and
    # eq. (8), j(s, c) = (s - (c mod M)) mod L, sends both to the reported GPU.
    m, l, w = 9, 8, 3
    c0, c1 = bad["contributor0"], bad["contributor1"]
    assert c0 != c1
    for c in (c0, c1):
        assert 1 <= c <= m and (c - 1) // w == bad["wave"]
        assert (bad["subslice"] - c % m) % l == bad["gpu"]


def brute_force_collides(m, l, w):
    """Some wave of contributors 1..M (width W) holds c != c' with c = c' (mod M) mod L."""
    for first in range(1, m + 1, w):
        seen = set()
        for c in range(first, min(first + w, m + 1)):
            key = (c % m) % l
            if key in seen:
                return True
            seen.add(key)
    return False


def test_validate_schedule_matches_collision_definition():
    for l in (1, 2, 3, 4, 8):
        for m in range(1, 18):
            for w in range(1, l + 1):
                for mode in ("in-place", "slot-reuse"):
                    rep = tide.validate_schedule(m, l, w, mode=mode)
                    assert rep["accepted"] is not brute_force_collides(m, l, w), (m, l, w, mode)


def test_validate_schedule_errors():
    with pytest.raises(tide.TideError) as err:
        tide.validate_schedule(9, 8, wave_width=9)
    assert err.value.code == tide.Result.INVALID_ARGUMENT and "wave" in err.value.message
    with pytest.raises(ValueError):
        tide.validate_schedule(9, 8, mode="diagonal")
