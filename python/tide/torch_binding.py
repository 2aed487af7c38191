"""TIDE-AG and TIDE-RS over torch tensors, one process per rank.

This is the torch-first face of libtide, the layer tide.fsdp is built on:

- Comm: one rank's communicator (tide_comm_init_rank).  A CPU device selects the CPU fabric
  (POSIX shared memory between the rank processes); a CUDA device selects the CUDA fabric and
  every collective is enqueued on a CUDA stream (the given torch.cuda.Stream, else the
  current one).  Comm.from_process_group agrees the job name over a torch ProcessGroup;
  with fabric="nccl" (or TIDE_FABRIC=nccl) it runs on the NCCL fabric over the group's own
  NCCL communicator instead (Comm.from_nccl_comm, tide_comm_init_nccl_comm).
- TorchGroup: a registered parameter group.  Shapes come from torch shapes, dtypes are torch
  dtypes (torch.bfloat16, torch.float32).  all_gather / reduce_scatter take tensors;
  landing(slot) and param_storage(slot, p) are tensors that alias the group's arena.

Rules the binding enforces (ValueError before any C call): dtype, device, contiguity, sizes,
overlapping operands, slots 0/1.  Every arena view keeps its group object alive; close()
(collective, like registration) refuses while a view is alive, because deregistration
unmaps the arena and a live view would then point at freed memory.  No collective ever runs
from a finaliser: a group that is garbage-collected without close() leaks its arena and warns.
"""

import ctypes
import itertools
import os
import sys
import warnings
import weakref

import torch

from . import _lib
from .plan import Config, Plan, _GroupSignature, _check_config, _int

FABRIC_CUDA = 1
FABRIC_NCCL = 2
_FABRIC_NAMES = ("cpu", "cuda", "nccl")

_TORCH_TO_TIDE = {torch.bfloat16: _lib.DTYPE_BF16, torch.float32: _lib.DTYPE_FP32,
                  torch.float16: _lib.DTYPE_FP16}
_TIDE_TO_TORCH = {v: k for k, v in _TORCH_TO_TIDE.items()}

_bound = {}


def _prototype(name, argtypes):
    """The C function `name` with its prototype, bound once (here rather than in _lib, which
    stays the planner's and the thread binding's)."""
    fn = _bound.get(name)
    if fn is None:
        fn = _lib.require(name)
        fn.restype = ctypes.c_int
        fn.argtypes = argtypes
        _bound[name] = fn
    return fn


def _comm_init_rank():
    """tide_comm_init_rank(fabric, nodes, gpus_per_node, rank, name, comm_out)."""
    return _prototype("tide_comm_init_rank",
                      [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                       ctypes.POINTER(ctypes.c_void_p)])


