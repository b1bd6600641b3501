"""Foundation ViTs from their timm names: `model.pretrained=timm:<name>` builds our ViT with timm's architecture
(read from timm, vit/models/foundation.py) and `model.pretrained_file=<file>` gives its weights offline. For each
family timm's random model, every parameter moved off its init (so zero-init parts such as LayerScale, the
attention-pool query and biases count), is saved as a file; ours built from the name and that file gives timm's
logits within 1e-5 and every gradient within 1e-5 of the largest reference entry, at the model's native size and
at a second one (against timm's `set_input_size`), and its ONNX export gives timm's logits in onnxruntime.

Families at 1 block to keep the file short (timm's `depth=` builds a shorter model of the same family on both
sides); one full-depth model through the trainer's own config path (EVA-02-Ti, the smallest)."""

import importlib
import logging

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file
from trainer_utils import (
    FOUNDATION_FAMILIES,
    QUICK_SYNTHETIC,
    compose_config,
    load_script,
    make_tree,
    scales_by_name,
    train_exit_line,
)

from vit.cli.args import run_script
from vit.deploy.export import run_onnx, write_onnx
from vit.models.foundation import timm_architecture
from vit.models.vit import VisionTransformer, ViTConfig
from vit.tasks.build import build_model_from_config
from vit.train.finetune import load_pretrained_weights, read_pretrained
from vit.weights.read import load_pretrained, read_weights
from vit.weights.timm_names import timm_keys_to_ours

setup_phase = importlib.import_module("vit.train.setup")
resume_phase = importlib.import_module("vit.train.resume")
export_script = load_script("export")

# The smallest of each family (and the parts only a larger size has: EVA-02-B's inner MLP norm and separate q, k, v
# projections; DINOv3-S+'s SwiGLU). CLIP with GELU (`vit_base_patch16_clip_224`) differs from the QuickGELU one
# only in the activation, which every other family here tests.
FAMILIES = [
    "deit3_small_patch16_224",
    "vit_small_patch14_reg4_dinov2",
    "vit_small_patch16_dinov3",
    "vit_small_plus_patch16_dinov3",
    "vit_base_patch16_siglip_224",
    "vit_base_patch16_clip_quickgelu_224",
    "eva02_tiny_patch14_224",
    "eva02_base_patch14_224",
]
CPU_DEVICE = torch.device("cpu")
CPU = ["trainer.device=cpu", "trainer.attn_maps_every_n_epochs=0", "trainer.ema=false"]


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    return model


def timm_file(name: str, path, **kwargs) -> tuple[torch.nn.Module, str]:
    torch.manual_seed(0)
    theirs = perturbed(timm.create_model(name, pretrained=False, num_classes=7, **kwargs)).eval()
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(path))
    return theirs, str(path)


