"""A tiny Llama-style transformer for the tide.fsdp tests (embedding, RMSNorm, causal
attention with rotary embeddings, SwiGLU MLP, tied nothing), and its FSDP2 wrapping.

exact=True routes every parameter through _GridGrad, whose backward rounds the gradient to
multiples of 2^-12 within +-2^8: every sum of up to 16 such values is exact in fp32 in any
order, so stock FSDP2 and TIDE must produce the same bits whatever order each reduces in.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

GRID = 2.0 ** -12
GRID_MAX = 2.0 ** 8


class _GridGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):
        return w.view_as(w)

    @staticmethod
    def backward(ctx, g):
        return (torch.round(g / GRID) * GRID).clamp_(-GRID_MAX, GRID_MAX)


def _w(module, name):
    w = getattr(module, name)
    return _GridGrad.apply(w) if module.exact else w


class RMSNorm(nn.Module):
    def __init__(self, dim, exact):
        super().__init__()
        self.exact = exact
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y.to(x.dtype) * _w(self, "weight")


class Linear(nn.Module):
    def __init__(self, fan_in, fan_out, exact):
        super().__init__()
        self.exact = exact
        self.weight = nn.Parameter(torch.randn(fan_out, fan_in) * fan_in ** -0.5)

    def forward(self, x):
        return F.linear(x, _w(self, "weight"))


def _rotary(x, pos):
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32, device=x.device) / half))
    ang = pos[:, None].float() * freqs[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, dim, heads, hidden, exact):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim, exact)
        self.wq = Linear(dim, dim, exact)
        self.wk = Linear(dim, dim, exact)
        self.wv = Linear(dim, dim, exact)
        self.wo = Linear(dim, dim, exact)
        self.mlp_norm = RMSNorm(dim, exact)
        self.w1 = Linear(dim, hidden, exact)
        self.w3 = Linear(dim, hidden, exact)
        self.w2 = Linear(hidden, dim, exact)

    def forward(self, x):
        b, t, d = x.shape
        h = self.attn_norm(x)
        pos = torch.arange(t, device=x.device)
        q = self.wq(h).view(b, t, self.heads, -1).transpose(1, 2)
        k = self.wk(h).view(b, t, self.heads, -1).transpose(1, 2)
        v = self.wv(h).view(b, t, self.heads, -1).transpose(1, 2)
        q, k = _rotary(q, pos), _rotary(k, pos)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(att.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyLlama(nn.Module):
    # vocab 37 and hidden 44 are odd sizes on purpose: dim 0 of several parameters is not a
    # multiple of the world size, so padding rows are exercised.
    def __init__(self, vocab=37, dim=16, heads=2, hidden=44, layers=2, exact=False):
        super().__init__()
        self.exact = exact
        self.embed = nn.Parameter(torch.randn(vocab, dim))
        self.layers = nn.ModuleList(Block(dim, heads, hidden, exact) for _ in range(layers))
        self.norm = RMSNorm(dim, exact)
        self.head = Linear(dim, vocab, exact)

    def forward(self, tokens):
        x = F.embedding(tokens, _w(self, "embed"))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)).float()


def shard(model, mp=None, mesh=None, reshard_after_forward=True, compile=None):
    """The model wrapped with fully_shard per layer and at the root; returns it.  mp: None or
    (param_dtype, reduce_dtype); mesh: None (fully_shard's default mesh) or a DeviceMesh.
    compile: None, "before" (each block compiled, then fully_shard, as torchtitan does),
    "after" (fully_shard, then each block compiled) or "whole" (the whole model compiled
    after fully_shard)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw = {}
    if mesh is not None:
        kw["mesh"] = mesh
    if mp is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=mp[0], reduce_dtype=mp[1])
    if compile not in (None, "before", "after", "whole"):
        raise ValueError("compile: %r" % (compile,))
    if compile == "before":
        for layer in model.layers:
            layer.compile()
    for layer in model.layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kw)
    fully_shard(model, **kw)
    if compile == "after":
        for layer in model.layers:
            layer.compile()
    elif compile == "whole":
        model.compile()
    return model


def build(seed=0, exact=False, mp=None, reshard_after_forward=True, device=None, compile=None,
          **dims):
    """The model, seeded, wrapped by shard().  device: None (fully_shard's default mesh) or a
    device type ("cpu", "cuda") for a 1-D mesh over the default process group; the
    parameters are initialised on the CPU either way, so every device starts from the same
    bits."""
    torch.manual_seed(seed)
    model = TinyLlama(exact=exact, **dims)
    mesh = None
    if device is not None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    return shard(model, mp, mesh, reshard_after_forward, compile)


def batch(step, rank, micro=0, size=2, seq=8, vocab=37):
    g = torch.Generator().manual_seed(1000 * step + 97 * rank + 13 * micro + 1)
    tokens = torch.randint(0, vocab, (size, seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
