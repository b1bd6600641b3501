"""The CPU measurement scripts run as documented on tiny inputs: the plain timm + torchvision reference loop (its
budget, its run folder, plot_recipes reading it), the bf16 crossover table, the loader/thread settings, the
optimizer step, the matmul peak and the memory of a step; each writes its measurement record (provenance and every
round's values, vit/records/provenance.py)."""

import json
import statistics
import subprocess
import sys

import pytest
from trainer_utils import REPO, assert_measurement_record, assert_provenance, load_script, make_tree

from vit.cli.args import run_script


def script(name: str, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "lab" / name), *args]
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
    assert_provenance(metrics["provenance"], "cifar10_cpu_reference.py", "budget_s=12")  # as the trainer's
    table = script("plot_recipes.py", str(tmp_path / "reference"), f"out={tmp_path / 'figures'}")
    assert table.returncode == 0, table.stderr
    assert "timm_torchvision_reference" in table.stdout and (tmp_path / "figures" / "recipes.png").is_file()


def test_reference_loop_refuses_bad_input_in_one_line(tmp_path, capsys):
    """Through the script's own `run_script` in this process (a new process costs seconds of imports): exit 2 and
    one line naming the argument, before any data is read."""
    reference = load_script("cifar10_cpu_reference")
    cases = [
        ([f"data.root={tmp_path / 'missing'}", f"out={tmp_path / 'out'}"], "data.root="),
        ([f"data.root={tmp_path}", f"out={tmp_path}", "budget_s=-1"], "budget_s='-1' must be positive"),
        ([f"data.root={tmp_path}", f"out={tmp_path}", "qk_norm=yes"], "qk_norm='yes' must be true or false"),
    ]
    for args, named in cases:
        capsys.readouterr()
        assert run_script(reference.main, args, usage=reference.__doc__) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err, err


@pytest.mark.slow  # 14 s: times matmuls in both precisions
def test_bf16_crossover_table_times_both_precisions(tmp_path):
    out = tmp_path / "bf16.json"
    done = script("bench_cpu_bf16.py", "cases=32x16x8x2,64x64x4x4", "rounds=1", "threads=1", f"json={out}")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 32 ") or line.startswith("| 64 ")]
    assert len(rows) == 2
    fp32, bf16, ratio = (float(cell) for cell in rows[0].strip("|").split("|")[4:7])
    assert fp32 > 0 and bf16 > 0 and abs(ratio - bf16 / fp32) < 0.01 + 0.01 * ratio
    record = json.loads(out.read_text())
    assert_measurement_record(record, "bench_cpu_bf16", "cases=32x16x8x2,64x64x4x4")
    first = record["cases"][0]
    assert (first["width"], first["tokens"], first["batch"], record["rounds"]) == (32, 16, 8, 1)
    for precision in ("fp32", "bf16"):  # every round (one here), the table's figure their median
        assert len(first[f"{precision}_img_per_s_rounds"]) == 1
        assert first[f"{precision}_img_per_s"] == statistics.median(first[f"{precision}_img_per_s_rounds"])
    assert round(first["fp32_img_per_s"]) == fp32
    bad = script("bench_cpu_bf16.py", "cases=32x10x8x2")
    assert bad.returncode == 2 and "tokens must be one of" in bad.stderr


def test_cpu_setup_names_its_settings_and_refuses_unknown_ones(tmp_path, monkeypatch, capsys):
    module = load_script("bench_cpu_setup")
    settings = module.all_settings(2)
    assert settings["memory-t2"] == ["data.loader=resident", "trainer.threads=2"]
    assert settings["torch-w1-t1"] == ["data.loader=torch", "data.num_workers=1", "trainer.threads=1"]
    assert len(settings) == 2 + 3 * 2
    assert run_script(module.main, ["data.root=x", "settings=memory-t9"], usage=module.__doc__) == 2
    assert "'memory-t9' is not one of" in capsys.readouterr().err
    # Its record: every round's img/s of every setting (the training runs here answer from a list, in order).
    answers = iter([1.0, 100.0, 200.0, 300.0, 50.0, 110.0, 210.0])
    monkeypatch.setattr(module, "train_img_per_s", lambda *args: next(answers))
    args = ["data.root=x", "settings=memory-t1,torch-w0-t1", "rounds=3", "batches=5", f"json={tmp_path / 's.json'}"]
    assert module.main(args) == 0
    record = json.loads((tmp_path / "s.json").read_text())
    assert_measurement_record(record, "bench_cpu_setup", "settings=memory-t1,torch-w0-t1")
    assert record["rounds"] == {"memory-t1": [100.0, 300.0, 110.0], "torch-w0-t1": [200.0, 50.0, 210.0]}
    assert record["medians"] == {"memory-t1": 110.0, "torch-w0-t1": 200.0} and record["batches"] == 5
    assert record["settings"]["memory-t1"] == settings["memory-t1"]
    assert "| torch-w0-t1 |" in capsys.readouterr().out