def differences(ours: torch.nn.Module, theirs: torch.nn.Module, size: int) -> tuple[float, float]:
    """(max |logit difference|, max gradient difference relative to the largest reference entry, at least 1)."""
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(2))
    out, ref = ours(x), theirs(x)
    assert out.shape == ref.shape
    out.square().sum().backward()
    ref.square().sum().backward()
    their_grads = timm_keys_to_ours({k: p.grad for k, p in theirs.named_parameters()})
    worst = 0.0
    for key, param in ours.named_parameters():
        g_ref = their_grads[key]
        worst = max(worst, ((param.grad - g_ref).abs().max() / max(1.0, g_ref.abs().max())).item())
    return (out - ref).abs().max().item(), worst


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_from_its_timm_name_and_a_file_computes_timms_numbers(name, tmp_path):
    theirs, path = timm_file(name, tmp_path / f"{name}.safetensors", depth=1)
    arch = timm_architecture(name, depth=1)
    ours = VisionTransformer(ViTConfig(**arch.settings, num_classes=7))
    load_pretrained(ours, read_weights(f"timm:{name}", file=path))  # strict, after the reader's layout
    logits, grads = differences(ours.eval(), theirs, arch.img_size)
    assert logits <= 1e-5 and grads <= 1e-5, (logits, grads)


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_at_a_second_resolution_computes_what_timm_computes_after_set_input_size(name, tmp_path):
    """At a grid of 10 x 10 patches, native to none of the families: ours built at that size from the name and the
    file (the position table resampled as it loads, the rotary positions laid over the new grid) against timm's
    model given the same file, then `set_input_size` to that size."""
    theirs, path = timm_file(name, tmp_path / f"{name}.safetensors", depth=1)
    arch = timm_architecture(name, depth=1)
    size = 10 * arch.settings["patch_size"]
    assert size != arch.img_size
    ours = VisionTransformer(ViTConfig(**{**arch.settings, "img_size": size}, num_classes=7))
    load_pretrained(ours, read_weights(f"timm:{name}", file=path))
    theirs.set_input_size(img_size=(size, size))
    logits, grads = differences(ours.eval(), theirs, size)
    assert logits <= 1e-5 and grads <= 1e-5, (logits, grads)


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_exports_to_onnx_and_onnxruntime_gives_timms_logits(name, tmp_path):
    """The exporter's own ONNX writer (dynamic batch) on ours built from the name and the file, run by
    onnxruntime on a batch of 2 (the export traced at 1): the MAP head, rotary variants and registers export."""
    theirs, path = timm_file(name, tmp_path / f"{name}.safetensors", depth=1)
    arch = timm_architecture(name, depth=1)
    ours = VisionTransformer(ViTConfig(**arch.settings, num_classes=7)).eval()
    load_pretrained(ours, read_weights(f"timm:{name}", file=path))
    x = torch.randn(2, 3, arch.img_size, arch.img_size, generator=torch.Generator().manual_seed(3))
    onnx_path = tmp_path / "model.onnx"
    with torch.no_grad():
        write_onnx(ours, x[:1], onnx_path, dynamic=True)
        expected = theirs(x).numpy()
    assert np.abs(run_onnx(onnx_path, x) - expected).max() <= 1e-4


def test_the_export_script_takes_a_timm_name_and_its_file(tmp_path):
    """`vit-export model.pretrained=timm:<name> model.pretrained_file=<file>`: EVA-02-Ti at its 12 blocks,
    exported and checked by the script (on generated images: no data given), then run here against timm."""
    name = "eva02_tiny_patch14_224"
    theirs, path = timm_file(name, tmp_path / "eva02.safetensors")
    output = tmp_path / "eva02.onnx"
    argv = [f"model.pretrained=timm:{name}", f"model.pretrained_file={path}", f"output={output}"]
    assert run_script(export_script.main, argv, usage=export_script.__doc__) == 0
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = theirs(x).numpy()
    assert np.abs(run_onnx(output, x) - expected).max() <= 1e-4


def test_the_architecture_is_timms_and_reads_what_each_family_changes():
    siglip = timm_architecture("vit_base_patch16_siglip_224")
    assert siglip.settings["global_pool"] == "map" and not siglip.settings["class_token"]
    assert (siglip.mean, siglip.std) == ((0.5,) * 3, (0.5,) * 3)
    clip = timm_architecture("vit_base_patch16_clip_quickgelu_224").settings
    assert clip["norm_pre"] and not clip["patch_bias"] and clip["mlp"] == "quick_gelu" and clip["norm_eps"] == 1e-5
    dinov3 = timm_architecture("vit_small_patch16_dinov3").settings
    assert dinov3["pos_embed"] == "rope_dinov3" and not dinov3["qkv_bias"] and dinov3["reg_tokens"] == 4
    eva = timm_architecture("eva02_tiny_patch14_224").settings
    assert eva["pos_embed"] == "learned_rope" and eva["rope_ref_grid"] == 16 and not eva["k_bias"]
    with pytest.raises(ValueError, match="ConvNeXt"):
        timm_architecture("convnext_atto")