def tide_dtype(dtype, what="dtype"):
    """tide_dtype_t of a torch dtype (or of anything _lib.parse_dtype takes)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_TO_TIDE:
            raise ValueError("%s: %s is not a TIDE dtype (bfloat16, float32)" % (what, dtype))
        return _TORCH_TO_TIDE[dtype]
    return _lib.parse_dtype(dtype, what)


def torch_dtype(dtype):
    """torch dtype of a TIDE dtype."""
    return _TIDE_TO_TORCH[tide_dtype(dtype)]


def _device(device):
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError("device %s: TIDE runs on cpu (CPU fabric) or cuda (CUDA fabric)"
                         % device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _span(t):
    """[begin, end) byte addresses of a contiguous tensor."""
    begin = t.data_ptr()
    return begin, begin + t.numel() * t.element_size()


def _overlap(a, b):
    (a0, a1), (b0, b1) = a, b
    return a0 < b1 and b0 < a1 and a0 != a1 and b0 != b1


def _comm_init_nccl_comm():
    """tide_comm_init_nccl_comm(nccl_comm, nodes, gpus_per_node, comm_out)."""
    return _prototype("tide_comm_init_nccl_comm",
                      [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                       ctypes.POINTER(ctypes.c_void_p)])


def _fabric_choice(fabric):
    """The fabric a caller asked for: the argument, else $TIDE_FABRIC, else None (the
    device decides: cpu -> CPU fabric, cuda -> one-process-per-rank CUDA fabric)."""
    if fabric is None:
        fabric = os.environ.get("TIDE_FABRIC") or None
    if fabric is None:
        return None
    if not isinstance(fabric, str) or fabric.lower() not in _FABRIC_NAMES:
        raise ValueError("fabric %r: expected one of %s (argument or TIDE_FABRIC)"
                         % (fabric, ", ".join(_FABRIC_NAMES)))
    return fabric.lower()


def _nccl_comm_ptr(group, device):
    """The raw ncclComm_t of a ProcessGroupNCCL on `device`, as an int.

    ProcessGroupNCCL creates its communicator lazily (at the first collective, unless
    init_process_group had a device_id) and looks it up by the *current* CUDA device, so
    the lookup runs under `device`, after one collective if it found none."""
    import torch.distributed as dist

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError("fabric nccl: the process group has no backend on %s (%s)"
                         % (device, e)) from None
    nccl_pg = getattr(dist, "ProcessGroupNCCL", None)
    if nccl_pg is None or not isinstance(backend, nccl_pg) or not hasattr(backend, "_comm_ptr"):
        raise ValueError("fabric nccl: the process group's backend on %s is %s, not a "
                         "ProcessGroupNCCL that exposes its communicator (_comm_ptr)"
                         % (device, type(backend).__name__))
    with torch.cuda.device(device):
        ptr = backend._comm_ptr()
        if not ptr:
            t = torch.zeros(1, device=device)
            dist.all_reduce(t, group=group)
            torch.cuda.synchronize(device)
            ptr = backend._comm_ptr()
    if not ptr:
        raise ValueError("fabric nccl: ProcessGroupNCCL has no communicator on %s even after "
                         "a collective" % device)
    return ptr


# ------------------------------------------------------------------------------- communicator

_job_counter = itertools.count()


class Comm:
    """One rank's TIDE communicator (one process per rank).

    Comm(nodes, gpus_per_node, rank, name, device="cpu"): every rank of the job calls it with
    the same name ([A-Za-z0-9_-], at most 64 characters) and its own rank.  Use
    Comm.from_process_group(pg) inside a torch.distributed job.
    """

    def __init__(self, nodes, gpus_per_node, rank, name, device="cpu"):
        self._setup(nodes, gpus_per_node, rank, device)
        self.fabric = _lib.FABRIC_CPU if self.device.type == "cpu" else FABRIC_CUDA
        if not isinstance(name, str):
            raise ValueError("name: expected a string, got %r" % (name,))
        self.name = name
        handle = ctypes.c_void_p()
        init = _comm_init_rank()
        if self.device.type == "cuda":
            # The CUDA fabric places this rank on the calling thread's current device.
            with torch.cuda.device(self.device):
                _lib.check(init(self.fabric, self.nodes, self.gpus_per_node, self.rank,
                                name.encode(), ctypes.byref(handle)))
        else:
            _lib.check(init(self.fabric, self.nodes, self.gpus_per_node, self.rank,
                            name.encode(), ctypes.byref(handle)))
        self._handle = handle.value
        _lib.track(self)

    def _setup(self, nodes, gpus_per_node, rank, device):
        self._handle = None
        self._groups = []
        # Groups registered and not yet deregistered, counted rather than found through the
        # weak references: at exit the garbage collector clears those before it runs the
        # groups' finalisers.
        self._registered = 0
        self.device = _device(device)
        i32 = (-2**31, 2**31 - 1)
        self.nodes = _int(nodes, "nodes", *i32)
        self.gpus_per_node = _int(gpus_per_node, "gpus_per_node", *i32)
        self.rank = _int(rank, "rank", *i32)

    @classmethod
    def from_nccl_comm(cls, nccl_comm, nodes, gpus_per_node, rank, device):
        """A communicator on the NCCL fabric from an existing ncclComm_t (an int address, as
        ProcessGroupNCCL._comm_ptr() returns) of nodes x gpus_per_node ranks; collective over
        it.  TIDE splits its own communicators from it and never issues work on it; close
        this communicator before the NCCL one is destroyed.  rank is this process's rank in
        it (the library takes the communicator's own, ncclCommUserRank; a different rank
        here is a ValueError), device its CUDA device."""
        self = cls.__new__(cls)
        self._setup(nodes, gpus_per_node, rank, device)
        if self.device.type != "cuda":
            raise ValueError("fabric nccl: device %s is not a CUDA device" % self.device)
        if not isinstance(nccl_comm, int) or nccl_comm <= 0:
            raise ValueError("nccl_comm: expected the communicator's address as a positive "
                             "int, got %r" % (nccl_comm,))
        self.fabric = FABRIC_NCCL
        self.name = "nccl-%x" % nccl_comm
        handle = ctypes.c_void_p()
        with torch.cuda.device(self.device):
            _lib.check(_comm_init_nccl_comm()(ctypes.c_void_p(nccl_comm), self.nodes,
                                              self.gpus_per_node, ctypes.byref(handle)))
        self._handle = handle.value
        _lib.track(self)
        got = ctypes.c_int()
        _lib.call("tide_comm_rank", self._handle, ctypes.byref(got))
        if got.value != self.rank:
            # Local: destroying a communicator without groups needs no other rank.
            self.close()
            raise ValueError("rank %d: the NCCL communicator says this process is rank %d"
                             % (self.rank, got.value))
        return self

    @classmethod
    def from_process_group(cls, group=None, nodes=None, gpus_per_node=None, device=None,
                           fabric=None):
        """A communicator over the ranks of a torch ProcessGroup (collective over it).  The
        topology defaults to one node of N ranks for N <= 8, else nodes of
        $LOCAL_WORLD_SIZE (or 8) ranks; rank 0 picks the job name and broadcasts it.

        device: where the group's tensors live.  A CUDA device selects the CUDA fabric (one
        process per rank, tide_comm_init_rank(TIDE_FABRIC_CUDA, ...); the ranks must share
        one host, as its bootstrap runs over abstract Unix sockets named after the job).
        None infers it: the current CUDA device when the group's backend is NCCL, else the
        CPU (a gloo group may still carry CUDA tensors: pass the device then).

        fabric: None (the device decides, as above), "cpu", "cuda" or "nccl"; None reads
        $TIDE_FABRIC.  "nccl" runs TIDE on the NCCL fabric over the group's own NCCL
        communicator (ProcessGroupNCCL._comm_ptr(), shared, never used for TIDE's traffic;
        docs/nccl-fabric.md); it needs a CUDA device and an NCCL group."""
        import torch.distributed as dist

        fabric = _fabric_choice(fabric)
        if device is None:
            device = _group_device(group)
        device = _device(device)
        if fabric is not None and (fabric == "cpu") != (device.type == "cpu"):
            raise ValueError("fabric %s cannot carry tensors on %s" % (fabric, device))
        world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        nodes, gpus_per_node = default_topology(world, nodes, gpus_per_node)
        if fabric == "nccl":
            return cls.from_nccl_comm(_nccl_comm_ptr(group, device), nodes, gpus_per_node,
                                      rank, device)
        obj = [None]
        if rank == 0:
            obj[0] = "tide-%d-%d-%d" % (os.getpid(), next(_job_counter),
                                        int.from_bytes(os.urandom(4), "little"))
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(obj, src=src, group=group)
        return cls(nodes, gpus_per_node, rank, obj[0], device=device)

    @property
    def ranks(self):
        return self.nodes * self.gpus_per_node

    def _h(self):
        if self._handle is None:
            raise ValueError("communicator is closed")
        return self._handle

    def register(self, shapes, ag_dtype, grad_dtype, shard_dtype=None, mode="in-place",
                 **tuning):
        """Register a group (collective over the communicator's ranks): shapes are torch
        shapes (torch.Size or tuples, dim 0 first), dtypes torch dtypes; shard_dtype
        float32 with ag_dtype bfloat16 plans the cast all-gather.  tuning: Config fields."""
        config = Config(self.nodes, self.gpus_per_node, mode=mode, **tuning)
        group = TorchGroup(self, config, shapes, ag_dtype, grad_dtype, shard_dtype)
        # Weak: a group dropped without close() must be collectable, so that its finaliser
        # can say so (it cannot deregister, which is collective).
        self._groups.append(weakref.ref(group))
        self._registered += 1
        return group

    def _live_groups(self):
        return [g for g in (ref() for ref in self._groups) if g is not None and not g.closed]

    def close(self):
        """Release the communicator; every group must be closed first."""
        live = self._live_groups()
        if live:
            raise ValueError("communicator: %d group(s) still registered; close them first"
                             % len(live))
        handle, self._handle = self._handle, None
        if handle is not None:
            _lib.call("tide_comm_destroy", handle)

    @property
    def closed(self):
        return self._handle is None

    def _finalize(self):
        """What a finaliser may do (garbage collection, interpreter exit): destroying a
        communicator is local, but it needs every group deregistered, which is collective.
        A communicator with live groups (not closed, or close() refused while an arena view
        was alive) is left to the process's exit, with one warning."""
        if getattr(self, "_handle", None) is None:
            return
        live = self._registered
        if live:
            _lib.warn_once("comm-open",
                           "tide communicator (rank %d) finalised with %d group(s) still "
                           "registered (close() was not called, or refused while an arena "
                           "view was alive): not deregistered, which is collective; the "
                           "process's exit releases them" % (self.rank, live))
            return
        self.close()

    def __del__(self):
        try:
            self._finalize()
        except Exception:
            pass

    def __repr__(self):
        return "<tide.torch_binding.Comm rank %d of %dx%d on %s (%s fabric)%s>" % (
            self.rank, self.nodes, self.gpus_per_node, self.device,
            _FABRIC_NAMES[self.fabric], " closed" if self.closed else "")


def _group_device(group):
    """The device a process group's collectives run on when none is named."""
    import torch.distributed as dist

    try:
        backend = str(dist.get_backend(group)).lower()
    except (RuntimeError, ValueError):
        backend = ""
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def default_topology(world, nodes=None, gpus_per_node=None):
    """(nodes, gpus_per_node) of a world of `world` ranks."""
    if nodes is None and gpus_per_node is None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        if 0 < local <= _lib.MAX_GPUS_PER_NODE and world % local == 0:
            gpus_per_node = local
        elif world <= _lib.MAX_GPUS_PER_NODE:
            gpus_per_node = world
        else:
            gpus_per_node = _lib.MAX_GPUS_PER_NODE
    if gpus_per_node is None:
        gpus_per_node = world // nodes
    if nodes is None:
        nodes = world // gpus_per_node
    if nodes * gpus_per_node != world:
        raise ValueError("topology %d x %d does not cover the %d ranks"
                         % (nodes, gpus_per_node, world))
    return nodes, gpus_per_node


# ------------------------------------------------------------------------------- arena views


def _arena_buffer(ptr, nbytes, owner):
    """A ctypes byte array over [ptr, ptr + nbytes) that keeps `owner` alive; tensors made
    from it (torch.frombuffer) hold it through their storage."""
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    buf._tide_owner = owner  # the view -> buffer -> group chain keeps the arena mapped
    return buf


class _CudaArenaView:
    """__cuda_array_interface__ of arena bytes on the CUDA fabric, holding the group."""

    def __init__(self, ptr, nbytes, owner):
        self._tide_owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "strides": None}


