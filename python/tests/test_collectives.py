"""TIDE-AG and TIDE-RS through tide.World on the CPU fabric, against numpy references.

The references are written from the definitions (§2.1, §4.3): the landing slot is the
parameters padded to N R_p rows and concatenated in order; rank r's output rows are
rows [r R_p, (r+1) R_p) of alpha sum_u G_p^(u), zero past D_p.
"""

import os
import pathlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import tide

BF16 = np.dtype(ml_dtypes.bfloat16)
# (4, 1): one rank per node, served by the rail lane (docs/protocol.md).
TOPOLOGIES = [(2, 2), (1, 4), (3, 2), (4, 1)]
# Small shapes with padding: dim0 not divisible by N, and dim0 < N (ranks holding only padding).
SHAPES = [(5, 3), (7,), (2, 2, 2), (13, 6), (1, 9), (6, 4)]


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch):
    # A broken collective fails stop within seconds instead of the 10 s default.
    monkeypatch.setenv("TIDE_TIMEOUT_MS", os.environ.get("TIDE_TIMEOUT_MS", "5000"))


@pytest.fixture(params=TOPOLOGIES, ids=lambda t: "%dx%d" % t)
def world(request):
    with tide.World(*request.param) as w:
        yield w


def dims(shape):
    shape = tuple(shape) if isinstance(shape, tuple) else (shape,)
    return shape[0], int(np.prod(shape[1:], dtype=np.int64))


