"""TIDE-AG and TIDE-RS over numpy arrays on the CPU fabric.

One process drives all N = M L ranks (tide_comm_init_all).  Every collective call -- group
registration, all-gather, reduce-scatter, deregistration -- must be made by all N ranks at
once, each from its own thread; World.run(fn) runs fn(rank) on N threads.  ctypes releases
the GIL for the duration of each foreign call, so the ranks really run concurrently.

Inputs are checked here before they reach C (dtype, shape, contiguity, sizes, overlap,
alpha), so a malformed argument raises ValueError on the calling rank instead of corrupting
memory; the C layer checks the sizes again (the checked collectives) and that the ranks agree.
Views returned by Group.landing / unsharded / resident alias the group's arena and keep it
alive: deregistering the group (or closing the world) while such a view exists raises
ValueError, and leaves the group registered, instead of freeing memory the view still reads.
"""

import ctypes
import math
import threading
import weakref

import ml_dtypes
import numpy as np

from . import _lib
from .plan import Config, Plan, _GroupSignature, _check_config, _int

_NUMPY_DTYPES = {_lib.DTYPE_BF16: np.dtype(ml_dtypes.bfloat16),
                 _lib.DTYPE_FP32: np.dtype(np.float32),
                 _lib.DTYPE_FP16: np.dtype(np.float16)}


def numpy_dtype(dtype):
    """numpy dtype of a TIDE dtype ("bf16" -> ml_dtypes.bfloat16, "fp32" -> float32)."""
    return _NUMPY_DTYPES[_lib.parse_dtype(dtype)]


def alpha_avg(ranks):
    """FSDP2's AVG folded into alpha: 1 / ranks (tide_alpha_avg)."""
    return float(_lib.require("tide_alpha_avg")(_int(ranks, "ranks", 1, 2**31 - 1)))


def alpha_divide(predivide, postdivide):
    """FSDP2's divide factors folded into alpha: 1 / (pre * post) (tide_alpha_divide).
    ValueError for a factor that is 0, NaN or infinite, or a scale that is not a normal fp32
    number."""
    pre, post = _number(predivide, "predivide"), _number(postdivide, "postdivide")
    alpha = float(_lib.require("tide_alpha_divide")(pre, post))
    if math.isnan(alpha):
        raise ValueError(_lib.last_error() or "alpha_divide(%r, %r): invalid factors"
                         % (predivide, postdivide))
    return alpha


def _number(x, what):
    try:
        return float(x)
    except (TypeError, ValueError):
        raise ValueError("%s: expected a number, got %r" % (what, x)) from None


def _check_alpha(alpha):
    """alpha as the fp32 the library receives; ValueError unless it is finite and normal
    (tide.h: NaN, +-Inf, 0 and subnormals are refused)."""
    a = _number(alpha, "alpha")
    with np.errstate(over="ignore", under="ignore"):
        f = np.float32(a)
    if not np.isfinite(f) or f == 0 or abs(f) < np.finfo(np.float32).tiny:
        what = ("NaN" if math.isnan(a) else
                "infinite" if math.isinf(a) else
                "beyond the fp32 range (it rounds to Inf)" if not np.isfinite(f) else
                "zero" if a == 0 else
                "subnormal or zero in fp32")
        raise ValueError("alpha = %r is %s; alpha must be a finite, normal fp32 number"
                         % (alpha, what))
    return float(f)


def _check_array(a, what, dtype, writable=False):
    if not isinstance(a, np.ndarray):
        raise ValueError("%s: expected a numpy array, got %s" % (what, type(a).__name__))
    if a.dtype != dtype:
        raise ValueError("%s: dtype %s, expected %s" % (what, a.dtype, dtype))
    if not a.flags.c_contiguous:
        raise ValueError("%s: array is not C-contiguous (use np.ascontiguousarray)" % what)
    if writable and not a.flags.writeable:
        raise ValueError("%s: array is read-only" % what)


def _check_slot(slot):
    slot = _int(slot, "slot")
    if slot not in (0, 1):
        raise ValueError("slot = %d: a group has landing slots 0 and 1" % slot)
    return slot