# ------------------------------------------------------------------------------- groups


class TorchGroup:
    """One rank's handle of a registered group; every collective method must be called by
    all ranks of the communicator, in the same order."""

    def __init__(self, comm, config, shapes, ag_dtype, grad_dtype, shard_dtype=None,
                 _registered=None):
        # _registered: (handle, ring_slot, name) of a group that register_set() registered on
        # a shared arena; the group is then not registered again here.
        self._handle = None
        self._buffers = []
        self._views = {}
        self.comm = comm
        self.device = comm.device
        config = _check_config(config)
        if not isinstance(shapes, (list, tuple)):
            raise ValueError("shapes: expected a list of torch shapes, got %r" % (shapes,))
        self.shapes = [tuple(int(d) for d in s) if hasattr(s, "__iter__") else (int(s),)
                       for s in shapes]
        sig = _GroupSignature(self.shapes, tide_dtype(ag_dtype, "ag_dtype"),
                              tide_dtype(grad_dtype, "grad_dtype"),
                              None if shard_dtype is None else tide_dtype(shard_dtype,
                                                                          "shard_dtype"))
        # Plan locally first: a group the library refuses (UNSUPPORTED: more than 256
        # parameters, fp16) raises here on every rank alike, before the collective.
        with Plan(config, sig.shapes, sig.ag_dtype, sig.grad_dtype, sig.shard_dtype):
            pass
        if _registered is None:
            handle = ctypes.c_void_p()
            _lib.call("tide_group_register", comm._h(), ctypes.byref(config),
                      ctypes.byref(sig.desc), ctypes.byref(handle))
            self._handle = handle.value
            self.ring_slot, self.name = None, None  # its own arena, landing slots 0 and 1
        else:
            self._handle, self.ring_slot, self.name = _registered
        self._sig = sig
        self.config = config
        plan_handle = ctypes.c_void_p()
        _lib.call("tide_group_plan", self._handle, ctypes.byref(plan_handle))
        self.plan = Plan._borrowed(plan_handle.value, config, sig, self)
        self.ag_dtype = torch_dtype(sig.ag_dtype)
        self.grad_dtype = torch_dtype(sig.grad_dtype)
        self.shard_dtype = torch_dtype(sig.shard_dtype)
        self.mode = _lib.mode_name(config.mode)
        self.params = self.plan.params
        summary = self.plan.summary
        self.ranks = summary["ranks"]
        self.rank = comm.rank
        self.group_bytes = summary["group_bytes"]
        self.shard_numel = sum(g.rows_per_rank * g.inner for g in self.params)
        self.out_numel = summary["fp32_shard_bytes"] // 4
        self._landing_ptr = {}

    # ---------------------------------------------------------------- the ring (docs/arena.md)

    def reshard(self):
        """The group's unsharded parameters in its ring slot are dead: the next group of the
        slot may all-gather into it.  No-op for a group registered alone."""
        _lib.call("tide_group_reshard", self._h())

    def slot_live(self):
        """Whether the group holds its ring slot (gathered and not yet resharded)."""
        live = ctypes.c_int()
        _lib.call("tide_group_slot_live", self._h(), ctypes.byref(live))
        return bool(live.value)

    def read_done_event(self):
        """cudaEvent_t (as an int) after which the group's last reduce-scatter no longer
        reads its gradients; None on the CPU fabric (the call returned after it)."""
        ev = ctypes.c_void_p()
        _lib.call("tide_group_read_done_event", self._h(), ctypes.byref(ev))
        return ev.value

    # ---------------------------------------------------------------- lifetime

    @property
    def _closed(self):  # Plan._borrowed checks its owner through this name
        return self._handle is None

    @property
    def closed(self):
        return self._handle is None

    def _h(self):
        if self._handle is None:
            raise ValueError("group is closed")
        return self._handle

    def live_views(self):
        """How many tensors made by landing() / param_storage() are still alive."""
        self._views.clear()
        # A buffer is referenced by self._buffers and by getrefcount's argument (indexing
        # keeps a loop variable from adding a third); anything beyond that is a tensor
        # storage (or a user's reference to the buffer).
        live = 0
        for i in range(len(self._buffers)):
            if sys.getrefcount(self._buffers[i]) > 2:
                live += 1
        return live

    def close(self):
        """Deregister (collective).  Raises ValueError, before the collective, while an arena
        view is alive on this rank: drop (or copy) every view first."""
        if self._handle is None:
            return
        live = self.live_views()
        if live:
            raise ValueError("group: %d arena view(s) are still alive on rank %d; release them "
                             "before close (the arena is unmapped on close)" % (live, self.rank))
        handle, self._handle = self._handle, None
        self._buffers = []
        _lib.call("tide_group_deregister", handle)
        self.comm._registered -= 1

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            # Deregistration is collective and cannot run from a finaliser.
            warnings.warn("tide TorchGroup garbage-collected without close(); its arena is "
                          "leaked until the process exits", ResourceWarning, stacklevel=1)

    # ---------------------------------------------------------------- arena views

    def _slot_ptr(self, slot):
        slot = _int(slot, "slot")
        if slot not in (0, 1):
            raise ValueError("slot = %d: a group has landing slots 0 and 1" % slot)
        if slot not in self._landing_ptr:
            ptr = ctypes.c_void_p()
            _lib.call("tide_group_landing", self._h(), slot, ctypes.byref(ptr))
            self._landing_ptr[slot] = ptr.value
        self._h()
        return slot, self._landing_ptr[slot]

    def _tensor(self, ptr, nbytes, dtype):
        if self.device.type == "cpu":
            buf = _arena_buffer(ptr, nbytes, self)
            self._buffers.append(buf)
            return torch.frombuffer(buf, dtype=torch.uint8).view(dtype)
        view = _CudaArenaView(ptr, nbytes, self)
        self._buffers.append(view)
        return torch.as_tensor(view, device=self.device).view(dtype)

    def landing(self, slot):
        """Landing slot `slot`: a 1-D tensor of N S / itemsize items of the ag dtype."""
        slot, ptr = self._slot_ptr(slot)
        return self._tensor(ptr, self.group_bytes, self.ag_dtype)

    def resident(self):
        """The resident shard region (tide_group_resident): a 1-D tensor of sum_p R_p K_p
        items of the shard dtype, parameter p at o_p.  A shard kept there is all-gathered
        with all_gather(None, slot): no copy-in.  TideError(UNSUPPORTED) for a casting group,
        which all-gathers from its fp32 shard."""
        ptr = ctypes.c_void_p()
        _lib.call("tide_group_resident", self._h(), ctypes.byref(ptr))
        itemsize = torch.empty(0, dtype=self.shard_dtype).element_size()
        return self._tensor(ptr.value, self.shard_numel * itemsize, self.shard_dtype)

    def param_storage(self, slot, p):
        """Parameter p's padded unsharded tensor in slot `slot`: a 1-D tensor of N R_p K_p
        items whose storage starts at its landing address o_p N (so that torch.as_strided
        with storage_offset 0, FSDP2's unsharded parameter, lands on it)."""
        slot, ptr = self._slot_ptr(slot)
        p = _int(p, "p")
        if not 0 <= p < len(self.params):
            raise IndexError("parameter %d outside [0, %d)" % (p, len(self.params)))
        g = self.params[p]
        nbytes = g.shard_bytes * self.ranks
        return self._tensor(ptr + g.shard_offset * self.ranks, nbytes, self.ag_dtype)

    # ---------------------------------------------------------------- checks

    def _check_tensor(self, t, what, dtype, numel=None):
        if not isinstance(t, torch.Tensor):
            raise ValueError("%s: expected a torch.Tensor, got %s" % (what, type(t).__name__))
        if t.dtype != dtype:
            raise ValueError("%s: dtype %s, expected %s" % (what, t.dtype, dtype))
        if t.device != self.device:
            raise ValueError("%s: on %s, the group is on %s" % (what, t.device, self.device))
        if not t.is_contiguous():
            raise ValueError("%s: not contiguous (use .contiguous())" % what)
        if numel is not None and t.numel() != numel:
            raise ValueError("%s: %d items, expected %d" % (what, t.numel(), numel))

    def _stream(self, stream):
        """The cudaStream_t to enqueue on (CUDA fabric), None on the CPU fabric."""
        if self.device.type == "cpu":
            if stream is not None:
                raise ValueError("stream: the CPU fabric takes no stream")
            return None
        if stream is None:
            stream = torch.cuda.current_stream(self.device)
        if not isinstance(stream, torch.cuda.Stream):
            raise ValueError("stream: expected a torch.cuda.Stream, got %r" % (stream,))
        if stream.device != self.device:
            raise ValueError("stream: on %s, the group is on %s" % (stream.device, self.device))
        return stream.cuda_stream

    # ---------------------------------------------------------------- collectives

    def all_gather(self, shard, slot=0, stream=None):
        """TIDE-AG (collective): land every rank's packed shard in slot `slot`.  shard: this
        rank's packed shard, a contiguous tensor of sum_p R_p K_p items of the shard dtype
        (parameter p at o_p), or None to read the resident region."""
        slot, landing_ptr = self._slot_ptr(slot)
        s = self._stream(stream)
        if shard is None:
            ptr, nbytes = None, 0
        else:
            self._check_tensor(shard, "shard", self.shard_dtype, self.shard_numel)
            if _overlap(_span(shard), (landing_ptr, landing_ptr + self.group_bytes)):
                raise ValueError("shard overlaps landing slot %d" % slot)
            ptr, nbytes = shard.data_ptr(), shard.numel() * shard.element_size()
        # The checked entry point: the library verifies the length too (tide.h).
        _lib.call("tide_all_gather_checked", self._h(), ptr, nbytes, slot, s)

    def reduce_scatter(self, grads, out, alpha=1.0, accumulate=False, mode=None,
                       stream=None):
        """TIDE-RS (collective): out = (accumulate ? out : 0) + alpha sum_u G_p^(u)[my rows],
        in fp32.  grads: P contiguous tensors of the grad dtype, D_p K_p items each; out: a
        contiguous float32 tensor of S_fp32 / 4 items that no gradient overlaps.  mode: None
        or the group's mode ("in-place" or "slot-reuse"): the mode is given once, at
        registration (tide_reduce_scatter_checked runs the group's mode)."""
        h = self._h()
        if mode is not None and _lib.parse_mode(mode) != self.config.mode:
            raise ValueError("mode %r: the reduce-scatter mode is the group's (%s), given once "
                             "at registration; register a group with that mode instead"
                             % (mode, self.mode))
        if isinstance(alpha, bool):
            raise ValueError("alpha: expected a number, got %r" % (alpha,))
        try:
            alpha = float(alpha)
        except (TypeError, ValueError):
            raise ValueError("alpha: expected a number, got %r" % (alpha,)) from None
        s = self._stream(stream)
        self._check_tensor(out, "out", torch.float32, self.out_numel)
        if isinstance(grads, torch.Tensor) or not hasattr(grads, "__len__"):
            raise ValueError("grads: expected a list of %d tensors" % len(self.params))
        if len(grads) != len(self.params):
            raise ValueError("grads: %d tensors, expected %d" % (len(grads), len(self.params)))
        out_span = _span(out)
        ptrs = (ctypes.c_void_p * len(self.params))()
        lens = (ctypes.c_uint64 * len(self.params))()
        for p, (g, geo) in enumerate(zip(grads, self.params)):
            what = "grads[%d]" % p
            self._check_tensor(g, what, self.grad_dtype, geo.dim0 * geo.inner)
            if g.dim() >= 2 and g.shape[0] != geo.dim0:
                raise ValueError("%s: shape %s, expected (%d, ...)" % (what, tuple(g.shape),
                                                                      geo.dim0))
            if _overlap(_span(g), out_span):
                raise ValueError("%s overlaps out" % what)
            ptrs[p] = g.data_ptr()
            lens[p] = g.numel() * g.element_size()
        out_ptr = ctypes.cast(ctypes.c_void_p(out.data_ptr()), ctypes.POINTER(ctypes.c_float))
        # The checked entry point: the library verifies every length too (tide.h).
        _lib.call("tide_reduce_scatter_checked", h, ptrs, lens, len(self.params), out_ptr,
                  out.numel() * 4, alpha, 1 if accumulate else 0, s)
        return out

    _CALLS = {"all_gather": _lib.CALL_ALL_GATHER, "reduce_scatter": _lib.CALL_REDUCE_SCATTER,
              "reduce_scatter_staged": _lib.CALL_REDUCE_SCATTER_STAGED}

    def capture_readiness(self, call, stream=None):
        """Whether `call` ("all_gather", "reduce_scatter", or "reduce_scatter_staged": the
        gradients staged in the group's own landing slot) made now on `stream` would be
        captured into the CUDA graph that stream is being captured into (one that begins now
        when it is not capturing): (blockers, reason), blockers 0 when it would, else
        _lib.CAPTURE_* bits and the first one's reason (tide_group_capture_readiness).  Runs
        nothing.  stream: as all_gather's (None: the device's current stream)."""
        if call not in self._CALLS:
            raise ValueError("call: expected one of %s, got %r" % (sorted(self._CALLS), call))
        out = _lib.CaptureReadinessStruct()
        _lib.call("tide_group_capture_readiness", self._h(), self._CALLS[call],
                  self._stream(stream), ctypes.byref(out))
        return out.blockers, out.reason.decode("utf-8", "replace")

    def __repr__(self):
        return "<tide.torch_binding.TorchGroup rank %d of %d, %d params, %s%s>" % (
            self.rank, self.ranks, len(self.params), self.mode,
            " closed" if self.closed else "")


