"""The two models examples/train.py trains: a Llama-style decoder and an MoE variant of it.

Both are plain torch modules with a `layers` ModuleList, so FSDP2 wraps them the usual way
(one `fully_shard` per layer, then the root). Replace them with your own model: train.py only
needs `model.layers`, `model(tokens) -> logits` and, optionally, `model.aux_loss()`.

- Llama: token embedding, pre-norm blocks of rotary causal self-attention (grouped-query when
  --kv-heads < --heads) and a SwiGLU MLP, final RMSNorm, output projection.
- MoE: the same blocks with the MLP replaced by --experts SwiGLU experts, a softmax router
  choosing --top-k experts per token, and a load-balancing loss (Switch Transformer style).
  Each expert is its own module (three weights), so a layer holds 3 * experts + 7 parameters;
  above 256 in one FSDP2 group TIDE leaves that group on stock FSDP2 (docs/fsdp.md), which
  `--experts 84` shows.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotary(x, base=10000.0):
    """Rotary position embedding over the last dim of x: (batch, heads, seq, head_dim)."""
    t, d = x.shape[-2], x.shape[-1]
    half = d // 2
    freqs = base ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    ang = torch.arange(t, dtype=torch.float32, device=x.device)[:, None] * freqs[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        if dim % heads or heads % kv_heads:
            raise ValueError("dim %d, heads %d, kv_heads %d: dim must be a multiple of heads "
                             "and heads of kv_heads" % (dim, heads, kv_heads))
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True,
                                             enable_gqa=self.kv_heads != self.heads)
        return self.wo(out.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """Top-k routed SwiGLU experts.  Every expert runs every step, on the tokens routed to it
    (possibly none): then every expert weight has a gradient on every rank, so all ranks hand
    FSDP2 the same set of gradients to reduce-scatter (a rank whose tokens skip an expert
    would otherwise reduce fewer tensors than its peers)."""

    def __init__(self, dim, hidden, experts, top_k):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError("top_k %d must be within 1..experts (%d)" % (top_k, experts))
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(dim, hidden) for _ in range(experts))
        self.aux = None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.router(x).float(), dim=-1)
        weight, chosen = probs.topk(self.top_k, dim=-1)
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            out.index_add_(0, token, expert(x[token]) * weight[token, slot, None])
        # Load balancing: fraction of routed tokens times mean router probability, per expert.
        frac = F.one_hot(chosen, len(self.experts)).float().sum((0, 1)) / chosen.numel()
        self.aux = len(self.experts) * (frac * probs.mean(0)).sum()
        return out.view(shape)


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden, experts=0, top_k=2):
        super().__init__()
        self.attn_norm = nn.RMSNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, kv_heads)
        self.mlp_norm = nn.RMSNorm(dim, eps=1e-6)
        self.mlp = MoE(dim, hidden, experts, top_k) if experts else SwiGLU(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, vocab, dim, layers, heads, kv_heads, hidden, experts=0, top_k=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, hidden, experts, top_k)
                                    for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)).float()

    def aux_loss(self):
        """Sum of the MoE layers' load-balancing losses of the last forward (0 for Llama)."""
        aux = [b.mlp.aux for b in self.layers if isinstance(b.mlp, MoE) and b.mlp.aux is not None]
        return sum(aux) if aux else None


def build(kind, vocab, dim, layers, heads, kv_heads, hidden, experts, top_k):
    """kind "llama" or "moe" (experts > 0).  Parameters are initialised by torch's defaults
    from the current RNG state: seed before calling for runs that must start alike."""
    if kind == "llama":
        return Decoder(vocab, dim, layers, heads, kv_heads, hidden)
    if kind == "moe":
        if experts < 1:
            raise ValueError("--model moe needs --experts >= 1")
        return Decoder(vocab, dim, layers, heads, kv_heads, hidden, experts, top_k)
    raise ValueError("unknown model %r (llama or moe)" % kind)


def synthetic_batch(step, rank, batch, seq, vocab, seed):
    """A synthetic batch the model can learn: each row counts from a random token with a random
    stride of 1, 2 or 3 (mod vocab), so every next token but the second follows from the two
    before it and the loss falls from about ln(vocab) within a few dozen steps.  Deterministic
    in (seed, step, rank): stock and TIDE runs see the same data.  Swap in your own data
    loader here."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    tokens = (start + stride * torch.arange(seq + 1)) % vocab
    return tokens[:, :-1], tokens[:, 1:]
