"""Run PyTorch's own FSDP2 test classes (multi-process FSDPTest cases) on the CPU with gloo,
and record, per test and rank, whether TIDE served the FSDP2 groups.

    python3 tests/torch_upstream/run_cpu.py --out OUT.json TEST_FILE CLASS [CLASS...]

TIDE is switched on, or not, from outside, by the documented switch (docs/fsdp.md):
PYTHONPATH=python/tide/fsdp/sitecustomize:python TIDE_FSDP=in_place.  This script changes
nothing in TIDE and nothing in the tests.  It changes one thing in torch 2.11's test
helpers, and only on a CPU-only machine: FSDPTest._run skips every case unless
torch.accelerator.device_count() >= world_size, which is never true without an accelerator
(0 devices), although the test classes size themselves for the CPU ("if device_type.type ==
'cpu': return min_world_size") and their cases carry skip_if_lt_x_gpu(..., allow_cpu=True).
FSDPTestMultiThread already guards the same check with DEVICE_TYPE != "cpu"; here the
multi-process gate gets that guard too, by answering that one call (the first
torch.accelerator.device_count() of each rank's _run) with the world size.  Nothing else in
the rank sees a changed device count.

This module's top level runs in the parent and again in every rank, which multiprocessing's
spawn start method starts by re-importing the main script, so the gate and the TIDE
recorder are in place before a rank unpickles its FSDPTest._run.

Opt-in, off unless asked: --gpu-gates N (or TIDE_UPSTREAM_GPU_GATES=N) answers the
GPU-count gates written into a test file as a machine of N accelerators would, for files
whose classes are not written for the CPU (test_fully_shard_state_dict.py): a case under
skip_if_lt_x_gpu(x) without allow_cpu runs when x <= N (skips otherwise, as it does now),
and an FSDPTest class that sizes itself by the device count
(min(8, torch.get_device_module(device_type).device_count()), which is 1 for the CPU
module) sees N devices while its world_size is read.  Nothing else sees N, and the test
bodies run as shipped: a body that needs CUDA still fails (docs/torch-upstream-tests.md
says which, and why the others are device-agnostic).
"""

import argparse
import importlib
import json
import logging
import os
import subprocess
import sys
import time
import traceback
import unittest

import torch  # noqa: F401  (the helpers below need it imported)
from torch.testing._internal import common_distributed, common_fsdp

STATS_ENV = "TIDE_UPSTREAM_STATS_DIR"
GATES_ENV = "TIDE_UPSTREAM_GPU_GATES"


# ------------------------------------------------------------------ rank side


def _rank_here():
    """The rank of the caller: its process's, or its thread's in the threaded process groups
    of FSDPTestMultiThread (several ranks in one process); None before init."""
    import torch.distributed as dist

    try:
        return dist.get_rank() if dist.is_initialized() else None
    except Exception:  # a thread without a rank (the unittest driver thread)
        return None


class _TideLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []  # (rank, line)

    def emit(self, record):
        self.records.append((_rank_here(), "%s %s" % (record.levelname, record.getMessage())))


# (fqn, tier, calls dict, rank) of every TIDE group registered in this process: one rank's
# (FSDPTest: a process per rank), or every rank's (FSDPTestMultiThread: a thread per rank).
_GROUPS = []
_LOG = _TideLog()


def _record_tide():
    """Count what TIDE did in this rank: every Tier 1 / Tier 0 group registered (its
    `calls` counters: TIDE all-gathers, TIDE reduce-scatters, reductions left to stock) and
    every line tide.fsdp logged (fallbacks name their reason there)."""
    if not os.environ.get("TIDE_FSDP"):
        return False
    import tide.fsdp  # noqa: F401  (the switch; sitecustomize imported it already)
    from tide.fsdp import _tier0, _tier1

    logger = logging.getLogger("tide.fsdp")
    logger.addHandler(_LOG)
    logger.setLevel(logging.DEBUG)
    for cls in (_tier1.Tier1Group, _tier0.Tier0Group):
        init = cls.__init__
        if getattr(init, "_upstream_recorder", False):
            continue

        def recording_init(self, *args, _init=init, **kwargs):
            _init(self, *args, **kwargs)
            _GROUPS.append((self.spec.name, self.tier, self.calls, _rank_here()))

        recording_init._upstream_recorder = True
        cls.__init__ = recording_init
    return True