@pytest.mark.slow  # 16 s on 2 cores: a process that builds a model and three optimizers and times them
def test_optimizer_step_table_times_each_optimizer_as_the_trainer_builds_it(tmp_path):
    tiny = ["model.embed_dim=32", "model.depth=1", "model.num_heads=2", "rounds=1", "steps=2", "threads=1"]
    specs = "optimizers=adamw,adamw:loop,lion,muon:timm,muon:fp32"
    done = script("bench_optimizer.py", specs, *tiny, f"json={tmp_path / 'o.json'}")
    assert done.returncode == 0, done.stderr
    table = [line.split("|") for line in done.stdout.splitlines() if line.startswith(("| adamw", "| lion", "| muon"))]
    rows = {cells[1].strip(): cells[2:5] for cells in table}
    assert [cls.strip() for cls, _, _ in rows.values()] == ["AdamW", "AdamW", "Lion", "Muon", "BatchedMuon"]
    assert all(float(ms) > 0 for _, ms, _ in rows.values()) and float(rows["adamw"][2]) == 1.0
    record = json.loads((tmp_path / "o.json").read_text())
    assert_measurement_record(record, "bench_optimizer", specs)
    assert [(r["optimizer"], r["class"]) for r in record["optimizers"]] == [
        ("adamw", "AdamW"),
        ("adamw:loop", "AdamW"),
        ("lion", "Lion"),
        ("muon:timm", "Muon"),
        ("muon:fp32", "BatchedMuon"),
    ]
    for row in record["optimizers"]:  # every round (one here), the table's figure their median
        assert len(row["ms_rounds"]) == 1 and row["ms_median"] == statistics.median(row["ms_rounds"])
    assert record["model"] == {"embed_dim": 32, "depth": 1, "num_heads": 2} and record["steps"] == 2
    bad = script("bench_optimizer.py", "optimizers=lion:loop")
    assert bad.returncode == 2 and "only adam and adamw have the variants" in bad.stderr
    bad = script("bench_optimizer.py", "optimizers=muon:fp64")
    assert bad.returncode == 2 and "muon's variants are timm, fp32, bf16" in bad.stderr


def test_layernorm_record_holds_the_errors_of_both_sides_and_every_rounds_speed(tmp_path):
    out = tmp_path / "layernorm.json"
    args = ["rows=64,4096", "widths=48", "case=toy", "rounds=2", "threads=1", f"json={out}"]
    assert load_script("bench_layernorm").main(args) == 0
    record = json.loads(out.read_text())
    assert_measurement_record(record, "bench_layernorm", "lab/bench_layernorm.py rows=64,4096 widths=48")
    assert [(row["rows"], row["width"]) for row in record["errors"]] == [(64, 48), (4096, 48)]
    big = record["errors"][1]
    assert set(big["pytorch_bf16"]) == {"input", "weight", "bias"}
    assert all(error < 0.01 for error in big["float32_inside"].values()), big  # each side's gradients its own
    speeds = record["img_per_s_rounds"]
    assert len(speeds["pytorch_bf16"]) == len(speeds["float32_inside"]) == len(record["ratio_rounds"]) == 2
    bad = script("bench_layernorm.py", "case=nope")
    assert bad.returncode == 2 and "case='nope'" in bad.stderr


def test_matmul_peak_record_holds_every_round(tmp_path, capsys):
    out = tmp_path / "matmul.json"
    assert load_script("bench_matmul").main(["n=8", "rounds=3", "dtype=fp32", "device=cpu", f"json={out}"]) == 0
    record = json.loads(out.read_text())
    assert record == json.loads(capsys.readouterr().out)  # printed as written
    assert_measurement_record(record, "bench_matmul", "lab/bench_matmul.py n=8 rounds=3")
    assert len(record["seconds_rounds"]) == len(record["tflops_rounds"]) == 3 and record["device"] == "cpu"
    flops = 2 * 8**3 * record["products_per_round"]
    assert record["tflops_rounds"] == [round(flops / s / 1e12, 3) for s in record["seconds_rounds"]]
    assert record["tflops_median"] == round(statistics.median(flops / s / 1e12 for s in record["seconds_rounds"]), 3)


