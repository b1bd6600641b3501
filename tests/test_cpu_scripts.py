"""The CPU measurement scripts run as documented on tiny inputs: the plain timm + torchvision reference loop (its
budget, its run folder, plot_recipes reading it), the bf16 crossover table and the loader/thread settings."""

import json
import subprocess
import sys

import pytest
from trainer_utils import REPO, make_tree


def script(name: str, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "scripts" / name), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def cifar_like(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("cifar-like"), classes=("a", "b", "c"), per_class=8, val="test", size=32)


@pytest.mark.slow  # 17 s: the peer pipeline's training loop, end to end
def test_reference_loop_fits_its_budget_and_writes_a_run_plot_recipes_reads(cifar_like, tmp_path):
    out = tmp_path / "reference" / "seed0"
    small = ["embed_dim=16", "depth=1", "num_heads=2", "batch_size=4", "workers=0", "eval_every=3"]
    done = script("cifar10_cpu_reference.py", f"data.root={cifar_like}", f"out={out}", "budget_s=12", *small)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    history = metrics["history"]
    # The epoch count was fitted to the budget after the first epoch: more than one epoch, the curve evaluated on
    # the first, every third and the last epoch, the learning rate's cosine ending with the run.
    assert metrics["epochs_done"] == len(history) > 1
    assert [r["epoch"] for r in history if "val_top1" in r] == sorted({1, *range(3, len(history) + 1, 3), len(history)})
    assert metrics["test"]["top1"] == history[-1]["val_top1"]
    assert metrics["images_seen"] == len(history) * 6 * 4  # 24 images, batch 4, the last partial batch dropped
    assert metrics["wall_time_s"] < 60
    table = script("plot_recipes.py", str(tmp_path / "reference"), f"out={tmp_path / 'figures'}")
    assert table.returncode == 0, table.stderr
    assert "timm_torchvision_reference" in table.stdout and (tmp_path / "figures" / "recipes.png").is_file()


def test_reference_loop_refuses_bad_input_in_one_line(tmp_path):
    done = script("cifar10_cpu_reference.py", f"data.root={tmp_path / 'missing'}", f"out={tmp_path / 'out'}")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "data.root=" in done.stderr
    done = script("cifar10_cpu_reference.py", f"data.root={tmp_path}", f"out={tmp_path}", "budget_s=-1")
    assert done.returncode == 2 and "budget_s='-1' must be positive" in done.stderr


@pytest.mark.slow  # 14 s: times matmuls in both precisions
def test_bf16_crossover_table_times_both_precisions():
    done = script("bench_cpu_bf16.py", "cases=32x16x8x2,64x64x4x4", "rounds=1", "threads=1")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 32 ") or line.startswith("| 64 ")]
    assert len(rows) == 2
    fp32, bf16, ratio = (float(cell) for cell in rows[0].strip("|").split("|")[4:7])
    assert fp32 > 0 and bf16 > 0 and abs(ratio - bf16 / fp32) < 0.01 + 0.01 * ratio
    bad = script("bench_cpu_bf16.py", "cases=32x10x8x2")
    assert bad.returncode == 2 and "tokens must be one of" in bad.stderr


def test_cpu_setup_names_its_settings_and_refuses_unknown_ones():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from bench_cpu_setup import all_settings
    finally:
        sys.path.remove(str(REPO / "scripts"))
    settings = all_settings(2)
    assert settings["memory-t2"] == ["data.loader=gpu", "trainer.threads=2"]
    assert settings["torch-w1-t1"] == ["data.loader=torch", "data.num_workers=1", "trainer.threads=1"]
    assert len(settings) == 2 + 3 * 2
    done = script("bench_cpu_setup.py", "data.root=x", "settings=memory-t9")
    assert done.returncode == 2 and "'memory-t9' is not one of" in done.stderr


@pytest.mark.slow  # 16 s on 2 cores: a process that builds a model and three optimizers and times them
def test_optimizer_step_table_times_each_optimizer_as_the_trainer_builds_it():
    tiny = ["model.embed_dim=32", "model.depth=1", "model.num_heads=2", "rounds=1", "steps=2", "threads=1"]
    done = script("bench_optimizer.py", "optimizers=adamw,adamw:loop,lion", *tiny)
    assert done.returncode == 0, done.stderr
    table = [line.split("|") for line in done.stdout.splitlines() if line.startswith(("| adamw", "| lion"))]
    rows = {cells[1].strip(): cells[2:5] for cells in table}
    assert [cls.strip() for cls, _, _ in rows.values()] == ["AdamW", "AdamW", "Lion"]
    assert all(float(ms) > 0 for _, ms, _ in rows.values()) and float(rows["adamw"][2]) == 1.0
    bad = script("bench_optimizer.py", "optimizers=lion:loop")
    assert bad.returncode == 2 and "only adam and adamw have the variants" in bad.stderr
