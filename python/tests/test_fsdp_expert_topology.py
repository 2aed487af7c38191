"""Each process group's topology from the global ranks it holds and the job's node layout
(tide/fsdp/_topology.py).

Multi-process: world 4 with LOCAL_WORLD_SIZE=2 (two "nodes" of two ranks) and the MoE model of
test_fsdp_moe.py, its experts sharded over an expert sub-mesh with one rank per node ({0, 2}
and {1, 3}): TIDE serves the expert groups on 2 x 1 with the rail lane the library selected
for them, and the dense groups on 2 x 2 with the generic programs, bit-equal to stock (the
integer-exact gradients of fsdp_model: the dense sums are exact in any order, the expert sums
have two terms).  The same job with the experts on {0, 1} and {2, 3} (one node each) gives
them 1 x 2.  A topology computed from a group's size alone (default_topology(2) with
LOCAL_WORLD_SIZE=2) would put the one-rank-per-node experts on 1 x 2 and the generic programs.

Pure Python: the topology function on 1 x 8, 4 x 1, 2 x 2 and the groups it refuses.
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402
import fsdp_train  # noqa: E402

from tide.fsdp import _topology  # noqa: E402

STEPS = 4
GROUPS = ["<root>", "layers.0", "layers.0.experts", "layers.1", "layers.1.experts"]


# ------------------------------------------------------------------ the topology function

def test_group_topology_from_global_ranks():
    g = _topology.group_topology
    assert g(range(8), 8) == ((1, 8), None)
    assert g([0, 8, 16, 24], 8) == ((4, 1), None)  # an expert group, one rank per node
    assert g([0, 1, 8, 9], 8) == ((2, 2), None)
    assert g([3, 5], 8) == ((1, 2), None)
    assert g(range(32), 8) == ((4, 8), None)
    assert g([0, 2], 2) == ((2, 1), None)
    assert g([1, 3], 2) == ((2, 1), None)
    # Nodes in any order, a node's ranks in any order: the group rank order still gives
    # rank = node m * L + local l.
    assert g([8, 9, 0, 1], 8) == ((2, 2), None)
    assert g([1, 0, 9, 8], 8) == ((2, 2), None)
    # The same sizes from the size alone would say otherwise: these differ only in layout.
    assert g([0, 1, 2, 3], 8)[0] == (1, 4)
    assert g([0, 8, 16, 24], 8)[0] == (4, 1)
    assert g([0, 1, 8, 9], 8)[0] == (2, 2)


@pytest.mark.parametrize("ranks,per_node,words", [
    ([0, 1, 8], 8, "no uniform M x L"),            # two ranks on node 0, one on node 1
    ([0, 1, 2, 8, 16, 17], 8, "no uniform M x L"),
    ([0, 8, 1, 9], 8, "interleave nodes"),         # not node-major
    ([0, 8, 16, 1], 8, "interleave nodes"),
    (list(range(16)), 16, "at most 8 per node"),   # L beyond TIDE_MAX_GPUS_PER_NODE
])
def test_group_topology_refuses(ranks, per_node, words):
    shape, why = _topology.group_topology(ranks, per_node)
    assert shape is None
    assert words in why, why


def test_job_ranks_per_node(monkeypatch):
    # The job's ranks per node: default_topology's, which _topology.topologies reads.
    from tide.torch_binding import default_topology

    def j(world, nodes=None, gpus_per_node=None, local_world_size=None):
        if local_world_size is not None:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world_size))
        return default_topology(world, nodes, gpus_per_node)[1]

    assert j(32, local_world_size=8) == 8
    assert j(4, local_world_size=2) == 2
    assert j(8, local_world_size=3) == 8   # $LOCAL_WORLD_SIZE that does not divide: ignored
    assert j(4, local_world_size=0) == 4   # one node of <= 8 ranks
    assert j(16, local_world_size=0) == 8
    assert j(32, nodes=4) == 8
    assert j(32, gpus_per_node=4) == 4
    assert j(4, nodes=2, gpus_per_node=2) == 2
    with pytest.raises(ValueError):
        j(32, nodes=3, gpus_per_node=8)
    with pytest.raises(ValueError):
        _topology.group_topology([0], 0)


# ------------------------------------------------------------------ an MoE job of two nodes

def _train(rank, world, strided, tide_mode=None, tier=None):
    import fsdp_moe_model
    import tide.fsdp

    model = fsdp_moe_model.build(rank, world, exact=True, strided=strided)
    rec = tide.fsdp.enable(model, mode=tide_mode, tier=tier) if tide_mode else None
    out = fsdp_train.run_steps(model, rank, STEPS, rec)
    if rec is not None:
        out.update(
            topologies=[(comm.nodes, comm.gpus_per_node) for _pg, comm in rec.comms],
            group_topology={st.spec.name: (st.group.plan.summary["nodes"],
                                           st.group.plan.summary["gpus_per_node"])
                            for st in rec.states},
            lanes={st.spec.name: st.group.plan.lane for st in rec.states})
        tide.fsdp.disable(model)
    return out


def _body(rank, world, strided):
    stock = _train(rank, world, strided)
    return [(cfg, stock, _train(rank, world, strided, **cfg))
            for cfg in (dict(tide_mode="in_place"), dict(tide_mode="slot_reuse"),
                        dict(tide_mode="in_place", tier=0))]


@pytest.mark.parametrize("strided", [True, False], ids=["rank_per_node", "one_node"])
def test_moe_expert_topology_two_nodes(strided, tmp_path):
    records = fsdp_harness.run(4, _body, tmp_path, timeout=540,
                               env={"LOCAL_WORLD_SIZE": "2"}, strided=strided)
    want_expert = ((2, 1), "rail") if strided else ((1, 2), "generic")
    for rank, rec in enumerate(records):
        for cfg, stock, tide in rec["result"]:
            where = "rank %d, %s" % (rank, cfg)
            assert tide["fallbacks"] == [], where
            assert sorted(tide["groups"]) == sorted((g, cfg.get("tier", 1)) for g in GROUPS)
            assert tide["topologies"] == [(2, 2), want_expert[0]], where
            for name in GROUPS:
                want = want_expert if name.endswith("experts") else ((2, 2), "generic")
                got = (tide["group_topology"][name], tide["lanes"][name])
                assert got == want, (where, name)
            for name, calls in tide["calls"].items():
                assert calls["reduce_scatter"] == STEPS, (where, name, calls)
                assert calls.get("stock_reduce", 0) == 0, (where, name, calls)
            assert tide["stock_copies"]["reduce_scatter_tensor"] == 0, where
            assert tide["stock_copies"]["all_gather_into_tensor"] == 0, where
            assert len(stock["params"]) == STEPS
            for step, (a, b) in enumerate(zip(stock["params"], tide["params"])):
                assert all(torch.equal(x, y) for x, y in zip(a, b)), (where, step)
            assert stock["losses"] == tide["losses"], where
    # The two expert groups hold different experts (not a replicated model).
    other = 1 if strided else 2
    assert records[0]["result"][0][1]["losses"] != records[other]["result"][0][1]["losses"]


# ------------------------------------------------------------------ a group with no M x L

class _Lines:
    """The tide.fsdp log lines of one process."""

    def __init__(self):
        import logging

        self.lines = []
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.lines.append(record.getMessage())
        self.logger = logging.getLogger("tide.fsdp")

    def __enter__(self):
        self.logger.addHandler(self.handler)
        return self.lines

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)


def _build_summed(rank, world):
    import fsdp_moe_model

    # Sums without a division by 6 (stock's x / 6 and TIDE's x * (1/6) round differently,
    # docs/fsdp.md), which AdamW turns into differences of ~1e-5 after two steps.
    model = fsdp_moe_model.build(rank, world, ep_size=3, exact=True)
    model.set_force_sum_reduction_for_comms(True)
    model.set_gradient_divide_factor(1.0)
    return model


def _body_uneven(rank, world):
    import tide.fsdp

    stock = fsdp_train.run_steps(_build_summed(rank, world), rank, 2)
    model = _build_summed(rank, world)
    with _Lines() as lines:
        rec = tide.fsdp.enable(model)
        out = fsdp_train.run_steps(model, rank, 2, rec)
    out["topologies"] = [(comm.nodes, comm.gpus_per_node) for _pg, comm in rec.comms]
    out["lines"] = [line for line in lines if "topology" in line]
    tide.fsdp.disable(model)
    return stock, out


def test_uneven_expert_groups_stay_on_stock(tmp_path):
    # World 6 on three nodes of two ranks, experts on {0, 1, 2} and {3, 4, 5}: two ranks on
    # one node and one on another, which no M x L expresses.  The dense groups run TIDE on
    # 3 x 2; the expert groups stay on stock FSDP2, said once per rank in the log and in
    # fallbacks, and the run still equals stock's up to rounding: at world 6 TIDE's
    # parameters differ from stock's in the last bits (~1e-8 after two steps), on 1 x 6,
    # 2 x 3 and 3 x 2 alike, also with forced sums and no division (not explained yet; the
    # bit-exact claims of docs/fsdp.md are for worlds 2, 4 and 8).
    records = fsdp_harness.run(6, _body_uneven, tmp_path, timeout=540,
                               env={"LOCAL_WORLD_SIZE": "2"})
    experts = ["layers.0.experts", "layers.1.experts"]
    for rank, rec in enumerate(records):
        stock, tide = rec["result"]
        where = "rank %d" % rank
        assert sorted(tide["groups"]) == sorted((g, 1) for g in GROUPS if g not in experts)
        assert [f[0] for f in tide["fallbacks"]] == experts, where
        for _name, why in tide["fallbacks"]:
            assert "no TIDE topology" in why and "no uniform M x L" in why, (where, why)
        assert tide["topologies"] == [(3, 2)], where
        assert len(tide["lines"]) == 1, (where, tide["lines"])
        assert all(name in tide["lines"][0] for name in experts), where
        for a, b in zip(stock["params"], tide["params"]):
            assert all(torch.allclose(x, y, rtol=0, atol=1e-6) for x, y in zip(a, b)), where
        assert stock["losses"] == pytest.approx(tide["losses"], rel=1e-6), where
