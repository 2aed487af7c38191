"""tests/torch_upstream/run_cpu.py's opt-in --gpu-gates N on a CPU-only machine: a case under
skip_if_lt_x_gpu(x) without allow_cpu runs when x <= N and skips when x > N, a class that
sizes itself by the device count gets N ranks while nothing else in a rank sees N devices,
and without the opt-in the case skips as torch ships it (docs/torch-upstream-tests.md)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch's test helpers import it

RUNNER = pathlib.Path(__file__).resolve().parents[2] / "tests" / "torch_upstream" / "run_cpu.py"

# A test file shaped like test_fully_shard_state_dict.py's gates (written for this test).
GATED = '''
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
from torch.testing._internal.common_fsdp import FSDPTest, get_devtype

device_type = torch.device(get_devtype())


class TestGated(FSDPTest):
    @property
    def world_size(self):
        return min(8, torch.get_device_module(device_type).device_count())

    @skip_if_lt_x_gpu(2)
    def test_runs_at_two(self):
        self.assertEqual(dist.get_world_size(), 2)
        self.assertEqual(self.world_size, 2)
        # Only the class's sizing sees N: the CPU module answers 1 elsewhere.
        self.assertEqual(torch.cpu.device_count(), 1)

    @skip_if_lt_x_gpu(3)
    def test_needs_three(self):
        raise AssertionError("ran with fewer devices than it asks for")
'''


def _run(tmp_path, label, tests, gates=None):
    src = tmp_path / "test_gated.py"
    src.write_text(GATED)
    out = tmp_path / ("%s.json" % label)
    cmd = [sys.executable, str(RUNNER), "--out", str(out), str(src)] + tests
    if gates is not None:
        cmd[2:2] = ["--gpu-gates", str(gates)]
    env = dict(os.environ, OMP_NUM_THREADS="1", TIDE_FSDP="")
    env.pop("TIDE_UPSTREAM_GPU_GATES", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    return {c["id"].split(".")[-1]: c for c in summary["cases"]}, summary


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the gates open on a CPU-only "
                    "machine only")
def test_gpu_gates_open_as_n_devices_and_only_with_the_opt_in(tmp_path):
    cases, summary = _run(tmp_path, "gated", ["TestGated"], gates=2)
    assert summary["gpu_gates"] == 2
    assert cases["test_runs_at_two"]["status"] == "passed", cases["test_runs_at_two"]
    assert cases["test_needs_three"]["status"] == "skipped", cases["test_needs_three"]
    cases, summary = _run(tmp_path, "shipped", ["TestGated.test_runs_at_two"])
    assert summary["gpu_gates"] == 0
    assert cases["test_runs_at_two"]["status"] == "skipped", cases["test_runs_at_two"]
