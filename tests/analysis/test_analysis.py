"""The analysis library without the scripts: attention maps and rollout, position-embedding similarity, run
folders, figures, and reading checkpoints and images."""

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from trainer_utils import DATA_CFG, compose_config, fake_run

from vit.analysis import plots
from vit.analysis.inputs import denormalise, image_paths, load_images, load_model
from vit.analysis.pos_embed import position_similarity
from vit.analysis.runs import (
    failure_lines,
    knob_value,
    markdown_table,
    read_runs,
    summary_rows,
    swept_keys,
    unequal_training,
)
from vit.errors import UsageError
from vit.models import Attention, create_model, sinusoid_table
from vit.tasks import figures
from vit.tasks.figures import attention_views, cls_attention, rollout, upsample
from vit.weights.read import CheckpointError

MODEL_CFG = {
    "name": "vit_tiny",
    "img_size": 32,
    "patch_size": 8,
    "num_classes": 3,
    "embed_dim": 32,
    "depth": 2,
    "num_heads": 2,
}


def assert_png(path: Path, min_side: int = 100):
    """Written, small, of a sensible size, and not one flat colour."""
    assert path.is_file() and 1_000 < path.stat().st_size < 300_000
    image = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)
    assert min(image.shape[:2]) >= min_side and image.var() > 1.0


# Attention maps -----------------------------------------------------------------------------------------------


def tiny_vit():
    return create_model("vit_tiny", img_size=32, patch_size=8, num_classes=3, embed_dim=32, depth=3, num_heads=2)


def test_rollout_of_an_identity_attention_model_is_the_identity():
    model = tiny_vit().eval()
    eye = torch.eye(1 + 16, dtype=torch.bool)  # each token may attend only to itself
    for module in model.modules():
        if isinstance(module, Attention):  # the block passes its own mask (None for an image): this one wins
            forward = partial(type(module).forward, module)
            module.forward = lambda x, attn_mask=None, forward=forward, **kwargs: forward(x, attn_mask=eye, **kwargs)
    from vit.models import capture_attention

    with capture_attention(model) as maps, torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    assert len(maps) == 3
    torch.testing.assert_close(rollout(maps), torch.eye(17).expand(2, 17, 17))
    # The cls token looks at no patch, so every picture of it is blank.
    views = attention_views(model, torch.randn(2, 3, 32, 32))
    assert views["heads"].shape == (2, 2, 32, 32) and views["rollout"].shape == (2, 1, 32, 32)
    assert views["heads"].abs().max() == 0 and views["rollout"].abs().max() == 0


def test_rollout_keeps_rows_stochastic_and_mixes_in_the_residual():
    attn = torch.rand(2, 3, 5, 5).softmax(dim=-1)
    result = rollout([attn, attn])
    torch.testing.assert_close(result.sum(-1), torch.ones(2, 5))
    one = 0.5 * torch.eye(5) + 0.5 * attn.mean(1)
    torch.testing.assert_close(rollout([attn]), one)
    torch.testing.assert_close(result, one @ one)
    with pytest.raises(ValueError, match="at least one"):
        rollout([])


def test_cls_attention_reads_the_cls_row_over_the_patches():
    attn = torch.zeros(1, 2, 1 + 6, 1 + 6)
    attn[0, 1, 0, 1 + 4] = 1.0  # head 1: the cls token looks at patch 4 = grid cell (1, 1) of a 2x3 grid
    attn[0, 0, 3, 1 + 4] = 1.0  # another query's row: must not show
    maps = cls_attention(attn, (2, 3))
    assert maps.shape == (1, 2, 2, 3)
    assert maps[0, 0].sum() == 0 and maps[0, 1, 1, 1] == 1 and maps[0, 1].sum() == 1
    wide = upsample(maps, (20, 30))
    assert wide.shape == (1, 2, 20, 30) and wide[0, 1].max() == 1 and wide[0, 1].min() == 0


def test_attention_views_reject_a_layer_out_of_range():
    with pytest.raises(IndexError, match="layer=3 is out of range: the model has 3"):
        attention_views(tiny_vit(), torch.randn(1, 3, 32, 32), layer=3)
    assert attention_views(tiny_vit(), torch.randn(1, 3, 32, 32), layer=-3)["heads"].shape == (1, 2, 32, 32)