class World(_lib.Closeable):
    """N = nodes x gpus_per_node ranks of one process on the CPU fabric.

    world.register(config, shapes, ag_dtype="bf16", grad_dtype="bf16", shard_dtype=None)
    registers a group on every rank and returns the N per-rank Group objects; world.run(fn)
    runs fn(rank) on N threads and returns the N results (re-raising the first exception).
    Use as a context manager or call close().
    """

    def __init__(self, nodes, gpus_per_node):
        self._comms = []
        self._registrations = []
        self._closed = True
        i32 = (-2**31, 2**31 - 1)
        self.nodes = _int(nodes, "nodes", *i32)
        self.gpus_per_node = _int(gpus_per_node, "gpus_per_node", *i32)
        ranks = self.nodes * self.gpus_per_node
        if self.nodes < 1 or self.gpus_per_node < 1 or ranks > 4096:
            # The library checks its own limits; this only keeps the handle array and the
            # thread count sane before the call.
            raise ValueError("World(%d, %d): need nodes >= 1, gpus_per_node >= 1 and at most "
                             "4096 ranks in one process" % (self.nodes, self.gpus_per_node))
        comms = (ctypes.c_void_p * ranks)()
        _lib.call("tide_comm_init_all", _lib.FABRIC_CPU, self.nodes, self.gpus_per_node, comms)
        self._comms = [comms[r] for r in range(ranks)]
        self._closed = False
        _lib.track(self)

    @property
    def ranks(self):
        return self.nodes * self.gpus_per_node

    def _check_open(self):
        if self._closed:
            raise ValueError("world is closed")

    # ---------------------------------------------------------------- threads

    def run(self, fn, timeout=None):
        """Run fn(rank) on one thread per rank; return [fn(0), ..., fn(N-1)].  If any raised,
        re-raise the first exception (in time) after every thread has finished."""
        self._check_open()
        results = [None] * self.ranks
        errors = []
        lock = threading.Lock()

        def body(rank):
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # noqa: B036 - re-raised on the caller's thread
                with lock:
                    errors.append(exc)

        threads = [threading.Thread(target=body, args=(r,), name="tide-rank-%d" % r,
                                    daemon=True) for r in range(self.ranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        if any(t.is_alive() for t in threads):
            raise TimeoutError("World.run: a rank did not finish within %s s" % timeout)
        if errors:
            raise errors[0]
        return results

    # ---------------------------------------------------------------- groups

    def register(self, config, shapes, ag_dtype="bf16", grad_dtype="bf16", shard_dtype=None):
        """Register one group on every rank (collective); returns [Group(rank 0), ...]."""
        self._check_open()
        config = _check_config(config)
        if (config.nodes, config.gpus_per_node) != (self.nodes, self.gpus_per_node):
            raise ValueError("config is %dx%d, the world %dx%d" % (
                config.nodes, config.gpus_per_node, self.nodes, self.gpus_per_node))
        sig = _GroupSignature(shapes, ag_dtype, grad_dtype, shard_dtype)
        # Plan once on this thread first: a group the library refuses raises here, with its
        # reason, instead of on N threads.
        with Plan(config, sig.shapes, sig.ag_dtype, sig.grad_dtype, sig.shard_dtype):
            pass
        reg = _lib.require("tide_group_register")

        def one(rank):
            handle = ctypes.c_void_p()
            _lib.check(reg(self._comms[rank], ctypes.byref(config), ctypes.byref(sig.desc),
                           ctypes.byref(handle)))
            return handle.value

        handles = self.run(one)
        groups = [Group(self, r, h, config, sig) for r, h in enumerate(handles)]
        self._registrations.append(groups)
        return groups

    def deregister(self, groups):
        """Deregister the N groups of one registration (collective)."""
        self._check_open()
        groups = list(groups)
        if len(groups) != self.ranks or any(g.world is not self for g in groups):
            raise ValueError("deregister: expected the %d groups of one registration of this "
                             "world" % self.ranks)
        live = [g for g in groups if not g._closed]
        if not live:
            return
        if len(live) != self.ranks:
            raise ValueError("deregister: some ranks of this registration are already closed")
        # Views keep the arena alive: refuse before any rank starts the collective.
        busy = [g.rank for g in groups if not g._release_views()]
        if busy:
            raise ValueError("deregister: rank(s) %s still hold landing / unsharded / resident "
                             "views of the group's arena; delete them (or copy what you need) "
                             "first: deregistration frees that memory" % busy)
        try:
            self.run(lambda r: groups[r]._deregister())
        finally:
            self._registrations = [gs for gs in self._registrations
                                   if any(not g._closed for g in gs)]

    def close(self):
        """Deregister every live group, then release the communicators."""
        if self._closed:
            return
        error = None
        for groups in list(self._registrations):
            try:
                self.deregister(groups)
            except Exception as exc:  # keep releasing; report the first failure
                error = error or exc
        if any(not g._closed for gs in self._registrations for g in gs):
            # A group stays registered (views of it are alive): the communicators must stay
            # too.  The world remains open; close() again once the views are gone.
            raise error
        destroy = _lib.require("tide_comm_destroy")
        for comm in self._comms:
            res = destroy(comm)
            if res != _lib.Result.SUCCESS and error is None:
                error = _lib.TideError(res, _lib.last_error())
        self._comms = []
        self._closed = True
        if error is not None:
            raise error

    def _finalize(self):
        """What a finaliser may do (garbage collection, interpreter exit): no threads, no
        collective.  Groups still registered (close() was not called, or refused while an
        arena view was alive) cannot be deregistered, as that is collective: they and the
        communicators under them are left to the process's exit, with one warning.  Without
        any, the communicators are released (local)."""
        if getattr(self, "_closed", True):
            return
        live = sum(1 for gs in self._registrations if any(not g._closed for g in gs))
        if live:
            _lib.warn_once("world-open",
                           "tide.World %dx%d finalised with %d group registration(s) still "
                           "registered (close() was not called, or refused while an arena "
                           "view was alive): not deregistered, which is collective; the "
                           "process's exit releases them"
                           % (self.nodes, self.gpus_per_node, live))
            return
        destroy = _lib.require("tide_comm_destroy")
        for comm in self._comms:
            destroy(comm)
        self._comms = []
        self._closed = True

    def __del__(self):
        try:
            self._finalize()
        except Exception:
            pass

    def __repr__(self):
        return "<tide.World %dx%d%s>" % (self.nodes, self.gpus_per_node,
                                         " closed" if self._closed else "")


class Group:
    """One rank's handle of a registered group.  Every collective method must be called by
    all ranks of the world at once (from World.run)."""

    def __init__(self, world, rank, handle, config, sig):
        self.world = world
        self.rank = rank
        self._handle = handle
        self._closed = False
        self._mode = config.mode  # the group's reduce-scatter mode: given once, in Config
        self._views = {}  # region key -> the ctypes buffer every numpy view of it is based on
        plan_handle = ctypes.c_void_p()
        _lib.call("tide_group_plan", handle, ctypes.byref(plan_handle))
        self.plan = Plan._borrowed(plan_handle.value, config, sig, self)
        self.ag_dtype = numpy_dtype(sig.ag_dtype)
        self.grad_dtype = numpy_dtype(sig.grad_dtype)
        self.shard_dtype = numpy_dtype(sig.shard_dtype)
        params = self.plan.params
        self._shard_elems = sum(g.rows_per_rank * g.inner for g in params)
        summary = self.plan.summary
        self.shard_bytes = summary["shard_bytes"]
        self.group_bytes = summary["group_bytes"]
        self.out_elems = summary["fp32_shard_bytes"] // 4

    def _h(self):
        if self._closed:
            raise ValueError("group is deregistered")
        return self._handle

    def _deregister(self):
        handle = self._h()
        if not self._release_views():
            raise ValueError("deregister: rank %d still holds views of the group's arena"
                             % self.rank)
        _lib.call("tide_group_deregister", handle)
        self._closed = True

    def _region(self, key, ptr, nbytes, dtype):
        """A numpy view of the arena whose base chain ends at the group's ctypes buffer of the
        region, so that deregistration can tell (by a weak reference) whether views live."""
        buf = self._views.get(key)
        if buf is None:
            buf = (ctypes.c_char * nbytes).from_address(ptr)
            self._views[key] = buf
        return np.frombuffer(buf, dtype=dtype)

    def _release_views(self):
        """Drop the region buffers; False (keeping them) if a numpy view still uses one."""
        refs = {key: weakref.ref(buf) for key, buf in self._views.items()}
        self._views.clear()
        alive = {key: ref() for key, ref in refs.items() if ref() is not None}
        self._views.update(alive)
        return not alive

    @property
    def num_params(self):
        return self.plan.num_params

    # ---------------------------------------------------------------- arena views

    def landing(self, slot):
        """Landing slot `slot` as a 1-D array of N S / itemsize items of the ag dtype."""
        slot = _check_slot(slot)
        ptr = ctypes.c_void_p()
        _lib.call("tide_group_landing", self._h(), slot, ctypes.byref(ptr))
        return self._region(("landing", slot), ptr.value, self.group_bytes, self.ag_dtype)

    def unsharded(self, slot, p):
        """The (D_p, K_p) view of parameter p inside landing slot `slot` (starts at o_p N;
        the padding rows past D_p are left out)."""
        g = self.plan.param(p)
        item = self.ag_dtype.itemsize
        start = g.shard_offset * self.plan.ranks // item
        return self.landing(slot)[start:start + g.dim0 * g.inner].reshape(g.dim0, g.inner)

    def resident(self):
        """The resident shard region (S bytes of the ag dtype) for in-place shard adoption:
        fill it, then call all_gather(None, slot).  TideError UNSUPPORTED with a cast."""
        ptr = ctypes.c_void_p()
        _lib.call("tide_group_resident", self._h(), ctypes.byref(ptr))
        return self._region("resident", ptr.value, self.shard_bytes, self.ag_dtype)

    def new_output(self):
        """A zeroed fp32 reduce-scatter output of the right size."""
        return np.zeros(self.out_elems, dtype=np.float32)

    # ---------------------------------------------------------------- collectives

    def all_gather(self, shard, slot=0):
        """TIDE-AG (collective): land every rank's shard in slot `slot`; returns landing(slot).
        shard: this rank's packed shard, a 1-D C-contiguous array of sum_p R_p K_p items of
        the shard dtype (bf16, or fp32 masters when the group casts), or None to read the
        resident region."""
        slot = _check_slot(slot)
        h = self._h()
        if shard is None:
            ptr = None
        else:
            _check_array(shard, "shard", self.shard_dtype)
            if shard.ndim != 1 or shard.size != self._shard_elems:
                raise ValueError("shard: shape %s, expected (%d,) (the packed shard)"
                                 % (shard.shape, self._shard_elems))
            ptr = shard.ctypes.data
            for s in (0, 1):
                land = ctypes.c_void_p()
                _lib.call("tide_group_landing", h, s, ctypes.byref(land))
                if (ptr < land.value + self.group_bytes and
                        land.value < ptr + shard.size * shard.itemsize):
                    raise ValueError("shard overlaps landing slot %d of this group (a view of "
                                     "the destination cannot be its source); pass a copy" % s)
        nbytes = 0 if shard is None else shard.size * shard.itemsize
        _lib.call("tide_all_gather_checked", h, ptr, nbytes, slot, None)
        return self.landing(slot)

    def reduce_scatter(self, grads, out, alpha=1.0, accumulate=False, mode=None):
        """TIDE-RS (collective): out = (accumulate ? out : 0) + alpha sum_u G_p^(u)[my rows],
        in fp32; the padding rows past D_p are +0 after every call.  grads: P C-contiguous
        arrays of the grad dtype, each (D_p, K_p) or any shape (D_p, ...) whose trailing
        product is K_p (1-D of D_p K_p items also accepted); out: a 1-D C-contiguous
        writable float32 array of S_fp32 / 4 items; alpha: a finite, normal fp32 number.
        The mode is the group's (Config(mode=...)); `mode`, if given, must name it.
        Returns out."""
        h = self._h()
        if mode is not None and _lib.parse_mode(mode) != self._mode:
            raise ValueError("mode %r: the reduce-scatter mode is the group's, given once in "
                             "Config(mode=...); register a group with that mode instead"
                             % (mode,))
        alpha = _check_alpha(alpha)
        _check_array(out, "out", np.dtype(np.float32), writable=True)
        if out.ndim != 1 or out.size != self.out_elems:
            raise ValueError("out: shape %s, expected (%d,) (S_fp32 / 4)"
                             % (out.shape, self.out_elems))
        if isinstance(grads, np.ndarray) or not hasattr(grads, "__len__"):
            raise ValueError("grads: expected a list of %d arrays" % self.num_params)
        if len(grads) != self.num_params:
            raise ValueError("grads: %d arrays, expected %d" % (len(grads), self.num_params))
        ptrs = (ctypes.c_void_p * self.num_params)()
        lens = (ctypes.c_uint64 * self.num_params)()
        for p, (g, geo) in enumerate(zip(grads, self.plan.params)):
            what = "grads[%d]" % p
            _check_array(g, what, self.grad_dtype)
            ok = (g.size == geo.dim0 * geo.inner and
                  (g.ndim == 1 or (g.ndim >= 2 and g.shape[0] == geo.dim0)))
            if not ok:
                raise ValueError("%s: shape %s, expected (%d, %d)"
                                 % (what, g.shape, geo.dim0, geo.inner))
            if np.may_share_memory(g, out):
                raise ValueError("%s overlaps out" % what)
            ptrs[p] = g.ctypes.data
            lens[p] = g.size * g.itemsize
        out_ptr = ctypes.cast(out.ctypes.data, ctypes.POINTER(ctypes.c_float))
        _lib.call("tide_reduce_scatter_checked", h, ptrs, lens, self.num_params, out_ptr,
                  out.size * 4, alpha, 1 if accumulate else 0, None)
        return out

    def __repr__(self):
        return "<tide.Group rank %d of %d, %d params%s>" % (
            self.rank, self.plan.ranks, self.num_params, " deregistered" if self._closed else "")


__all__ = ["World", "Group", "Config", "numpy_dtype", "alpha_avg", "alpha_divide"]
