"""Several process groups in one enable(): an expert-parallel MoE (fsdp_moe_model: Qwen3-MoE
style, routed experts + shared attention) at world 4, the dense groups on the full mesh and
the experts on 2-rank expert subgroups.  TIDE must serve every group with one communicator per
process group (the full one and the rank's expert group), bit-equal to stock FSDP2:
integer-exact gradients make every partial sum exact (fsdp_model), so the 4-rank sums of the
dense part match gloo's whatever the order; the expert sums have two terms.
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402
import fsdp_train  # noqa: E402

STEPS = 5
GROUPS = ["<root>", "layers.0", "layers.0.experts", "layers.1", "layers.1.experts"]


def _train(rank, world, tide_mode=None, tier=None, mp=None):
    import fsdp_moe_model
    import tide.fsdp

    mp_dtypes = fsdp_train.mp_dtypes(mp)
    model = fsdp_moe_model.build(rank, world, exact=True, mp=mp_dtypes)
    rec = tide.fsdp.enable(model, mode=tide_mode, tier=tier) if tide_mode else None
    out = fsdp_train.run_steps(model, rank, STEPS, rec)
    if rec is not None:
        out.update(comm_ranks=[comm.ranks for _pg, comm in rec.comms],
                   group_ranks={st.spec.name: st.param_group.mesh_info.shard_mesh_size
                                for st in rec.states})
        tide.fsdp.disable(model)
    return out


def _body(rank, world):
    stock = _train(rank, world)
    return [(cfg, stock, _train(rank, world, **cfg))
            for cfg in (dict(tide_mode="in_place"), dict(tide_mode="slot_reuse"),
                        dict(tide_mode="in_place", tier=0))]


def test_moe_expert_subgroups_world4(tmp_path):
    records = fsdp_harness.run(4, _body, tmp_path, timeout=540)
    for rank, rec in enumerate(records):
        assert rec["ok"], rec.get("traceback")
        for cfg, stock, tide in rec["result"]:
            where = "rank %d, %s" % (rank, cfg)
            tier = cfg.get("tier", 1)
            assert tide["fallbacks"] == [], where
            assert sorted(tide["groups"]) == sorted((g, tier) for g in GROUPS), where
            assert tide["comm_ranks"] == [4, 2], where  # one communicator per group
            for name, n in tide["group_ranks"].items():
                assert n == (2 if name.endswith("experts") else 4), (where, name)
            for name, calls in tide["calls"].items():
                assert calls["reduce_scatter"] == STEPS, (where, name, calls)
                assert calls.get("stock_reduce", 0) == 0, (where, name, calls)
            copies = tide["stock_copies"]
            assert copies["reduce_scatter_tensor"] == 0, (where, copies)
            assert copies["all_gather_into_tensor"] == 0, (where, copies)
            assert len(stock["params"]) == STEPS
            for step, (a, b) in enumerate(zip(stock["params"], tide["params"])):
                assert all(torch.equal(x, y) for x, y in zip(a, b)), (where, step)
            assert stock["losses"] == tide["losses"], where
        # The expert groups really differ between expert groups (not a replicated model).
    a, b = records[0]["result"][0][1], records[2]["result"][0][1]
    assert a["losses"] != b["losses"]