def _write_stats(test_name, rank, outcome, groups=None, log=None):
    """Write one rank's TIDE record of one test: `groups` and `log` default to everything
    this process recorded (a rank process); a threaded test passes its rank's share."""
    where = os.environ.get(STATS_ENV)
    if not where:
        return
    tide_on = bool(os.environ.get("TIDE_FSDP"))
    groups = _GROUPS if groups is None else groups
    log = [line for _r, line in _LOG.records] if log is None else log
    totals = {"groups": len(groups), "tier1_groups": 0, "tier0_groups": 0,
              "tide_all_gathers": 0, "tide_reduce_scatters": 0, "stock_reduces": 0,
              "stock_all_gathers": 0}
    for _name, tier, calls, _rank in groups:
        totals["tier1_groups" if tier == 1 else "tier0_groups"] += 1
        totals["tide_all_gathers"] += calls.get("all_gather", 0)
        totals["tide_reduce_scatters"] += calls.get("reduce_scatter", 0)
        totals["stock_reduces"] += calls.get("stock_reduce", 0)
        totals["stock_all_gathers"] += calls.get("stock_all_gather", 0)
    stats = {"test": test_name, "rank": rank, "tide_switch": tide_on, "outcome": outcome,
             "totals": totals, "groups": [[n, t, dict(c)] for n, t, c, _r in groups],
             "tide_log": log}
    path = os.path.join(where, "%s.rank%d.json" % (test_name, rank))
    with open(path, "w") as f:
        json.dump(stats, f, indent=1)


def _open_cpu_gate():
    """FSDPTest._run on a CPU-only machine: answer the accelerator-count gate with the
    world size (one call, then the real function again), and write TIDE's counters when
    the rank ends (also when it exits through sys.exit, as a failing or skipped rank does)."""
    cls = common_fsdp.FSDPTest
    original = cls.__dict__["_run"].__func__
    if getattr(original, "_upstream_gate", False):
        return

    def _run(klass, rank, test_name, file_name, pipe, **kwargs):
        if _gpu_gates():
            _size_as_if(klass, _gpu_gates())
        accel = torch.accelerator
        real = accel.device_count
        if common_fsdp.DEVICE_TYPE == "cpu":
            def gate_once():
                accel.device_count = real
                return max(real(), 1 << 20)

            accel.device_count = gate_once
        outcome = "returned"
        try:
            original(klass, rank, test_name, file_name, pipe, **kwargs)
        except SystemExit as exc:
            outcome = "exit %s" % (exc.code,)
            raise
        finally:
            accel.device_count = real
            _write_stats(test_name, rank, outcome)

    _run._upstream_gate = True
    cls._run = classmethod(_run)


def _gpu_gates():
    """N of the --gpu-gates opt-in (0: off).  Only on a CPU-only machine: where torch sees
    an accelerator, its own gates answer."""
    n = os.environ.get(GATES_ENV, "")
    if not n or common_fsdp.DEVICE_TYPE != "cpu":
        return 0
    if not n.isdigit() or int(n) < 1:
        raise SystemExit("%s=%r: expected a device count >= 1" % (GATES_ENV, n))
    return int(n)


def _open_skip_gate(n):
    """skip_if_lt_x_gpu(x) is bound when the test module is imported (its wrapper keeps x
    and allow_cpu), so this replaces it before that import: a case runs when x <= n, as on
    a machine of n accelerators, and skips as before when x > n.  allow_cpu=True cases are
    unchanged."""
    original = common_distributed.skip_if_lt_x_gpu
    if getattr(original, "_upstream_gate", False):
        return

    def skip_if_lt_x_gpu(x, *, allow_cpu=False):
        return original(x, allow_cpu=allow_cpu or x <= n)

    skip_if_lt_x_gpu._upstream_gate = True
    common_distributed.skip_if_lt_x_gpu = skip_if_lt_x_gpu