def test_full_depth_through_the_config_path_with_a_kept_override(tmp_path):
    """EVA-02-Ti, all 12 blocks, from `model.pretrained=timm:... model.pretrained_file=...` as the trainer builds
    and loads it; model.drop_path_rate (a kept setting) stays, and eval mode makes it inert."""
    name = "eva02_tiny_patch14_224"
    theirs, path = timm_file(name, tmp_path / "eva02.safetensors")
    overrides = [
        f"model.pretrained=timm:{name}",
        f"model.pretrained_file={path}",
        "data=imagefolder",
        "data.num_classes=7",
    ]
    cfg = compose_config([*overrides, "model.drop_path_rate=0.2"])
    ours = build_model_from_config(cfg.model, num_classes=7)
    assert len(ours.blocks) == 12 and ours.blocks[-1].drop_path1.drop_prob == pytest.approx(0.2)
    load_pretrained_weights(ours, read_pretrained(cfg.model, ours))
    logits, grads = differences(ours.eval(), theirs, 224)
    assert logits <= 1e-5 and grads <= 1e-5, (logits, grads)


def test_an_architecture_setting_given_on_top_is_named_in_one_line(caplog):
    cfg = compose_config(["model=vit_small", "model.embed_dim=192", "model.pretrained=timm:deit3_small_patch16_224"])
    with caplog.at_level(logging.INFO, logger="vit.tasks.build"):
        model = build_model_from_config(cfg.model, num_classes=3)
    assert model.embed_dim == 384 and model.no_embed_class  # timm's architecture
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert ignored == [
        "model.pretrained=timm:deit3_small_patch16_224 fixes the architecture; ignored: model.embed_dim=192 "
        "(timm's: 384)"
    ]
    caplog.clear()  # the registry's own values (vit_tiny's 192 wide, 3 heads) are no choice: nothing to say
    with caplog.at_level(logging.INFO, logger="vit.tasks.build"):
        build_model_from_config(compose_config(["model.pretrained=timm:deit3_small_patch16_224"]).model, 3)
    assert not [r for r in caplog.records if "ignored" in r.getMessage()]


def exit_line(overrides, tmp_path, monkeypatch, capsys) -> str:
    return train_exit_line(["data=synthetic", "data.num_classes=5", *CPU, *overrides], tmp_path, monkeypatch, capsys)


def test_bad_names_and_files_are_one_line_exit_2(tmp_path, monkeypatch, capsys):
    line = exit_line(["model.pretrained=timm:vit_small_patch14_reg4_dinov3"], tmp_path, monkeypatch, capsys)
    assert line.startswith("checkpoint error: model.pretrained='timm:vit_small_patch14_reg4_dinov3': timm has no")
    missing = tmp_path / "absent.safetensors"
    line = exit_line(
        ["model.pretrained=timm:deit3_small_patch16_224", f"model.pretrained_file={missing}", "data.img_size=224"],
        tmp_path,
        monkeypatch,
        capsys,
    )
    assert line.endswith(f"model.pretrained_file='{missing}': no such file")
    line = exit_line([f"model.pretrained_file={missing}"], tmp_path, monkeypatch, capsys)
    assert "model.pretrained_file=" in line and "model.pretrained is None" in line


def test_timms_preprocessing_goes_to_the_data_unless_set(caplog):
    """SigLIP's pretrained config: mean and std 0.5, crop 0.9, bicubic; DINOv2's crop 1.0. A value the config sets
    stays, and the line says so."""
    import timm

    caplog.set_level("INFO", logger="vit.train")
    cfg = compose_config(["data=synthetic", "model.pretrained=timm:vit_base_patch16_siglip_224"])
    setup_phase.use_timm_preprocessing(cfg)
    timms = timm.get_pretrained_cfg("vit_base_patch16_siglip_224")
    assert list(cfg.data.mean) == list(timms.mean) == [0.5] * 3 and list(cfg.data.std) == [0.5] * 3
    assert (cfg.data.crop_pct, cfg.data.interpolation) == (timms.crop_pct, timms.interpolation) == (0.9, "bicubic")
    cfg = compose_config(["data=synthetic", "model.pretrained=timm:vit_small_patch14_reg4_dinov2"])
    setup_phase.use_timm_preprocessing(cfg)
    assert cfg.data.crop_pct == timm.get_pretrained_cfg("vit_small_patch14_reg4_dinov2").crop_pct == 1.0
    caplog.clear()
    given = ["data.mean=[0.1,0.2,0.3]", "data.crop_pct=0.8", "data.interpolation=bilinear"]
    cfg = compose_config(["data=synthetic", "model.pretrained=timm:vit_base_patch16_siglip_224", *given])
    setup_phase.use_timm_preprocessing(cfg)
    assert list(cfg.data.mean) == [0.1, 0.2, 0.3] and cfg.data.std is None
    assert (cfg.data.crop_pct, cfg.data.interpolation) == (0.8, "bilinear")
    assert "as the config sets: data.crop_pct=0.8, data.interpolation=bilinear, data.mean/data.std" in caplog.text