__all__ = ["Comm", "TorchGroup", "default_topology", "tide_dtype", "torch_dtype"]


def _set_entries(specs, what):
    """tide_group_entry_t array for specs (see register_set), the ctypes objects it points
    to (keep them alive through the call) and each spec's (config, shapes, slot, name)."""
    specs = list(specs)
    if not specs:
        raise ValueError("%s: no groups" % what)
    keep = []
    entries = (_lib.GroupEntryStruct * len(specs))()
    prepared = []
    for i, spec in enumerate(specs):
        config = _check_config(spec["config"])
        shapes = [tuple(int(d) for d in s) if hasattr(s, "__iter__") else (int(s),)
                  for s in spec["shapes"]]
        shard = spec.get("shard_dtype")
        sig = _GroupSignature(shapes, tide_dtype(spec["ag_dtype"], "ag_dtype"),
                              tide_dtype(spec["grad_dtype"], "grad_dtype"),
                              None if shard is None else tide_dtype(shard, "shard_dtype"))
        slot = spec.get("ring_slot")
        slot = _lib.RING_OWN_SLOT if slot is None else _int(slot, "ring_slot")
        name = spec.get("name")
        name_b = None if name is None else str(name).encode("utf-8")
        keep.extend([config, sig, name_b])
        # Config subclasses ConfigStruct: a pointer cast keeps the entry's declared type.
        entries[i].config = ctypes.cast(ctypes.pointer(config), ctypes.POINTER(_lib.ConfigStruct))
        entries[i].group = ctypes.cast(ctypes.pointer(sig.desc), ctypes.POINTER(_lib.GroupDesc))
        entries[i].ring_slot = slot
        entries[i].name = name_b
        prepared.append((config, shapes, slot, name))
    return entries, keep, prepared