def rows_per_rank(shape, n):
    return -(-dims(shape)[0] // n)


def padded(a, shape, n):
    """Parameter a as (N R_p, K_p), zero rows past D_p."""
    d, k = dims(shape)
    out = np.zeros((n * rows_per_rank(shape, n), k), dtype=a.dtype)
    out[:d] = a.reshape(d, k)
    return out


def shard_of(params, shapes, rank, n, dtype):
    """Rank r's packed shard: rows [r R_p, (r+1) R_p) of each padded parameter, in order."""
    parts = []
    for a, shape in zip(params, shapes):
        r = rows_per_rank(shape, n)
        parts.append(padded(a, shape, n)[rank * r:(rank + 1) * r].reshape(-1))
    return np.ascontiguousarray(np.concatenate(parts).astype(dtype))


def rs_reference(grads, shapes, rank, n, alpha, base=None):
    """alpha sum_u G^(u) over the ranks u, rows of `rank`, in float64 (+ base); the padding
    rows past D_p are zero, accumulating or not."""
    parts, real = [], []
    for p, shape in enumerate(shapes):
        total = sum(grads[u][p].astype(np.float64) for u in range(n))
        r = rows_per_rank(shape, n)
        parts.append(alpha * padded(total, shape, n)[rank * r:(rank + 1) * r].reshape(-1))
        d, k = dims(shape)
        valid = max(0, min(r, d - rank * r))
        real.append(np.arange(r * k) < valid * k)
    ref = np.concatenate(parts)
    if base is not None:
        ref = np.where(np.concatenate(real), ref + base.astype(np.float64), 0.0)
    return ref


def random_params(rng, shapes, dtype, integer=False):
    out = []
    for shape in shapes:
        d, k = dims(shape)
        a = rng.integers(-8, 9, size=(d, k)) if integer else rng.standard_normal((d, k))
        out.append(a.astype(dtype).reshape(shape if isinstance(shape, tuple) else (shape,)))
    return out


def bits(a):
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


# ------------------------------------------------------------------------------- all-gather


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_all_gather_lands_concatenated_parameters(world, dtype):
    n = world.ranks
    np_dtype = tide.numpy_dtype(dtype)
    groups = world.register(tide.Config(world.nodes, world.gpus_per_node), SHAPES,
                            ag_dtype=dtype, grad_dtype=dtype)
    rng = np.random.default_rng(1)
    params = [random_params(rng, SHAPES, np_dtype), random_params(rng, SHAPES, np_dtype)]
    expect = [np.concatenate([padded(a, s, n).reshape(-1) for a, s in zip(ps, SHAPES)])
              for ps in params]
    item = np_dtype.itemsize
    assert groups[0].landing(0).shape == (groups[0].group_bytes // item,) == expect[0].shape

    for call in range(3):  # epochs > 0 reuse the stage and the counters
        for slot in (0, 1):
            ps = params[(slot + call) % 2]
            shards = [shard_of(ps, SHAPES, r, n, np_dtype) for r in range(n)]
            landings = world.run(lambda r: groups[r].all_gather(shards[r], slot).copy())
            for r in range(n):
                assert landings[r].dtype == np_dtype
                np.testing.assert_array_equal(bits(landings[r]), bits(expect[(slot + call) % 2]))
        # Each slot keeps its own call's data: slot 0 was not touched by the slot-1 call.
        for r in range(n):
            np.testing.assert_array_equal(bits(groups[r].landing(0)), bits(expect[call % 2]))
            for p, shape in enumerate(SHAPES):
                view = groups[r].unsharded(0, p)
                assert view.shape == dims(shape)
                np.testing.assert_array_equal(
                    bits(view), bits(params[call % 2][p].reshape(dims(shape))))


def test_all_gather_cast_and_resident():
    with tide.World(2, 2) as world:
        n = world.ranks
        rng = np.random.default_rng(2)
        masters = random_params(rng, SHAPES, np.float32)
        cast = world.register(tide.Config(2, 2), SHAPES, ag_dtype="bf16", grad_dtype="fp32",
                              shard_dtype="fp32")
        shards = [shard_of(masters, SHAPES, r, n, np.float32) for r in range(n)]
        out = world.run(lambda r: cast[r].all_gather(shards[r], 1).copy())
        expect = np.concatenate([padded(a, s, n).reshape(-1) for a, s in zip(masters, SHAPES)])
        for r in range(n):  # fp32 -> bf16 rounds to nearest even, as ml_dtypes does
            np.testing.assert_array_equal(bits(out[r]), bits(expect.astype(BF16)))
        with pytest.raises(tide.TideError) as err:
            cast[0].resident()
        assert err.value.code == tide.Result.UNSUPPORTED

        plain = world.register(tide.Config(2, 2), SHAPES)
        params = random_params(rng, SHAPES, BF16)
        for r in range(n):
            plain[r].resident()[:] = shard_of(params, SHAPES, r, n, BF16)
        out = world.run(lambda r: plain[r].all_gather(None, 0).copy())
        expect = np.concatenate([padded(a, s, n).reshape(-1) for a, s in zip(params, SHAPES)])
        for r in range(n):
            np.testing.assert_array_equal(bits(out[r]), bits(expect))
            np.testing.assert_array_equal(
                bits(plain[r].plan.pack_shard(params, r)), bits(plain[r].resident()))


# ------------------------------------------------------------------------------- reduce-scatter


def run_rs(world, groups, grads, alpha=1.0, accumulate=False, mode="in-place", base=None):
    def body(r):
        out = groups[r].new_output() if base is None else base[r].copy()
        res = groups[r].reduce_scatter(grads[r], out, alpha=alpha, accumulate=accumulate,
                                       mode=mode)
        assert res is out
        return out

    return world.run(body)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_reduce_scatter_matches_float64_reference(world, dtype):
    n = world.ranks
    np_dtype = tide.numpy_dtype(dtype)
    rng = np.random.default_rng(3)
    outs = {}
    for mode in ("in-place", "slot-reuse"):
        cfg = tide.Config(world.nodes, world.gpus_per_node, mode=mode)
        groups = world.register(cfg, SHAPES, ag_dtype=dtype, grad_dtype=dtype)
        if mode == "in-place":
            grads = [random_params(rng, SHAPES, np_dtype) for _ in range(n)]
        for alpha in (1.0, tide.alpha_avg(n)):
            got = run_rs(world, groups, grads, alpha=alpha, mode=mode)
            for r in range(n):
                ref = rs_reference(grads, SHAPES, r, n, alpha)
                tol = 1e-5 * max(1.0, np.abs(ref).max())
                assert np.abs(got[r].astype(np.float64) - ref).max() <= tol
            outs[(mode, alpha)] = got
        # Repeated calls of one plan are bitwise identical.
        again = run_rs(world, groups, grads, alpha=1.0, mode=mode)
        for r in range(n):
            np.testing.assert_array_equal(bits(again[r]), bits(outs[(mode, 1.0)][r]))
        world.deregister(groups)
    # In-Place and Slot-Reuse: same arithmetic, bitwise identical outputs.
    for alpha in (1.0, tide.alpha_avg(n)):
        for r in range(n):
            np.testing.assert_array_equal(bits(outs[("in-place", alpha)][r]),
                                          bits(outs[("slot-reuse", alpha)][r]))


def test_reduce_scatter_integers_exact_accumulate_alpha(world):
    n = world.ranks
    rng = np.random.default_rng(4)
    grads = [random_params(rng, SHAPES, BF16, integer=True) for _ in range(n)]
    base = None
    for mode in ("in-place", "slot-reuse"):
        # The mode is the group's: one registration per mode.
        groups = world.register(tide.Config(world.nodes, world.gpus_per_node, mode=mode),
                                SHAPES)
        if base is None:
            base = [rng.integers(-50, 51, size=groups[r].out_elems).astype(np.float32)
                    for r in range(n)]
        got = run_rs(world, groups, grads, mode=mode)
        scaled = run_rs(world, groups, grads, alpha=0.25, mode=mode)
        acc = run_rs(world, groups, grads, alpha=-2.0, accumulate=True, mode=mode, base=base)
        # accumulate=False overwrites whatever out held, the padding rows included.
        over = run_rs(world, groups, grads, mode=mode, base=base)
        for r in range(n):
            np.testing.assert_array_equal(got[r], rs_reference(grads, SHAPES, r, n, 1.0))
            np.testing.assert_array_equal(scaled[r], rs_reference(grads, SHAPES, r, n, 0.25))
            np.testing.assert_array_equal(acc[r],
                                          rs_reference(grads, SHAPES, r, n, -2.0, base[r]))
            np.testing.assert_array_equal(over[r], got[r])
            # The output's padding rows (past D_p) are +0, accumulating or not.
            for out in (got[r], acc[r]):
                for p, view in enumerate(groups[r].plan.split_output(out)):
                    d = dims(SHAPES[p])[0]
                    rows = rows_per_rank(SHAPES[p], n)
                    valid = max(0, min(rows, d - r * rows))
                    assert not bits(np.ascontiguousarray(view[valid:])).any()
        world.deregister(groups)


# ------------------------------------------------------------------------------- bad inputs


def test_bad_inputs_raise_before_c():
    with tide.World(1, 2) as world:
        groups = world.register(tide.Config(1, 2), SHAPES)
        g = groups[0]
        shard = np.zeros(g._shard_elems, dtype=BF16)
        grads = [np.zeros(dims(s), dtype=BF16) for s in SHAPES]
        out = g.new_output()
        with pytest.raises(ValueError, match="dtype"):
            g.all_gather(shard.astype(np.float32), 0)
        with pytest.raises(ValueError, match="shape"):
            g.all_gather(shard[:-1].copy(), 0)
        with pytest.raises(ValueError, match="shape"):
            g.all_gather(shard.reshape(1, -1), 0)
        with pytest.raises(ValueError, match="contiguous"):
            g.all_gather(np.zeros(2 * shard.size, dtype=BF16)[::2], 0)
        with pytest.raises(ValueError, match="slot"):
            g.all_gather(shard, 2)
        with pytest.raises(ValueError, match="numpy"):
            g.all_gather(list(shard), 0)
        with pytest.raises(ValueError, match="expected 6"):
            g.reduce_scatter(grads[:-1], out)
        with pytest.raises(ValueError, match="dtype"):
            g.reduce_scatter([grads[0].astype(np.float32)] + grads[1:], out)
        with pytest.raises(ValueError, match="shape"):
            g.reduce_scatter([grads[0].reshape(3, 5)] + grads[1:], out)
        with pytest.raises(ValueError, match="contiguous"):
            g.reduce_scatter([np.zeros((5, 6), dtype=BF16)[:, ::2]] + grads[1:], out)
        with pytest.raises(ValueError, match="dtype"):
            g.reduce_scatter(grads, out.astype(np.float64))
        with pytest.raises(ValueError, match="shape"):
            g.reduce_scatter(grads, out[:-1])
        ro = out.copy()
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            g.reduce_scatter(grads, ro)
        alias = np.zeros(out.size, dtype=np.float32)
        with pytest.raises(ValueError, match="overlaps"):
            g.reduce_scatter([alias.view(BF16)[:15].reshape(5, 3)] + grads[1:], alias)
        with pytest.raises(ValueError, match="mode"):
            g.reduce_scatter(grads, out, mode="sideways")
        with pytest.raises(ValueError, match="alpha"):
            g.reduce_scatter(grads, out, alpha="one")
        with pytest.raises(IndexError):
            g.unsharded(0, 6)
        with pytest.raises(ValueError, match="config"):
            world.register(tide.Config(2, 1), SHAPES)
        with pytest.raises(tide.TideError) as err:
            world.register(tide.Config(1, 2), [(3, 3)] * 257)
        assert err.value.code == tide.Result.UNSUPPORTED and err.value.message
        with pytest.raises(tide.TideError) as err:
            world.register(tide.Config(1, 2, wave_width=3), SHAPES)
        assert err.value.code == tide.Result.INVALID_ARGUMENT
        # The group still works after the refused calls.
        outs = world.run(lambda r: groups[r].reduce_scatter(
            [np.ones(dims(s), dtype=BF16) for s in SHAPES], groups[r].new_output()))
        assert outs[0][0] == 2.0
        world.deregister(groups)
        with pytest.raises(ValueError, match="deregistered"):
            g.landing(0)
        with pytest.raises(ValueError, match="closed"):
            g.plan.summary
    with pytest.raises(ValueError, match="closed"):
        world.run(lambda r: None)
    with pytest.raises(tide.TideError) as err:
        tide.World(1, 9)
    assert err.value.code == tide.Result.INVALID_ARGUMENT
    with pytest.raises(ValueError):
        tide.World(0, 2)


def test_world_run_reraises_first_exception():
    with tide.World(1, 3) as world:
        assert world.run(lambda r: r * r) == [0, 1, 4]

        def fail(r):
            if r == 1:
                raise KeyError("rank 1")
            return r

        with pytest.raises(KeyError, match="rank 1"):
            world.run(fail)


def test_library_loading_error_is_clear(tmp_path, monkeypatch):
    import subprocess
    import sys

    env = dict(os.environ, TIDE_LIBRARY=str(tmp_path / "missing.so"))
    code = "import tide\ntry:\n    tide.version()\nexcept OSError as e:\n    print(e)\n"
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(tide.__file__)))
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=pkg, capture_output=True,
                         text=True, timeout=60)
    assert "TIDE_LIBRARY" in res.stdout and "missing.so" in res.stdout