def test_a_run_fine_tuned_from_a_timm_name_is_rebuilt_from_its_checkpoint(tmp_path):
    """One step of EVA-02-Ti from its timm name and a file, at 32 px with patch 4 (table and kernel resampled); its
    last.pt, whose config holds model.pretrained=timm:<name>, builds the same model again for evaluate.py and
    export.py (vit/deploy/loaded_model.py), every weight in place."""
    from vit.deploy.loaded_model import build_model
    from vit.train import run
    from vit.weights.read import load_checkpoint

    name = "eva02_tiny_patch14_224"
    _, path = timm_file(name, tmp_path / "eva02.safetensors")
    overrides = [f"model.pretrained=timm:{name}", f"model.pretrained_file={path}", *QUICK_SYNTHETIC, *CPU]
    overrides += ["data.img_size=32", "data.patch_size=4", "trainer.epochs=1", "trainer.limit_train_batches=1"]
    overrides += ["trainer.limit_val_batches=1", "data.batch_size=4"]
    run(compose_config(overrides), output_dir=tmp_path / "run")
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    rebuilt = build_model(read_weights(checkpoint), str(checkpoint)).model
    trained = load_checkpoint(checkpoint)["model"]
    assert len(rebuilt.blocks) == 12 and rebuilt.patch_embed.proj.kernel_size == (4, 4)
    assert rebuilt.state_dict().keys() == trained.keys()
    for key, value in rebuilt.state_dict().items():
        assert torch.equal(value, trained[key].float()), key


# --- layer decay and freezing with registers, without a cls token, with the attention-pool head -----------------

FINE_TUNED = [
    "vit_small_patch14_reg4_dinov2",  # 4 registers beside the cls token
    "vit_base_patch16_siglip_224",  # no cls token, attention-pool head
    "vit_base_patch16_clip_quickgelu_224",  # the norm before the blocks
    "vit_small_patch16_dinov3",  # Eva's layout: rotary positions, registers, mean pooling after the norm
    "eva02_tiny_patch14_224",
]


