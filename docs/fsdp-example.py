"""Train a small model with FSDP2 and TIDE.

    torchrun --nproc-per-node 2 docs/fsdp-example.py     # one process per rank
    python3 docs/fsdp-example.py                          # the same, 2 CPU ranks spawned here

On CPU the ranks talk through gloo and TIDE's CPU fabric (POSIX shared memory); on GPUs
(device="cuda", backend "nccl") through the CUDA fabric.  The only TIDE line is
tide.fsdp.enable(), after fully_shard.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

import tide.fsdp


def train(rank, world, steps=10):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 32),
                          *[nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
                            for _ in range(2)],
                          nn.Linear(32, 64))
    for layer in model[1:3]:
        fully_shard(layer)
    fully_shard(model)
    tide.fsdp.enable(model, mode="in_place")        # or mode="slot_reuse"

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(rank)
    for step in range(steps):
        start = torch.randint(0, 64, (4, 1), generator=data)
        tokens = (start + torch.arange(9)) % 64     # learnable: next token = token + 1
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
    tide.fsdp.disable(model)                        # optional: back to stock FSDP2


def _spawned(rank, world, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    train(rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("gloo")
        train(dist.get_rank(), dist.get_world_size())
        dist.destroy_process_group()
    else:
        import tempfile

        import torch.multiprocessing as mp

        world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_spawned, args=(world, os.path.join(tmp, "store")), nprocs=world)