def _size_as_if(klass, n):
    """An FSDPTest class's world_size, read as on a machine of n devices: the CPU device
    module answers n to device_count() while the property runs, and 1 (its real answer)
    to everyone else.  Classes that size themselves for the CPU do not ask, and keep their
    size."""
    if not isinstance(klass, type) or not issubclass(klass, common_fsdp.FSDPTest):
        return
    prop = klass.__dict__.get("world_size")
    if not isinstance(prop, property) or getattr(prop.fget, "_upstream_gate", False):
        return
    module = torch.get_device_module("cpu")

    def world_size(self, _get=prop.fget):
        real = module.device_count
        module.device_count = lambda: n
        try:
            return _get(self)
        finally:
            module.device_count = real

    world_size._upstream_gate = True
    klass.world_size = property(world_size)


_open_cpu_gate()
_record_tide()
if _gpu_gates():
    _open_skip_gate(_gpu_gates())


# ------------------------------------------------------------------ parent side


def _write_thread_ranks(test, groups_from, log_from):
    """FSDPTestMultiThread runs its ranks as threads of this process: split what they
    registered and logged during `test` by rank and write one record per rank, as a rank
    process of FSDPTest does."""
    groups, log = _GROUPS[groups_from:], _LOG.records[log_from:]
    name = test.id().split(".")[-1]
    for rank in range(test.world_size):
        _write_stats(name, rank, "thread", [g for g in groups if g[3] == rank],
                     [line for r, line in log if r == rank])


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []
        self._t0 = {}

    def startTest(self, test):
        self._t0[test.id()] = time.time()
        self._marks = (len(_GROUPS), len(_LOG.records))
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        if isinstance(test, common_fsdp.FSDPTestMultiThread):
            _write_thread_ranks(test, *self._marks)

    def _add(self, test, status, detail=""):
        self.cases.append({"id": test.id(), "status": status, "detail": detail,
                           "seconds": round(time.time() - self._t0.get(test.id(), time.time()),
                                            1)})

    def addSuccess(self, test):
        super().addSuccess(test)
        self._add(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._add(test, "failed", self._exc_info_to_string(err, test)[-4000:])

    def addError(self, test, err):
        super().addError(test, err)
        self._add(test, "error", self._exc_info_to_string(err, test)[-4000:])

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._add(test, "skipped", reason)


def _tide_per_test(stats_dir, test_name):
    ranks = []
    for fn in sorted(os.listdir(stats_dir)):
        if fn.startswith(test_name + ".rank") and fn.endswith(".json"):
            with open(os.path.join(stats_dir, fn)) as f:
                ranks.append(json.load(f))
    return ranks


# What tide.fsdp's fallback lines say: a group or root left on stock at enable, a call
# of a TIDE group run on stock, unshards of a TIDE group on stock memory.
_FALLBACK_MARKS = ("stays on stock", "stock FSDP2 for this call", "on stock FSDP2 memory")


def _engagement(ranks, status):
    """How TIDE took part in one test:
    'off'         the switch was not set;
    'skipped'     the test did not run;
    'served'      every rank registered TIDE groups and ran TIDE all-gathers and
                  reduce-scatters through them, none of their calls on stock;
    'served-fwd'  the same for a test without a backward: TIDE all-gathers, no
                  reduce-scatter asked of any TIDE group (none ran on stock either);
    'mixed'       served, but some calls of TIDE groups ran on stock FSDP2;
    'fell back'   no rank registered a TIDE group, and tide.fsdp logged why;
    'no groups'   no rank registered a TIDE group and nothing was refused (a model
                  without parameters);
    'partial'     some ranks registered TIDE groups and others did not, or a rank's
                  groups ran no TIDE all-gather."""
    if not os.environ.get("TIDE_FSDP"):
        return "off"
    if status == "skipped":
        return "skipped"
    if not ranks or not any(r["totals"]["groups"] for r in ranks):
        refused = any("stays on stock" in line for r in ranks for line in r["tide_log"])
        return "fell back" if refused else "no groups"
    t = [r["totals"] for r in ranks]
    if not all(x["groups"] > 0 and x["tide_all_gathers"] > 0 for x in t):
        return "partial"
    if any(x.get("stock_reduces", 0) or x.get("stock_all_gathers", 0) for x in t):
        return "mixed"  # TIDE groups, but some of their calls ran on stock FSDP2
    if all(x["tide_reduce_scatters"] > 0 for x in t):
        return "served"
    if not any(x["tide_reduce_scatters"] for x in t):
        return "served-fwd"
    return "partial"


def _flatten(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _flatten(item)
        else:
            yield item


def _run_apart(test, test_file, stats_dir, label):
    """Run one FSDPTestMultiThread test in a process of its own and return its case record.
    In torch 2.11 every threaded test ends with an exception in its rank threads
    (destroy_process_group: 'ThreadLocalWorld' object has no attribute 'comms'), and the
    next threaded test in the same process may then crash it (a segmentation fault seen on
    stock FSDP2): one process per test keeps one test's teardown from failing another."""
    cls_test = "%s.%s" % (type(test).__name__, test._testMethodName)
    part = os.path.join(stats_dir, "apart-%s.json" % test._testMethodName)
    t0 = time.time()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--in-process",
                           "--label", label, "--out", part, test_file, cls_test])
    if os.path.exists(part):
        with open(part) as f:
            return json.load(f)["cases"]
    return [{"id": test.id(), "status": "error", "tide": "n/a", "ranks_reporting": 0,
             "seconds": round(time.time() - t0, 1),
             "detail": "the test's process ended with status %d before writing its record"
                       % proc.returncode}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("test_file")
    ap.add_argument("classes", nargs="+", help="test classes (or Class.test_name)")
    ap.add_argument("--out", required=True, help="JSON summary to write")
    ap.add_argument("--label", default="")
    ap.add_argument("--in-process", action="store_true",
                    help="run FSDPTestMultiThread tests in this process too (see _run_apart)")
    ap.add_argument("--gpu-gates", type=int, metavar="N",
                    help="answer the test file's GPU-count gates (skip_if_lt_x_gpu, a world "
                         "size read from the device count) as N accelerators would; sets "
                         "%s for the ranks" % GATES_ENV)
    args = ap.parse_args()
    if args.gpu_gates is not None:
        os.environ[GATES_ENV] = str(args.gpu_gates)
        if _gpu_gates():  # before the test module's import: its decorators read the gate
            _open_skip_gate(_gpu_gates())

    test_file = os.path.abspath(args.test_file)
    sys.path.insert(0, os.path.dirname(test_file))
    module_name = os.path.splitext(os.path.basename(test_file))[0]
    module = importlib.import_module(module_name)
    stats_dir = os.path.abspath(args.out) + ".ranks"
    os.makedirs(stats_dir, exist_ok=True)
    for fn in os.listdir(stats_dir):
        os.unlink(os.path.join(stats_dir, fn))
    os.environ[STATS_ENV] = stats_dir

    loader = unittest.TestLoader()
    suite, threaded = unittest.TestSuite(), []
    for name in args.classes:
        for test in _flatten(loader.loadTestsFromName(name, module)):
            if _gpu_gates():
                _size_as_if(type(test), _gpu_gates())
            if isinstance(test, common_fsdp.FSDPTestMultiThread) and not args.in_process:
                threaded.append(test)
            else:
                suite.addTest(test)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=_Result, stream=sys.stdout)
    t0 = time.time()
    try:
        result = runner.run(suite)
    except Exception:
        traceback.print_exc()
        raise
    cases = []
    for test in threaded:
        cases.extend(_run_apart(test, test_file, stats_dir, args.label))
    for case in result.cases:
        test_name = case["id"].split(".")[-1]
        ranks = _tide_per_test(stats_dir, test_name)
        case["ranks_reporting"] = len(ranks)
        case["tide"] = _engagement(ranks, case["status"])
        if ranks:
            case["tide_totals_rank0"] = ranks[0]["totals"]
            case["tide_fallback_lines_rank0"] = [
                line for line in ranks[0]["tide_log"] if any(
                    mark in line for mark in _FALLBACK_MARKS)]
        cases.append(case)
    summary = {"label": args.label, "test_file": test_file, "torch": torch.__version__,
               "tide_switch": os.environ.get("TIDE_FSDP", ""), "gpu_gates": _gpu_gates(),
               "seconds": round(time.time() - t0, 1), "cases": cases}
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    for case in cases:
        print("%-8s %-9s %s  (%ss)%s" % (case["status"], case["tide"], case["id"],
                                         case["seconds"],
                                         "  " + case["detail"].splitlines()[-1][:160]
                                         if case["detail"] else ""))
    return 0 if all(c["status"] in ("passed", "skipped") for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