@pytest.mark.parametrize("name", FINE_TUNED)
def test_layer_decay_gives_each_parameter_timms_scale(name):
    """`optim.layer_decay` on a model built from a timm name puts every parameter at the layer timm's own
    `param_groups_layer_decay` gives it on timm's model: registers, norm_pre and the position table with the
    stem, the attention pool with the head. Weight decay as timm's, except the attention pool's learned query,
    which ours keeps out of weight decay as it does the cls and register tokens."""
    from timm.optim import param_groups_layer_decay

    from vit.train.optimizer import build_optimizer

    theirs = timm.create_model(name, pretrained=False, num_classes=7, depth=3)
    groups = param_groups_layer_decay(theirs, 0.05, theirs.no_weight_decay(), layer_decay=0.7)
    expected = timm_keys_to_ours(scales_by_name(theirs, groups))  # Eva's parameter names in ours
    ours = VisionTransformer(ViTConfig(**timm_architecture(name, depth=3).settings, num_classes=7))
    optimizer = build_optimizer(ours, {"name": "adamw", "weight_decay": 0.05, "layer_decay": 0.7}, 1e-3, CPU_DEVICE)
    got = scales_by_name(ours, optimizer.param_groups)
    assert got.keys() == expected.keys()
    for key, (scale, decay) in got.items():
        assert scale == pytest.approx(expected[key][0]), key
        assert decay == (0.0 if key == "attn_pool.latent" else expected[key][1]), key
    stem = 0.7**4  # three blocks below the head: the stem at layer 0 of 4
    for key in ("reg_token", "norm_pre.weight", "pos_embed", "patch_embed.proj.weight"):
        assert key not in got or got[key][0] == pytest.approx(stem), key
    assert all(got[k][0] == 1.0 for k in got if k.startswith(("head.", "attn_pool.")))


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "vit_base_patch16_siglip_224"])
def test_a_frozen_backbone_trains_the_head_alone_with_registers_or_an_attention_pool(name, tmp_path):
    """`model.freeze=backbone` on DINOv2 with registers and on SigLIP (no cls token, attention pool): only the
    classifier trains; the registers and the attention pool, part of the source's features, keep its values,
    so the pooled features before and after a training step are the same."""
    from vit.train.finetune import freeze
    from vit.train.optimizer import build_optimizer

    _, path = timm_file(name, tmp_path / "w.safetensors", depth=1)
    arch = timm_architecture(name, depth=1)
    ours = VisionTransformer(ViTConfig(**arch.settings, num_classes=7))
    load_pretrained(ours, read_weights(f"timm:{name}", file=path))
    trainable, total = freeze(ours, "backbone")
    assert {n for n, p in ours.named_parameters() if p.requires_grad} == {"head.weight", "head.bias"}
    assert trainable == ours.head.weight.numel() + ours.head.bias.numel() < total
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    optimizer = build_optimizer(ours, {"name": "adamw", "weight_decay": 0.05, "layer_decay": 0.75}, 1e-2, CPU_DEVICE)
    x = torch.randn(2, 3, arch.img_size, arch.img_size, generator=torch.Generator().manual_seed(3))
    features = ours.eval().forward_head(ours.forward_features(x), pre_logits=True)
    torch.nn.functional.cross_entropy(ours.train()(x), torch.tensor([1, 4])).backward()
    optimizer.step()
    changed = {k for k, v in ours.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"head.weight", "head.bias"}
    after = ours.eval().forward_head(ours.forward_features(x), pre_logits=True)
    assert torch.equal(features, after)


# --- the fine-tuning recipe for any family ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "vit_base_patch16_siglip_224"])
def test_the_finetune_recipe_takes_any_family_by_its_name(name, tmp_path):
    """`experiment=finetune model.pretrained=timm:<name>`: timm's architecture and timm's preprocessing for the
    name (the recipe leaves them null), the recipe's own training settings."""
    from vit.train.config import validate

    cfg = compose_config(["experiment=finetune", f"model.pretrained=timm:{name}", f"data.root={tmp_path}"])
    validate(cfg)
    setup_phase.use_timm_preprocessing(cfg)
    timms = timm.get_pretrained_cfg(name)
    assert (list(cfg.data.mean), list(cfg.data.std)) == (list(timms.mean), list(timms.std))
    assert (cfg.data.crop_pct, cfg.data.interpolation) == (timms.crop_pct, timms.interpolation)
    arch = timm_architecture(name).settings
    model = build_model_from_config(cfg.model, num_classes=5)
    assert (model.embed_dim, len(model.blocks), model.num_prefix_tokens) == (
        arch["embed_dim"],
        arch["depth"],
        int(arch["class_token"]) + arch["reg_tokens"],
    )
    assert (cfg.data.img_size, cfg.optim.layer_decay, cfg.model.drop_path_rate) == (224, 0.75, 0.1)


