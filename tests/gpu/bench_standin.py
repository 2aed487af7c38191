"""bench_standin.py - tide-bench's GPU stand-in for the stock FSDP2 path, driven from Python.

tide-bench (C) cannot call PyTorch, so on the GPU its stock columns come from a stand-in
(tools/tide-bench/cuda_stock.cu): the all-gather as N cudaMemcpyAsync plus one
cudaMemcpy2DAsync per parameter, the reduce-scatter as a _chunk_cat-style fp32 pack kernel plus
a rank-order fp32 sum.  The same source is built as libtide_bench_stock.so; this module loads
it so that bench_torch_baseline.py times exactly that code beside PyTorch's own ops, on the
same buffers and in the same run, and reports how far apart they are.
"""
import ctypes

import torch

_vp, _ci, _u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64


class Standin:
    def __init__(self, path):
        self.lib = L = ctypes.CDLL(path)
        L.bench_cuda_gather_copy_out.argtypes = [ctypes.POINTER(_vp), _ci, _u64, _vp, _vp,
                                                 ctypes.POINTER(_u64), ctypes.POINTER(_u64),
                                                 _ci, _vp]
        L.bench_cuda_pack.argtypes = [_vp, _vp, _ci, _ci, _u64, _u64, _vp, _vp]
        L.bench_cuda_reduce.argtypes = [_vp, _ci, _u64, _u64, ctypes.c_float, _vp, _vp]
        for f in ("bench_cuda_gather_copy_out", "bench_cuda_pack", "bench_cuda_reduce"):
            getattr(L, f).restype = _ci

    @staticmethod
    def check(rc, what):
        if rc != 0:
            raise RuntimeError("%s failed: cudaError %d" % (what, rc))

    def paths(self, shapes, R, numel, off, shard, G, ag_flat, packs, alpha, stream):
        """The stand-in's AG and RS over the benchmark's buffers.  ag_flat [N, N E] bf16 and
        packs [N, N, E] fp32 are the torch stock path's own work buffers (the stand-in runs
        after it and rewrites them); the results land in new buffers so that each can be
        checked.  Every rank's unsharded parameters are the same bytes, so the ranks' AGs
        share one landing buffer (the same bytes moved, 6.5 GB less memory at divisor 2):
        after a call it holds the last rank's.  Returns (ag, rs, landing [N E] bf16, out [N, E] fp32)."""
        N, E = shard.shape
        P = len(shapes)
        dev = shard.device
        sh = _vp(stream.cuda_stream)
        landing = torch.empty_like(ag_flat[0])
        out = torch.empty((N, E), dtype=torch.float32, device=dev)
        shards = (_vp * N)(*[shard[u].data_ptr() for u in range(N)])
        seg_off = (_u64 * P)(*[2 * o for o in off])
        seg_bytes = (_u64 * P)(*[2 * n for n in numel])
        # Per rank u: its gradients' addresses and the pack geometry, on the device.
        d_grads = [torch.tensor([G[p][u].data_ptr() for p in range(P)], dtype=torch.int64,
                                device=dev) for u in range(N)]
        d_params = torch.tensor([[R[p], shapes[p][1], shapes[p][0], off[p]] for p in range(P)],
                                dtype=torch.int64, device=dev)
        d_packs = torch.tensor([packs[u].data_ptr() for u in range(N)], dtype=torch.int64,
                               device=dev)
        max_elems = max(R[p] * shapes[p][1] for p in range(P))
        L = self.lib

        def ag():
            for r in range(N):
                self.check(L.bench_cuda_gather_copy_out(shards, N, 2 * E, ag_flat[r].data_ptr(),
                                                        landing.data_ptr(), seg_off,
                                                        seg_bytes, P, sh), "stand-in AG")

        def rs():
            for u in range(N):
                self.check(L.bench_cuda_pack(d_grads[u].data_ptr(), d_params.data_ptr(), P, N,
                                             E, max_elems, packs[u].data_ptr(), sh),
                           "stand-in pack")
            for r in range(N):
                self.check(L.bench_cuda_reduce(d_packs.data_ptr(), N, r * E, E, alpha,
                                               out[r].data_ptr(), sh), "stand-in reduce")

        return ag, rs, landing, out