# Position embeddings ------------------------------------------------------------------------------------------


def test_position_similarity_is_a_symmetric_cosine_grid():
    pos = torch.randn(1, 1 + 12, 8)
    sim = position_similarity(pos, (3, 4))
    assert sim.shape == (3, 4, 3, 4)
    flat = sim.reshape(12, 12)
    torch.testing.assert_close(flat.diagonal(), torch.ones(12))
    torch.testing.assert_close(flat, flat.T)
    expected = torch.nn.functional.cosine_similarity(pos[0, 1 + 5], pos[0, 1 + 7], dim=0)  # (1, 1) vs (1, 3)
    torch.testing.assert_close(sim[1, 1, 1, 3], expected)
    with pytest.raises(ValueError, match="13 patch rows"):
        position_similarity(torch.randn(1, 14, 8), (3, 4))


def test_sinusoid_similarity_falls_with_distance_along_the_sequence():
    sim = position_similarity(sinusoid_table(1 + 64, 64), (8, 8))
    assert sim[0, 0, 0, 1] > sim[0, 0, 0, 4] > sim[0, 0, 4, 4]


# Run folders --------------------------------------------------------------------------------------------------


@pytest.fixture()
def split_sweep(tmp_path):
    """A qk_scale sweep split over two folders (as when it ran in two processes); run b/0 died before
    metrics.json and left only its TensorBoard curve."""
    model = {"name": "vit_tiny", "embed_dim": 192, "num_heads": 3}
    base = {"params": 5_363_000, "macs": 365_000_000, "train_img_per_s": 4321.0, "wall_time_s": 99.4}
    fake_run(
        tmp_path / "a" / "0",
        ["experiment=ablation_qk_scale", "model.qk_scale=null"],
        model,
        {**base, "final": {"val_top1": 62.5}, "best": {"val_top1": 63.0}},
    )
    fake_run(
        tmp_path / "a" / "1",
        ["experiment=ablation_qk_scale", "model.qk_scale=1.0"],
        model,
        {**base, "final": {"val_top1": 53.3}, "best": {"val_top1": 53.3}},
    )
    fake_run(
        tmp_path / "b" / "0",
        ["experiment=ablation_qk_scale", "model.qk_scale=0.0625"],
        model,
        None,
        tb_curve=[(10, 40.0), (20, 61.0), (30, 60.0)],
    )
    (tmp_path / "multirun.yaml").write_text("not a run\n")
    return tmp_path


def test_read_runs_names_runs_by_their_folder_and_finds_the_knob(split_sweep):
    records = read_runs(split_sweep)
    assert [r.name for r in records] == ["a/0", "a/1", "b/0"]
    assert swept_keys(records) == ["model.qk_scale"]  # experiment= is the same everywhere
    assert [r.final_top1 for r in records] == [62.5, 53.3, 60.0]  # b/0: the last TensorBoard point
    assert records[2].best_top1 == 61.0
    assert knob_value(records[0], "model.qk_scale") == pytest.approx(64**-0.5)  # null = head_dim ** -0.5
    assert knob_value(records[1], "model.qk_scale") == 1.0


def test_summary_rows_hold_knobs_cost_and_accuracy(split_sweep):
    header, rows = summary_rows(read_runs(split_sweep))
    assert header == [
        "run",
        "model.qk_scale",
        "params (M)",
        "GMACs",
        "img/s",
        "steps",
        "images",
        "epochs",
        "precision",
        "final top-1",
        "best top-1",
        "run s",
    ]
    assert rows[0] == ["a/0", "null", "5.36", "0.365", "4,321", "-", "-", "-", "-", "62.50", "63.00", "99.4"]
    assert rows[2] == ["b/0", "0.0625", "-", "-", "-", "-", "-", "-", "-", "60.00", "61.00", "-"]
    table = markdown_table(header, rows).splitlines()
    assert len(table) == 2 + 3 and table[2].startswith("| a/0 | null | 5.36 |")