def arena_plan(specs):
    """The planner's figures for a set of groups on one arena (tide_arena_plan_create; pure,
    no communicator): a dict of tide_arena_summary_t's fields, region_bytes by region name,
    and "groups": per spec, its regions {name: (offset, bytes)} inside the arena.  Every
    spec's config must name the topology (nodes, gpus_per_node > 0)."""
    entries, keep, prepared = _set_entries(specs, "arena_plan")
    handle = ctypes.c_void_p()
    _lib.call("tide_arena_plan_create", len(prepared), entries, ctypes.byref(handle))
    try:
        s = _lib.ArenaSummaryStruct()
        _lib.call("tide_arena_plan_get_summary", handle, ctypes.byref(s))
        out = {name: getattr(s, name) for name, _ in s._fields_ if name != "region_bytes"}
        names = [_lib.lib().tide_region_name(k).decode() for k in range(_lib.REGION_COUNT)]
        out["region_bytes"] = {names[k]: s.region_bytes[k] for k in range(_lib.REGION_COUNT)}
        out["groups"] = []
        info = _lib.RegionInfoStruct()
        for i in range(len(prepared)):
            regions = {}
            for k in range(_lib.REGION_COUNT):
                _lib.call("tide_arena_plan_get_region", handle, i, k, ctypes.byref(info))
                regions[names[k]] = (info.offset, info.bytes)
            out["groups"].append(regions)
        return out
    finally:
        _lib.require("tide_arena_plan_destroy")(handle)
        del keep


def register_set(comm, specs):
    """Register a set of groups on one shared arena (collective; docs/arena.md).

    specs: a list of dicts with keys config, shapes, ag_dtype, grad_dtype, shard_dtype
    (optional), ring_slot (0, 1 or None for a landing of its own) and name (optional), in
    execution order.  Returns one TorchGroup per spec; landing(0) is the group's ring slot.
    Close every group to release the arena (it goes with the last one)."""
    specs = list(specs)
    entries, keep, prepared = _set_entries(specs, "register_set")
    handles = (ctypes.c_void_p * len(specs))()
    _lib.call("tide_groups_register", comm._h(), len(specs), entries, handles)
    del keep
    groups = []
    for i, (config, shapes, slot, name) in enumerate(prepared):
        spec = specs[i]
        groups.append(TorchGroup(comm, config, shapes, spec["ag_dtype"], spec["grad_dtype"],
                                 spec.get("shard_dtype"),
                                 _registered=(handles[i], None if slot < 0 else slot, name)))
        comm._groups.append(weakref.ref(groups[-1]))  # as Comm.register does
    return groups
