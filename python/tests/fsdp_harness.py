"""Multi-process runner for the tide.fsdp tests: one process per rank (spawned), gloo over a
FileStore, TIDE's CPU fabric over POSIX shared memory.

run(world, fn, tmp_path, **kwargs) spawns `world` processes that each call
fn(rank, world, **kwargs) after init_process_group and return a picklable result (saved with
torch.save); it returns the per-rank results, or raises with the failing rank's traceback.
"""

import os
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, init_file, out_dir, fn, kwargs):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    result_path = os.path.join(out_dir, "rank%d.pt" % rank)
    try:
        result = fn(rank, world, **kwargs)
        torch.save({"ok": True, "result": result}, result_path)
    except BaseException as exc:  # reported through the result file
        torch.save({"ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
                    "traceback": traceback.format_exc()}, result_path)
        raise
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def run(world, fn, tmp_path, expect_failure=False, **kwargs):
    out_dir = str(tmp_path)
    init_file = os.path.join(out_dir, "store")
    ctx = mp.start_processes(_entry, args=(world, init_file, out_dir, fn, kwargs),
                             nprocs=world, join=False, start_method="spawn")
    failed = None
    try:
        while not ctx.join():
            pass
    except mp.ProcessRaisedException as exc:
        failed = exc
    except mp.ProcessExitedException as exc:
        failed = exc
    results = []
    for rank in range(world):
        path = os.path.join(out_dir, "rank%d.pt" % rank)
        results.append(torch.load(path, weights_only=False) if os.path.exists(path) else None)
    if failed is not None and not expect_failure:
        raise AssertionError("a rank failed: %s" % failed)
    return results