@pytest.mark.parametrize("name", FOUNDATION_FAMILIES)
def test_the_finetune_recipe_trains_each_family_from_a_name_and_a_file(name, tmp_path):
    """The recipe end to end on generated folders: the family's model from its name and a file, at a 2x2 grid of
    its patches, for one step; the config its checkpoint saves holds timm's preprocessing for the name, and the
    model is timm's architecture at full depth with a head of the folders' 3 classes."""
    from vit.train import run
    from vit.weights.read import load_checkpoint

    _, path = timm_file(name, tmp_path / "weights.safetensors")
    arch = timm_architecture(name).settings
    size = 2 * arch["patch_size"]
    root = make_tree(tmp_path / "folders", classes=("a", "b", "c"), per_class=4, size=size)
    overrides = ["experiment=finetune", f"model.pretrained=timm:{name}", f"model.pretrained_file={path}"]
    overrides += [f"data.root={root}", f"data.img_size={size}", "data.batch_size=4", "data.num_workers=0", *CPU]
    overrides += ["trainer.epochs=1", "trainer.limit_train_batches=1", "data.augment.auto_augment=null"]
    run(compose_config(overrides), output_dir=tmp_path / "run")
    trained = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert trained["step"] == 1 and trained["model"]["head.weight"].shape == (3, arch["embed_dim"])
    assert sum(key.endswith(".attn.proj.weight") for key in trained["model"]) == arch["depth"]
    saved, timms = trained["config"]["data"], timm.get_pretrained_cfg(name)
    assert list(saved["mean"]) == list(timms.mean) and saved["crop_pct"] == timms.crop_pct


# --- the record of a run built from a timm name --------------------------------------------------------------------


def test_a_run_from_a_timm_name_records_the_model_it_built(tmp_path, caplog):
    """EVA-02-Ti from its timm name under `model=vit_small` (384 wide, 6 heads: a config whose architecture timm's
    replaces) trains a step; every record says the model built, 192 wide, 12 deep, 3 heads, under its timm name:
    the model line of the log, metrics.json, the checkpoint's config (which evaluate/export/predict, a fine-tuning
    from the checkpoint and resume read) and .hydra/model_built.yaml. Rerunning the command still finds the run
    for trainer.resume=auto."""
    import yaml

    from vit.deploy.loaded_model import build_model
    from vit.train import run
    from vit.weights.read import load_checkpoint

    name = "eva02_tiny_patch14_224.mim_in22k"
    _, path = timm_file(name, tmp_path / "eva02.safetensors")
    overrides = ["model=vit_small", f"model.pretrained=timm:{name}", f"model.pretrained_file={path}", *CPU]
    overrides += [*QUICK_SYNTHETIC, "data.img_size=32", "data.patch_size=4", "data.batch_size=4"]
    overrides += ["trainer.epochs=1", "trainer.limit_train_batches=1", "trainer.limit_val_batches=1"]
    run_dir = tmp_path / "outputs" / "2026-01-01" / "10-00-00"  # Hydra's layout, which resume=auto searches
    caplog.set_level(logging.INFO, logger="vit.train")
    run(compose_config(overrides), output_dir=run_dir)
    built = {"embed_dim": 192, "depth": 12, "num_heads": 3, "mlp": "swiglu", "pos_embed": "learned_rope"}

    lines = [r.getMessage() for r in caplog.records if "M params" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"timm:{name}: 5.36 M params"), lines
    metrics = __import__("json").loads((run_dir / "metrics.json").read_text())
    assert metrics["model"] == f"timm:{name}"
    assert {k: metrics["architecture"][k] for k in built} == built
    assert metrics["architecture"]["patch_size"] == 4 and metrics["architecture"]["img_size"] == 32  # kept
    checkpoint = run_dir / "checkpoints" / "last.pt"
    saved = load_checkpoint(checkpoint)["config"]["model"]
    assert saved["name"] == f"timm:{name}" and {k: saved[k] for k in built} == built
    assert yaml.safe_load((run_dir / ".hydra" / "model_built.yaml").read_text()) == saved
    # what evaluate/export/predict report and rebuild; a fine-tuning from the checkpoint reads its heads
    loaded = build_model(read_weights(checkpoint), str(checkpoint))
    assert loaded.name == f"timm:{name}" and loaded.model.embed_dim == 192 and len(loaded.model.blocks) == 12
    assert read_weights(checkpoint).num_heads == 3
    # the same command again: trainer.resume=auto compares its config, as the run records it, with the run's
    second = run_dir.parent / "11-00-00"
    for source, found in ((name, checkpoint), ("eva02_small_patch14_224", None)):
        again = compose_config([*overrides, f"model.pretrained=timm:{source}", "trainer.resume=auto"])
        setup_phase.use_timm_preprocessing(again)  # as build_setup does first
        assert resume_phase.resume_checkpoint_path("auto", second, resume_phase.recorded_config(again)) == found


