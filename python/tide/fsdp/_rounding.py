"""Where Tier 1 rounds a reduction to the reduce dtype the user's MixedPrecisionPolicy asked
for.

TIDE-RS sums in fp32 (widening bf16 exactly) and writes an fp32 output.  Stock FSDP2 with a
reduce dtype narrower than fp32 (reduce_dtype=torch.bfloat16, or reduce_dtype=None with bf16
gradients) instead
  1. casts wider gradients to the reduce dtype while packing them (_chunk_cat),
  2. reduce-scatters in the reduce dtype (gloo: each partial sum rounded to bf16), and
  3. casts the reduce output to the parameters' dtype afterwards.
By default (enable(reduce_in_fp32=False)) Tier 1 rounds where stock does: the gradients
before TIDE-RS when they are wider than the reduce dtype (1), and alpha * sum once, at the end
(2 and 3).  At world 2 the two agree bit for bit: a sum of two bf16 values is exact in fp32,
and the division by 2 (AVG, or the post divisor of the SUM path) is exact, so stock's
bf16(bf16(a + b) / 2) is bf16((a + b) / 2).  At larger world sizes stock rounds every partial
sum in gloo's order and TIDE rounds once: TIDE is the more accurate and not bit-equal.

enable(reduce_in_fp32=True) keeps the fp32 output (the reduction TIDE would do anyway, without
the rounding): more accurate than the policy asked for, and not stock's result.  Tier 0 hands
its output to FSDP2 in FSDP2's reduce-dtype buffer, so it always rounds at the end.
"""

import torch


def reduce_rounding(spec, reduce_dtype):
    """The dtype to round this group's reduction to, or None to keep fp32."""
    if getattr(spec, "reduce_in_fp32", False):
        return None
    if reduce_dtype in (None, torch.float32):
        return None
    return reduce_dtype


def round_grads(grads, dtype):
    """Copies of `grads` rounded to `dtype` and widened back, as stock's pack rounds them
    (one extra gradient-sized copy per parameter: the price of stock's numerics here)."""
    return [g.to(dtype).to(g.dtype) for g in grads]


__all__ = ["reduce_rounding", "round_grads"]