# ------------------------------------------------------------------------------- misuse


def test_views_keep_the_arena_alive():
    # In a child interpreter: a regression would segfault, which must fail this test only.
    script = """
import numpy as np, tide
w = tide.World(1, 2)
groups = w.register(tide.Config(1, 2), [(5, 3), 4])
view = groups[0].landing(0)
part = groups[1].unsharded(1, 0)
for close in (w.close, lambda: w.deregister(groups)):
    try:
        close()
    except ValueError as exc:
        assert "views" in str(exc), exc
    else:
        raise SystemExit("close() with live views did not raise")
view[:] = 1          # still mapped: the arena stayed alive
assert part.sum() == 0
del view, part
w.close()
assert groups[0]._closed
try:
    groups[0].landing(0)
except ValueError:
    pass
else:
    raise SystemExit("landing() after close did not raise")
print("ok")
"""
    env = dict(os.environ, TIDE_DEBUG="NONE")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=str(pathlib.Path(__file__).resolve().parents[1]),
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", (res.returncode, res.stdout,
                                                                res.stderr)


def test_alpha_refused():
    with tide.World(1, 1) as world:
        g = world.register(tide.Config(1, 1), SHAPES)[0]
        grads = [np.ones(dims(s), dtype=BF16) for s in SHAPES]
        out = g.new_output()
        for alpha in (float("nan"), float("inf"), -float("inf"), 1e40, 0.0, -0.0, 1e-40):
            with pytest.raises(ValueError, match="finite, normal fp32"):
                g.reduce_scatter(grads, out, alpha=alpha)
        g.reduce_scatter(grads, out, alpha=-0.5)
        assert out[0] == -0.5
    for pre, post in ((0, 4), (float("inf"), 1), (1e30, 1e30)):
        with pytest.raises(ValueError, match="alpha_divide"):
            tide.alpha_divide(pre, post)
    assert tide.alpha_divide(2, 4) == 0.125