# --- a file that is not the weights of the timm name ---------------------------------------------------------------


def test_a_file_of_another_model_under_a_timm_name_names_the_fixes_that_work(tmp_path, monkeypatch, capsys):
    """An EVA-02-Ti file given as the weights of DINOv2-S: the name fixes the architecture, so the line says the file
    is not that name's weights (its width and depth; no heads, which the file does not say, least of all the
    name's 6) and names the fixes that work, never a model.<key>: the name's own file, or the file's own name,
    which then loads; evaluate's pair says the same."""
    import re

    from vit.deploy.loaded_model import WeightsError, build_model, read_source

    name = "vit_small_patch14_dinov2.lvd142m"
    _, path = timm_file("eva02_tiny_patch14_224", tmp_path / "eva02.safetensors")
    pair = [f"model.pretrained=timm:{name}", f"model.pretrained_file={path}"]
    line = exit_line(pair, tmp_path, monkeypatch, capsys)
    assert f"{path} does not hold the weights of timm:{name}: it holds a model 192 wide and 12 deep, " in line
    assert f"timm:{name} is 384 wide and 12 deep with 6 heads; give the file of timm:{name}'s weights" in line
    assert "model.embed_dim" not in line and "model.num_heads" not in line
    suggested = re.search(r"as model\.pretrained=(timm:\S+) ", line).group(1)
    assert suggested == "timm:eva02_tiny_patch14_224"
    cfg = compose_config(["data=synthetic", f"model.pretrained={suggested}", f"model.pretrained_file={path}"])
    model = build_model_from_config(cfg.model, num_classes=5)
    assert read_pretrained(cfg.model, model).timm_model == "eva02_tiny_patch14_224"
    with pytest.raises(WeightsError, match=f"does not hold the weights of timm:{name}: it holds a model 192 wide"):
        build_model(read_source(f"timm:{name}", file=path), f"timm:{name}", file=path)


def test_the_heads_said_of_a_file_under_a_timm_name_are_the_files_own(tmp_path):
    """A file whose qk-norm says its heads (384 wide in 12 heads of 32) under DeiT III-S's name (6 heads): the line
    gives the file its own 12 heads and the name its 6."""
    from vit.weights.fit import PretrainedError, fit_state_dict

    name = "deit3_small_patch16_224"
    _, path = timm_file(name, tmp_path / "w.safetensors", qk_norm=True, num_heads=12)
    model = build_model_from_config(compose_config([f"model.pretrained=timm:{name}"]).model, num_classes=7)
    weights = read_weights(f"timm:{name}", file=path)
    with pytest.raises(PretrainedError) as error:
        fit_state_dict(weights, model)
    assert f"it holds a model 384 wide and 12 deep with 12 heads, timm:{name} is 384 wide and 12 deep with 6 heads" in (
        str(error.value)
    )


def test_resume_auto_still_finds_a_timm_named_run_recorded_with_its_composed_model(tmp_path):
    """A run of model.pretrained=timm:<name> whose checkpoints were written before they recorded the model built
    holds the composed model config (vit_small's 384 wide): the same command finds it for trainer.resume=auto."""
    from omegaconf import OmegaConf

    cfg = compose_config(["model=vit_small", "model.pretrained=timm:eva02_tiny_patch14_224", "data=synthetic"])
    setup_phase.use_timm_preprocessing(cfg)  # as build_setup does first
    composed = OmegaConf.to_container(cfg, resolve=True)
    old = tmp_path / "outputs" / "2026-01-01" / "09-00-00" / "checkpoints" / "last.pt"
    old.parent.mkdir(parents=True)
    torch.save({"model": {}, "config": composed}, old)
    recorded = resume_phase.recorded_config(cfg)
    assert recorded["model"] != composed["model"]
    second = tmp_path / "outputs" / "2026-01-01" / "10-00-00"
    assert resume_phase.resume_checkpoint_path("auto", second, recorded) is None
    assert resume_phase.resume_checkpoint_path("auto", second, recorded, composed["model"]) == old
