"""examples/train.py as a user runs it: two CPU ranks spawned by the script, --compare, a few
steps; the files it writes and what they say.

Losses must be bit-exact between stock FSDP2 and TIDE: at world 2 every gradient sum has two
terms, so it is the same real number rounded once whatever order either side adds in, and
x / 2 = x * 0.5 exactly (docs/fsdp.md, Numerics). That holds for fp32 and for bf16 compute
with fp32 reduction, the two precisions run here; the losses are compared from the JSON's
per-rank lists, not from the script's own verdict.
"""

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "examples", "train.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(out, *args, timeout=120, env=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    env.setdefault("TIDE_LIBRARY", os.path.join(ROOT, "build", "libtide.so"))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"),
                                         env.get("PYTHONPATH", "")])
    cmd = [sys.executable, SCRIPT, "--world", "2", "--no-progress", "--threads", "1",
           "--out", str(out), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _check_png(path):
    import matplotlib.image

    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] >= 300 and img.shape[1] >= 900
    assert img[..., :3].std() > 0.05  # something was drawn


def _check_run(run, steps, world, metrics):
    assert len(run["losses"]) == world and len(run["step_time_s"]) == world
    for rank in range(world):
        assert len(run["losses"][rank]) == steps
        assert all(math.isfinite(x) for x in run["losses"][rank])
        assert all(t > 0 for t in run["step_time_s"][rank])
    assert sorted(run["memory_bytes"]) == sorted(metrics)
    for per_rank in run["memory_bytes"]["rss_peak"]:
        assert len(per_rank) == steps and all(b > 0 for b in per_rank)
    s = run["summary"]
    assert s["tokens_per_s"] > 0 and s["median_step_s"] > 0
    # It trains: the synthetic sequences are learnable, the mean loss goes down.
    assert s["mean_loss"][-1] < s["mean_loss"][0] - 0.05, s["mean_loss"]


@pytest.mark.parametrize("model,precision,mode", [("llama", "fp32", "in_place"),
                                                  ("moe", "bf16", "slot_reuse")])
def test_compare_writes_figures_and_losses_agree(tmp_path, model, precision, mode):
    steps = 6
    res = _run(tmp_path, "--model", model, "--precision", precision, "--tide", mode,
               "--compare", "--steps", str(steps), "--layers", "2", "--dim", "32",
               "--seq", "32", "--lr", "1e-2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "losses bit-exact" in res.stdout, res.stdout
    assert "TIDE (%s) serves 3 FSDP2 group(s)" % mode.replace("_", "-") in res.stderr

    _check_png(tmp_path / "compare.png")
    with open(tmp_path / "compare.json") as f:
        doc = json.load(f)
    stock, tide = doc["runs"]
    assert stock["name"] == "stock" and stock["tide"] is None
    assert tide["name"] == "tide" and tide["tide"]["mode"] == mode.replace("_", "-")
    metrics = ["rss_peak_over_start", "rss_peak"]
    _check_run(stock, steps, 2, metrics)
    _check_run(tide, steps, 2, metrics)
    # TIDE served every FSDP2 group: the two layers and the root.
    assert sorted(n for n, _ in tide["tide"]["groups"]) == ["<root>", "layers.0", "layers.1"]
    assert all(t in (0, 1) for _, t in tide["tide"]["groups"])
    assert tide["tide"]["fallbacks"] == []
    # Same seed, same data, world 2: bit-exact, rank by rank and step by step.
    assert tide["losses"] == stock["losses"]
    assert doc["comparison"]["losses_bit_exact"] is True
    assert doc["comparison"]["max_abs_loss_diff"] == 0.0
    assert doc["info"]["world"] == 2 and doc["info"]["device"] == "cpu"
    assert all(v in ("0", "1") for v in doc["info"]["safe_env"].values())


def test_moe_group_over_256_parameters_falls_back_and_says_so(tmp_path):
    # 84 experts: 3 * 84 + 7 = 259 parameters in the layer's group, above TIDE's 256.
    res = _run(tmp_path, "--model", "moe", "--experts", "84", "--layers", "1", "--dim", "16",
               "--heads", "2", "--hidden", "16", "--seq", "8", "--steps", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "stock FSDP2 for layers.0: 259 parameters" in res.stderr, res.stderr
    with open(tmp_path / "tide.json") as f:
        doc = json.load(f)
    (run,) = doc["runs"]
    assert [n for n, _ in run["tide"]["groups"]] == ["<root>"]
    assert [n for n, _ in run["tide"]["fallbacks"]] == ["layers.0"]
    assert doc["comparison"] is None
    _check_png(tmp_path / "tide.png")


def test_bad_arguments_are_refused_with_a_message(tmp_path, capsys):
    # Argument checks run in this process (train.py as a module: no ranks are started).
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import train
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    for argv, message in [(["--model", "moe", "--experts", "2", "--top-k", "3"],
                           "--top-k must be within"),
                          (["--dim", "30", "--heads", "4"], "dim must be a multiple of heads"),
                          (["--steps", "0"], "--steps must be at least 1")]:
        with pytest.raises(SystemExit) as exc:
            train.parse_args(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err, argv
    # A libtide that cannot be loaded: one message, before any rank starts.
    res = _run(tmp_path, "--steps", "1", env={"TIDE_LIBRARY": str(tmp_path / "no-libtide.so")},
               timeout=60)
    assert res.returncode == 1 and "libtide not found" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "tide.json").exists()