def test_shard_overlapping_its_landing_refused():
    with tide.World(1, 1) as world:
        g = world.register(tide.Config(1, 1), SHAPES)[0]
        land = g.landing(0)
        with pytest.raises(ValueError, match="overlaps landing slot 0"):
            g.all_gather(land[:g._shard_elems], 0)
        del land


def test_mode_given_once():
    with tide.World(1, 1) as world:
        g = world.register(tide.Config(1, 1, mode="slot-reuse"), SHAPES)[0]
        grads = [np.ones(dims(s), dtype=BF16) for s in SHAPES]
        with pytest.raises(ValueError, match="Config"):
            g.reduce_scatter(grads, g.new_output(), mode="in-place")
        g.reduce_scatter(grads, g.new_output(), mode="slot-reuse")
        g.reduce_scatter(grads, g.new_output())


@pytest.mark.parametrize("what", ["slot", "alpha"])
def test_ranks_that_disagree_are_refused(what):
    with tide.World(1, 2) as world:
        groups = world.register(tide.Config(1, 2), SHAPES)
        grads = [np.ones(dims(s), dtype=BF16) for s in SHAPES]

        def body(r):
            g = groups[r]
            try:
                if what == "slot":
                    g.all_gather(np.zeros(g._shard_elems, dtype=BF16), r)
                else:
                    g.reduce_scatter(grads, g.new_output(), alpha=1.0 + r)
            except tide.TideError as exc:
                return str(exc)
            return None

        msgs = world.run(body)
        for m in msgs:
            assert m is not None and "disagree" in m, msgs


_EXIT_WORLD = """
import time
import tide
worlds = []
for _ in range(2):
    w = tide.World(1, 2)
    groups = w.register(tide.Config(1, 2), [(8, 4), (3,)])
    view = groups[0].landing(0)
    try:
        w.close()  # refused: a view of the arena is alive
    except ValueError:
        pass
    worlds.append((w, groups, view))
print("exiting at %.6f" % time.monotonic(), flush=True)
"""


def test_open_world_at_exit_finalised_without_collectives(exit_script):
    """A World left open (close() refused while a view was alive) does not keep its process
    from exiting: its finaliser starts no thread and runs no collective, and says so once."""
    proc = exit_script(_EXIT_WORLD)
    assert proc.stderr.count("tide.World 1x2 finalised with 1 group registration") == 1, \
        proc.stderr