def test_memory_record_holds_every_process(tmp_path, monkeypatch):
    """The record keeps each process's peak RSS and step time, not only the medians (the processes answer from a
    list here; tests/e2e/test_docs_commands.py runs the documented command on a tiny model)."""
    module = load_script("bench_memory")
    answers = iter([(1000, 1500, 2.0), (1000, 1200, 3.0), (1000, 1600, 2.2), (1000, 1250, 3.4)])

    def child(args, setting):
        before, after, seconds = next(answers)
        return {"setting": setting, "rss_before_mib": before, "rss_after_mib": after, "step_s": seconds}

    monkeypatch.setattr(module, "run_child", child)
    assert module.main(["model=vit_tiny", "repeats=2", f"json={tmp_path / 'm.json'}"]) == 0
    record = json.loads((tmp_path / "m.json").read_text())
    assert_measurement_record(record, "bench_memory", "model=vit_tiny repeats=2")
    assert [(r["setting"], r["step_s"]) for r in record["rows"]] == [
        ("plain", 2.0),
        ("checkpointed", 3.0),
        ("plain", 2.2),
        ("checkpointed", 3.4),
    ]
    assert record["medians"]["checkpointed"] == {"step_s": pytest.approx(3.2), "share_mib": 225}
    assert record["settings"]["model"] == "vit_tiny" and record["settings"]["repeats"] == 2


def test_memory_script_refuses_a_bad_value_in_one_line_and_measures_in_a_child(capsys):
    """A bad key=value is one line on stderr naming the key, exit code 2 (through the script's own `run_script` in
    this process); the internal `one=<setting>` key (a child process's) is not in the usage; a child measures one
    step of a tiny model and answers in JSON."""
    module = load_script("bench_memory")
    for args, message in [
        (["batch_size=0"], "usage error: batch_size='0' must be an integer >= 1"),
        (["one=fast"], "usage error: one='fast' must be one of plain, checkpointed"),
        (["--model", "vit_tiny"], "usage error: argument '--model' must look like key=value"),
        (
            ["size=3"],
            "usage error: unknown argument 'size'; known: model, img_size, batch_size, num_classes, repeats, json\n",
        ),
    ]:
        capsys.readouterr()
        assert run_script(module.main, args, usage=module.__doc__) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(message), err
    assert run_script(module.main, ["--help"], usage=module.__doc__) == 0
    usage = capsys.readouterr().out
    assert "usage: python lab/bench_memory.py [model=vit_base]" in usage and "one=" not in usage
    tiny = module.read_args(["model=vit_tiny", "img_size=32", "batch_size=2", "num_classes=10"])
    row = module.run_child(tiny, "checkpointed")
    assert row["setting"] == "checkpointed" and row["rss_after_mib"] >= row["rss_before_mib"] > 0