def test_a_sweep_that_trained_unequal_amounts_says_so_and_lists_its_failed_job(tmp_path):
    """Two budgeted jobs, one of them on a busy machine, and one refused: the steps and images of each, one line
    above the table naming the difference and why, and the failed job below it with its line."""
    model = {"name": "vit_tiny", "embed_dim": 192, "num_heads": 3}
    for n, (bias, steps) in enumerate([("true", 49), ("false", 10)]):
        metrics = {"steps_trained": steps, "images_trained": steps * 256, "epochs_done": 1, "precision": "bf16"}
        metrics.update(final={"val_top1": 19.2 - n}, best={"val_top1": 19.2 - n}, wall_time_s=40.0)
        fake_run(tmp_path / str(n), [f"model.qkv_bias={bias}", "trainer.budget=40s"], model, metrics)
    fake_run(tmp_path / "2", ["model.qkv_bias=true", "trainer.budget=20s"], model, None)
    failure = {"job": 2, "exit_code": 2, "line": "budget error: trainer.budget=20s is too small for this run: ...",
               "overrides": ["model.qkv_bias=true", "trainer.budget=20s"]}  # fmt: skip
    (tmp_path / "2" / "failed.json").write_text(json.dumps(failure))
    for n in range(3):  # the trainer's config of a budgeted run
        config = yaml.safe_load((tmp_path / str(n) / ".hydra" / "config.yaml").read_text())
        config["trainer"] = {"budget": 40.0}
        (tmp_path / str(n) / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    records = read_runs(tmp_path)
    assert unequal_training(records) == (
        "note: these runs trained different amounts (10 to 49 steps, 2,560 to 12,544 images): a time budget per "
        "job ends each run when its time is up, so a slower or busier job trains less; the top-1 below compares "
        "the training as well as the knobs (give every job the same trainer.epochs, or trainer.max_steps, to "
        "compare like with like)"
    )
    header, rows = summary_rows(records)
    assert [row[header.index("steps")] for row in rows] == ["49", "10", "-"]
    assert [row[header.index("precision")] for row in rows] == ["bf16", "bf16", "failed"]
    assert failure_lines(records) == [
        "- 2 (model.qkv_bias=true trainer.budget=20s): exit 2, budget error: trainer.budget=20s is too small for "
        "this run: ..."
    ]
    equal = [r for r in records if r.name != "1"]
    assert unequal_training(equal) is None  # one run trained, one failed: nothing to compare


def test_sweep_figure_orders_numeric_knobs(split_sweep, tmp_path, monkeypatch):
    records = read_runs(split_sweep)
    ticks = {}
    real_subplots = plots.plt.subplots

    def spy(*args, **kwargs):
        fig, ax = real_subplots(*args, **kwargs)
        monkeypatch.setattr(ax, "set_xticks", lambda positions, labels: ticks.update(labels=list(labels)))
        return fig, ax

    monkeypatch.setattr(plots.plt, "subplots", spy)
    out = plots.sweep_figure(records, swept_keys(records), tmp_path / "sweep.png")
    assert ticks["labels"] == ["0.0625", "null\n(0.125)", "1.0"]
    assert_png(out)


def test_a_run_built_from_a_timm_name_is_read_with_the_model_it_built(tmp_path):
    """Hydra's config.yaml keeps the model config a run was composed with (vit_tiny, 3 heads); a run from
    model.pretrained=timm:<name> wrote the model it built beside it, and that is what the run reads as."""
    from vit.tasks.build import built_config_file

    fake_run(tmp_path / "0", ["model.pretrained=timm:x"], {"name": "vit_tiny", "embed_dim": 192, "num_heads": 3}, {})
    built = {"name": "timm:vit_small_patch14_dinov2", "embed_dim": 384, "num_heads": 6}
    (tmp_path / "0" / built_config_file("model")).write_text(yaml.safe_dump(built))
    (record,) = read_runs(tmp_path)
    assert record.config["model"] == built


def test_read_runs_of_a_missing_folder_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing"):
        read_runs(tmp_path / "nothing")
    assert read_runs(tmp_path) == []


# Figures ------------------------------------------------------------------------------------------------------


def test_confusion_matrix_figure(tmp_path):
    matrix = np.array([[8, 1, 1], [0, 10, 0], [0, 0, 0]])  # the last class has no examples: no division by 0
    out = figures.confusion_matrix_figure(matrix, ["cat", "dog", "ship"], tmp_path / "sub" / "cm.png")
    assert out == tmp_path / "sub" / "cm.png"
    assert_png(out)
    many = np.random.default_rng(0).integers(0, 20, (30, 30))  # no numbers in the cells beyond 20 classes
    assert_png(figures.confusion_matrix_figure(many, [f"c{i}" for i in range(30)], tmp_path / "cm30.png"))


def test_position_and_complexity_figures(tmp_path):
    sim = position_similarity(torch.randn(1, 1 + 16, 8), (4, 4)).numpy()
    assert_png(plots.pos_embed_similarity_figure([("a", sim), ("b", sim)], tmp_path / "pos.png"))
    sizes = [32, 64, 128, 256]
    out = plots.macs_vs_size_figure(sizes, [1e9, 4e9, 16e9, 64e9], [1e8, 2e9, 3e10, 5e11], tmp_path / "f.png", "t")
    assert_png(out)


def test_attention_grid_figure_has_a_column_per_panel(tmp_path):
    images = torch.rand(2, 3, 32, 32)
    heads, roll = torch.rand(2, 3, 32, 32), torch.rand(2, 1, 32, 32)
    narrow = figures.attention_grid_figure(images, heads, roll, tmp_path / "a.png")
    wide = figures.attention_grid_figure(images, heads, roll, tmp_path / "b.png", token_maps=roll)
    assert_png(narrow) and assert_png(wide)
    with Image.open(narrow) as a, Image.open(wide) as b:
        assert b.size[0] > a.size[0] * 1.1  # input + 3 heads + rollout, then + T2T stage


# Checkpoints and images ---------------------------------------------------------------------------------------


@pytest.fixture()
def checkpoint(tmp_path):
    model = create_model(**MODEL_CFG)
    path = tmp_path / "tiny.pt"
    config = {"model": MODEL_CFG, "data": DATA_CFG}
    torch.save({"model": model.state_dict(), "config": config, "class_to_idx": {"a": 0, "b": 1, "c": 2}}, path)
    return path, model.eval()


def test_load_model_rebuilds_the_trained_model(checkpoint):
    path, original = checkpoint
    model, config, classes = load_model(path)
    assert not model.training and classes == {"a": 0, "b": 1, "c": 2} and config["model"]["name"] == "vit_tiny"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), original(x))


