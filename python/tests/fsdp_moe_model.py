"""A small Qwen3-MoE-style model for the tide.fsdp tests: rotary attention shared by every rank
(the dense part, sharded over the full mesh) and a routed mixture of SwiGLU experts per block
(top-2 of the local experts, gates renormalised as Qwen3-MoE's norm_topk_prob), the experts
sharded over an expert sub-mesh.

Expert parallelism without token dispatch: the world is split into expert groups of
`ep_size` ranks (world 4, ep_size 2: ranks {0, 1} and {2, 3}); each expert group holds its own
experts (initialised from its own seed), fully_shard over that group, and each rank routes its
tokens to its group's experts.  The collectives are those of expert-parallel FSDP2 (dense
groups on the full mesh, expert groups on 2-rank subgroups); the all-to-all token exchange of
a real MoE is left out, since it is not an FSDP2 collective.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import fsdp_model


class Experts(nn.Module):
    def __init__(self, n, dim, hidden, exact):
        super().__init__()
        self.exact = exact
        self.w1 = nn.Parameter(torch.randn(n, hidden, dim) * dim ** -0.5)
        self.w3 = nn.Parameter(torch.randn(n, hidden, dim) * dim ** -0.5)
        self.w2 = nn.Parameter(torch.randn(n, dim, hidden) * hidden ** -0.5)

    def forward(self, h, gates):
        # h: (tokens, dim); gates: (tokens, n), zero for experts a token is not routed to.
        w1, w3, w2 = (fsdp_model._w(self, k) for k in ("w1", "w3", "w2"))
        a = torch.einsum("td,ehd->teh", h, w1)
        b = torch.einsum("td,ehd->teh", h, w3)
        y = torch.einsum("teh,edh->ted", F.silu(a) * b, w2)
        return (y * gates[..., None]).sum(1)


class MoEBlock(fsdp_model.Block):
    def __init__(self, dim, heads, hidden, n_experts, exact):
        super().__init__(dim, heads, hidden, exact)
        del self.w1, self.w2, self.w3
        self.router = fsdp_model.Linear(dim, n_experts, exact)
        self.experts = Experts(n_experts, dim, hidden, exact)

    def forward(self, x):
        b, t, d = x.shape
        h = self.attn_norm(x)
        pos = torch.arange(t, device=x.device)
        q = self.wq(h).view(b, t, self.heads, -1).transpose(1, 2)
        k = self.wk(h).view(b, t, self.heads, -1).transpose(1, 2)
        v = self.wv(h).view(b, t, self.heads, -1).transpose(1, 2)
        q, k = fsdp_model._rotary(q, pos), fsdp_model._rotary(k, pos)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(att.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x).reshape(b * t, d)
        probs = F.softmax(self.router(h), dim=-1)
        top, idx = probs.topk(2, dim=-1)
        gates = torch.zeros_like(probs).scatter(-1, idx, top / top.sum(-1, keepdim=True))
        return x + self.experts(h, gates).view(b, t, d)


class TinyMoE(nn.Module):
    def __init__(self, vocab=37, dim=16, heads=2, hidden=12, layers=2, n_experts=3,
                 exact=False):
        super().__init__()
        self.exact = exact
        self.embed = nn.Parameter(torch.randn(vocab, dim))
        self.layers = nn.ModuleList(MoEBlock(dim, heads, hidden, n_experts, exact)
                                    for _ in range(layers))
        self.norm = fsdp_model.RMSNorm(dim, exact)
        self.head = fsdp_model.Linear(dim, vocab, exact)

    def forward(self, tokens):
        x = F.embedding(tokens, fsdp_model._w(self, "embed"))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)).float()


def build(rank, world, ep_size=2, seed=0, exact=False, mp=None, strided=False):
    """TinyMoE wrapped as expert-parallel FSDP2: experts fully_shard over the rank's expert
    group (a 2-D mesh's inner dimension: world 4, ranks {0, 1} and {2, 3}; strided: its outer
    dimension, ranks {0, 2} and {1, 3}, one rank per node of a job with two ranks per node),
    every block and the root over the full mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(seed)
    model = TinyMoE(exact=exact)
    group = rank % (world // ep_size) if strided else rank // ep_size
    g = torch.Generator().manual_seed(1000 + group)
    with torch.no_grad():
        for block in model.layers:
            for p in block.experts.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    world_mesh = init_device_mesh("cpu", (world,))
    if strided:
        ep_mesh = init_device_mesh("cpu", (ep_size, world // ep_size),
                                   mesh_dim_names=("efsdp", "ep"))["efsdp"]
    else:
        ep_mesh = init_device_mesh("cpu", (world // ep_size, ep_size),
                                   mesh_dim_names=("ep", "efsdp"))["efsdp"]
    kw = {}
    if mp is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=mp[0], reduce_dtype=mp[1])
    for block in model.layers:
        fully_shard(block.experts, mesh=ep_mesh, **kw)
        fully_shard(block, mesh=world_mesh, **kw)
    fully_shard(model, mesh=world_mesh, **kw)
    return model