def test_accuracy_map_counts_each_epochs_images_at_their_size(tmp_path):
    """A 2-epoch run with a holdout and progressive resizing (16 px, then 32 px): the map's point holds its holdout
    and test top-1, the images it trained on and its FLOPs, each epoch's images at that epoch's size; the anchor's
    FLOPs are ConvMixer-256/8's (kernel 5, patch 2) by its layers' arithmetic; a run without a holdout is refused."""
    from omegaconf import OmegaConf
    from trainer_utils import QUICK, compose_config

    from vit.errors import UsageError
    from vit.models.complexity import complexity
    from vit.tasks.build import build_model_from_config
    from vit.train import run

    accuracy_map = load_script("accuracy_map")
    runs = tmp_path / "runs"
    cfg = compose_config([*QUICK, "data.holdout=32", "trainer.epochs=2", "trainer.progressive_resize.min_size=16"])
    folder = runs / "w32_e2" / "seed0"
    metrics = run(cfg, output_dir=folder)
    (folder / ".hydra").mkdir()
    OmegaConf.save(cfg, folder / ".hydra" / "config.yaml")  # as train.py writes it
    assert [e["train_img_size"] for e in metrics["history"]] == [16, 32]
    budget_run = REPO / "docs" / "results" / "cifar10_cpu_budget" / "avx512_2h"  # a committed 2-hour budget run
    out = [f"out={tmp_path / 'map.png'}", f"json={tmp_path / 'map.json'}", f"budget={budget_run}"]
    assert accuracy_map.main([f"runs={runs}", *out]) == 0
    record = json.loads((tmp_path / "map.json").read_text())
    assert_measurement_record(record, "accuracy_map")
    (point,) = record["points"]
    steps = [metrics["history"][0]["step"], metrics["history"][1]["step"] - metrics["history"][0]["step"]]
    assert point["images"] == sum(steps) * 32 == 2 * (256 - 32) // 32 * 32  # 224 training images, batches of 32
    macs_16 = complexity(build_model_from_config(cfg.model, num_classes=10, dynamic_img_size=True), 16).macs
    assert macs_16 < metrics["macs"]  # 16 tokens, not 64
    assert point["train_flops"] == 6 * 32 * (steps[0] * macs_16 + steps[1] * metrics["macs"])
    assert (point["holdout_top1"], point["test_top1"]) == (metrics["final"]["val_top1"], metrics["test"]["top1"])
    # ConvMixer-256/8: the patch convolution, 8 x (a 5 x 5 depthwise and a pointwise convolution) on 16 x 16
    # positions, the head; 2 FLOPs a multiply-add
    assert record["convmixer_forward_flops"] == 2 * (12 * 256 * 256 + 8 * (25 + 256) * 256 * 256 + 256 * 10)
    assert (tmp_path / "map.png").stat().st_size > 0
    (budgeted,) = record["budget_runs"]  # its planned epochs and test top-1; each epoch's images at its size
    budget_metrics = json.loads(next(budget_run.rglob("metrics.json")).read_text())
    assert (budgeted["epochs"], budgeted["test_top1"]) == (
        budget_metrics["budget"]["planned_epochs"],
        budget_metrics["final"]["val_top1"],
    )
    assert budgeted["images"] == budget_metrics["final"]["step"] * 256
    assert budgeted["train_flops"] < 6 * budgeted["images"] * budget_metrics["macs"]  # the 16 px epochs cost less
    OmegaConf.save(
        OmegaConf.merge(cfg, {"data": {"holdout": None}}), runs / "w32_e2" / "seed0" / ".hydra" / "config.yaml"
    )
    with pytest.raises(UsageError, match="not a run with data.holdout"):
        accuracy_map.main([f"runs={runs}"])


def photographs(folder, sizes=((90, 140), (120, 80))):
    """Two 'photographs' (height, width): the left 70% of each black, the right 30% white, so a crop's colour says
    which part of it the crop came from."""
    from PIL import Image

    folder.mkdir(parents=True)
    for index, (height, width) in enumerate(sizes):
        image = Image.new("RGB", (width, height), "white")
        image.paste((0, 0, 0), (0, 0, int(width * 0.7), height))
        image.save(folder / f"photo{index}.png")
    return folder


def test_photo_shapes_cuts_training_and_test_crops_of_mixed_shapes_from_apart(tmp_path):
    from types import SimpleNamespace

    import numpy as np
    from PIL import Image

    experiment = load_script("photo_shapes_experiment")
    args = SimpleNamespace(photos=photographs(tmp_path / "photos"), work=tmp_path, train_per_class=12, test_per_class=4)
    root = experiment.make_folder(args)
    ratios = []
    for split, count, colour in (("train", 12, 0), ("test", 4, 255)):
        for photo in ("photo0", "photo1"):
            crops = sorted((root / split / photo).glob("*.jpg"))
            assert len(crops) == count
            for crop in crops:
                pixels = np.asarray(Image.open(crop).convert("L"), dtype=float)
                assert abs(pixels.mean() - colour) < 40, (crop, pixels.mean())  # from its own side of the cut
                ratios.append(pixels.shape[1] / pixels.shape[0])
    assert min(ratios) < 0.8 and max(ratios) > 1.25 and all(1 / 3.2 < r < 3.2 for r in ratios)  # mixed shapes


@pytest.mark.slow  # about a minute: two train.py runs and four vit-eval runs
def test_photo_shapes_experiment_trains_both_ways_and_evaluates_each_both_ways(tmp_path):
    photos = photographs(tmp_path / "photos")
    args = [f"photos={photos}", f"work={tmp_path / 'work'}", "seeds=0", "train_per_class=10", "test_per_class=4"]
    done = script("photo_shapes_experiment.py", *args, "epochs=1", "batch_size=4", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "work" / "results.json").read_text())
    assert_measurement_record(record, "photo_shapes")
    assert set(record["summary"]) == {f"{m}/{v}" for m in ("native", "square") for v in ("own_shapes", "square")}
    for name in ("native-0", "square-0"):
        assert {e["count"] for e in record["evaluations"][name].values()} == {8}  # every test crop, each way
