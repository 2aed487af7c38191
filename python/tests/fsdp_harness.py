"""Multi-process runner for the tide.fsdp tests: one process per rank (spawned), gloo over a
FileStore, TIDE's CPU fabric over POSIX shared memory.

run(world, fn, tmp_path, **kwargs) spawns `world` processes that each call
fn(rank, world, **kwargs) after init_process_group; each rank's return value (or its
exception) is saved with torch.save.  A rank that fails does not take the others down: every
process is waited for (up to `timeout` seconds, then killed and reported as hung), so a test
can check what the surviving ranks saw.
"""

import glob
import multiprocessing
import os
import time
import traceback

import torch
import torch.distributed as dist


def _entry(rank, world, init_file, out_dir, fn, kwargs, env):
    os.environ.update(env)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    result_path = os.path.join(out_dir, "rank%d.pt" % rank)
    code = 0
    try:
        result = fn(rank, world, **kwargs)
        torch.save({"ok": True, "result": result}, result_path)
    except BaseException as exc:  # reported through the result file
        torch.save({"ok": False, "type": type(exc).__name__, "error": str(exc),
                    "traceback": traceback.format_exc()}, result_path)
        code = 1
    # No destroy_process_group: after a peer died it may wait on that peer.
    os._exit(code)


def run(world, fn, tmp_path, timeout=240, env=None, allow_failure=False, **kwargs):
    """The per-rank records {"ok", "result" | "type", "error", "traceback", "exitcode"}."""
    out_dir = str(tmp_path)
    init_file = os.path.join(out_dir, "store")
    env = dict(env or {})
    env.setdefault("OMP_NUM_THREADS", "1")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_entry, args=(r, world, init_file, out_dir, fn, kwargs, env))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    hung = []
    for r, p in enumerate(procs):
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            hung.append(r)
            p.kill()
            p.join()
    for p in procs:
        # A killed rank cannot unlink its shared-memory objects; the job names start with
        # rank 0's pid (tide.torch_binding.Comm.from_process_group).
        for path in glob.glob("/dev/shm/tide.tide-%d-*" % procs[0].pid):
            try:
                os.unlink(path)
            except OSError:
                pass
        break
    records = []
    for r, p in enumerate(procs):
        path = os.path.join(out_dir, "rank%d.pt" % r)
        rec = torch.load(path, weights_only=False) if os.path.exists(path) else {
            "ok": False, "type": "Died", "error": "no result", "traceback": ""}
        rec["exitcode"] = p.exitcode
        rec["hung"] = r in hung
        records.append(rec)
    if hung:
        raise AssertionError("ranks %s hung (killed after %d s)" % (hung, timeout))
    if not allow_failure:
        for r, rec in enumerate(records):
            if not rec["ok"]:
                raise AssertionError("rank %d failed: %s: %s\n%s" % (
                    r, rec["type"], rec["error"], rec["traceback"]))
    return records