def test_load_model_errors_name_the_file(tmp_path, checkpoint):
    with pytest.raises(CheckpointError, match="missing.pt' does not exist"):
        load_model(tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read weights file '.*garbage.pt'"):
        load_model(garbage)
    bare = tmp_path / "bare.pt"
    torch.save({"model": checkpoint[1].state_dict()}, bare)
    with pytest.raises(CheckpointError, match="no model config"):
        load_model(bare)
    with pytest.raises(CheckpointError, match="no EMA weights"):
        load_model(checkpoint[0], use_ema=True)


def test_load_images_applies_the_validation_transform(tmp_path):
    folder = tmp_path / "imgs"
    (folder / "nested").mkdir(parents=True)
    Image.new("RGB", (40, 40), (255, 0, 0)).save(folder / "b.png")
    Image.new("L", (64, 48), 128).save(folder / "nested" / "a.jpg")  # grey, not square
    (folder / "notes.txt").write_text("not an image")
    paths, batch = load_images(folder, {"data": DATA_CFG})
    assert [p.name for p in paths] == ["b.png", "a.jpg"]  # sorted by path: b.png before nested/
    assert batch.shape == (2, 3, 32, 32)
    torch.testing.assert_close(batch[0, :, 0, 0], torch.tensor([2.0, -2.0, -2.0]))  # (1 - 0.5) / 0.25, ...
    back = denormalise(batch, {"data": DATA_CFG})
    torch.testing.assert_close(back[0, :, 5, 5], torch.tensor([1.0, 0.0, 0.0]))
    assert load_images(folder / "b.png", {"data": DATA_CFG})[1].shape == (1, 3, 32, 32)


def test_image_paths_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        image_paths(tmp_path / "nope.png")
    with pytest.raises(UsageError, match="no images"):
        image_paths(tmp_path)


# Ablation experiments -----------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("experiment", "knob", "values"),
    [
        ("ablation_heads", "num_heads", [1, 2, 3, 4, 6, 12]),
        ("ablation_qk_scale", "qk_scale", [None, 1.0, 0.5, 0.25, 0.0625]),
        ("ablation_qkv_bias", "qkv_bias", [True, False]),
    ],
)
def test_ablation_experiments_sweep_one_knob_on_a_short_cifar10_schedule(experiment, knob, values):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from vit.tasks.build import build_model_from_config
    from vit.train.config import validate

    raw = yaml.safe_load((REPO / "configs" / "experiment" / f"{experiment}.yaml").read_text())
    sweep = raw["hydra"]["sweeper"]["params"]
    assert list(sweep) == [f"model.{knob}"]
    parsed = OverridesParser.create().parse_overrides([f"model.{knob}={sweep[f'model.{knob}']}"])[0]
    assert list(parsed.sweep_iterator()) == values  # as Hydra's basic sweeper will expand it
    for value in values:
        override = "null" if value is None else str(value).lower()
        cfg = compose_config([f"experiment={experiment}", f"model.{knob}={override}", "model.depth=1"])
        validate(cfg)
        assert cfg.data.name == "cifar10" and 0 < cfg.trainer.epochs <= 20 and cfg.model.embed_dim == 192
        model = build_model_from_config(cfg.model)
        attn = model.blocks[0].attn
        if knob == "num_heads":
            assert attn.num_heads == value
        elif knob == "qk_scale":
            assert attn.scale == pytest.approx(value if value is not None else (192 // 3) ** -0.5)
        else:
            assert (attn.qkv.bias is not None) == value
    epochs = compose_config([f"experiment={experiment}", "trainer.epochs=2"])
    assert epochs.trainer.epochs == 2


def test_seed_rows_give_mean_and_range_per_setting(tmp_path):
    from vit.analysis.runs import read_runs, seed_rows

    model = {"name": "vit_tiny", "embed_dim": 192, "num_heads": 3}
    finals = {("4", "0"): 80.0, ("4", "1"): 81.0, ("8", "0"): 70.0, ("8", "1"): 73.0}
    for i, ((patch, seed), top1) in enumerate(finals.items()):
        metrics = {"final": {"val_top1": top1}, "wall_time_s": 60.0 + i}
        fake_run(tmp_path / str(i), [f"model.patch_size={patch}", f"trainer.seed={seed}"], model, metrics)
    header, rows = seed_rows(read_runs(tmp_path))
    assert header == ["model.patch_size", "seeds", "final top-1 mean", "min - max", "run s mean"]
    assert rows == [["4", "2", "80.50", "80.00 - 81.00", "60.5"], ["8", "2", "71.50", "70.00 - 73.00", "62.5"]]
    assert seed_rows(read_runs(tmp_path / "0")) is None  # one run: no seed sweep


def test_a_sweeps_process_start_up_is_its_own_column_not_the_first_runs_time(tmp_path):
    """The first run of a multirun process is charged the process's start-up (imports) in its wall time; the
    run-time column leaves it out, so two identical runs show the same time, and the start-up gets its own column."""
    from vit.analysis.runs import read_runs, seed_rows

    model = {"name": "vit_tiny", "embed_dim": 192, "num_heads": 3}
    for i, (wall, startup) in enumerate([(6.84, 6.37), (0.47, 0.0)]):
        metrics = {"final": {"val_top1": 50.0}, "wall_time_s": wall, "startup_s": startup}
        fake_run(tmp_path / str(i), [f"trainer.seed={i}"], model, metrics)
    header, rows = summary_rows(read_runs(tmp_path))
    assert header[-2:] == ["run s", "start-up s"]
    assert [row[-2:] for row in rows] == [["0.5", "6.4"], ["0.5", "0.0"]]
    header, rows = seed_rows(read_runs(tmp_path))
    assert header[-1] == "run s mean" and rows[0][-1] == "0.5"


def test_holdout_runs_show_their_split_ema_and_test_accuracy(tmp_path):
    """Runs with data.holdout and EMA: the per-epoch columns say "holdout", and the EMA's final accuracy and the
    test split (read once after training) get columns and seed means of their own."""
    from vit.analysis.runs import read_runs, seed_rows

    model = {"name": "vit_tiny", "embed_dim": 96, "num_heads": 3}
    values = {
        ("standard", "0"): (60.0, 61.0, 58.0),
        ("standard", "1"): (62.0, 64.0, 59.0),
        ("spt", "0"): (65.0, 66.0, 63.0),
    }
    for i, ((embed, seed), (val, ema, test)) in enumerate(values.items()):
        metrics = {
            "val_split": "holdout",
            "final": {"val_top1": val, "val_ema_top1": ema},
            "best": {"val_top1": val},
            "test": {"split": "test", "top1": test, "ema_top1": test + 1.0},
            "wall_time_s": 100.0,
        }
        fake_run(tmp_path / str(i), [f"model.patch_embed={embed}", f"trainer.seed={seed}"], model, metrics)
    records = read_runs(tmp_path)
    header, rows = summary_rows(records)
    assert header[-6:] == [
        "final holdout top-1",
        "best holdout top-1",
        "final EMA top-1",
        "test top-1",
        "test EMA top-1",
        "run s",
    ]
    assert rows[1][-6:] == ["62.00", "62.00", "64.00", "59.00", "60.00", "100.0"]
    header, rows = seed_rows(records)
    assert header == [
        "model.patch_embed",
        "seeds",
        "final holdout top-1 mean",
        "min - max",
        "final EMA top-1 mean",
        "test top-1 mean",
        "test EMA top-1 mean",
        "run s mean",
    ]
    assert rows == [
        ["standard", "2", "61.00", "60.00 - 62.00", "62.50", "58.50", "59.50", "100.0"],
        ["spt", "1", "65.00", "65.00 - 65.00", "66.00", "63.00", "64.00", "100.0"],
    ]


def test_a_screen_of_many_levers_gets_one_overrides_column(tmp_path):
    """Runs that each set other keys (a lever screen, not a sweep of one knob): one column naming each run's own
    swept overrides, and the seeds of a lever grouped together."""
    from vit.analysis.runs import read_runs, seed_rows

    model = {"name": "vit_tiny", "embed_dim": 96, "num_heads": 3}
    levers = {
        "base": [],
        "spt_lsa": ["model.patch_embed=spt", "model.lsa=true"],
        "erase": ["data.augment.re_prob=0.25"],
        "noaug": ["data.augment.auto_augment=null"],
    }
    for i, (name, overrides) in enumerate(levers.items()):
        for seed in (0, 1):
            metrics = {"final": {"val_top1": 50.0 + i + seed}, "wall_time_s": 10.0}
            fake_run(
                tmp_path / name / f"seed{seed}",
                ["experiment=cifar10_proxy", *overrides, f"trainer.seed={seed}"],
                model,
                metrics,
            )
    records = read_runs(tmp_path)
    header, rows = summary_rows(records)
    assert header[:2] == ["run", "overrides"]
    by_run = {row[0]: row[1] for row in rows}
    assert by_run["base/seed0"] == "trainer.seed=0"
    assert by_run["spt_lsa/seed1"] == "model.lsa=true model.patch_embed=spt trainer.seed=1"
    header, rows = seed_rows(records)
    assert header[:5] == ["overrides", "seeds", "final top-1 mean", "min - max", "vs baseline"]
    assert [row[:4] for row in rows] == [
        ["-", "2", "50.50", "50.00 - 51.00"],
        ["data.augment.re_prob=0.25", "2", "52.50", "52.00 - 53.00"],
        ["data.augment.auto_augment=null", "2", "53.50", "53.00 - 54.00"],
        ["model.lsa=true model.patch_embed=spt", "2", "51.50", "51.00 - 52.00"],
    ]
    assert [row[4] for row in rows] == ["+0.00", "+2.00", "+3.00", "+1.00"]  # each mean minus the baseline's


def test_a_pretraining_sweep_is_summarised_by_its_reconstruction_loss(tmp_path):
    """task=mae runs have no top-1: the table gains their final reconstruction loss, and only then."""
    model = {"name": "vit_tiny", "embed_dim": 32}
    for n, loss in enumerate((0.5123, 0.4821)):
        metrics = {"task": "mae", "final": {"val_top1": None, "val_loss": loss}, "params": 1e5}
        fake_run(tmp_path / "mae" / str(n), [f"mae.mask_ratio={0.6 + 0.15 * n}"], model, metrics)
    header, rows = summary_rows(read_runs(tmp_path / "mae"))
    column = header.index("final reconstruction loss")
    assert [row[column] for row in rows] == ["0.5123", "0.4821"]
    fake_run(tmp_path / "cls" / "0", ["model.depth=2"], model, {"final": {"val_top1": 50.0, "val_loss": 1.2}})
    header, _ = summary_rows(read_runs(tmp_path / "cls"))
    assert "final reconstruction loss" not in header
