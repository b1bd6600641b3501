"""Foundation ViTs from their timm names: `model.pretrained=timm:<name>` builds our ViT with timm's architecture
(read from timm, vit/models/foundation.py) and `model.pretrained_file=<file>` gives its weights offline. For each
family timm's random model, every parameter moved off its init (so zero-init parts such as LayerScale, the
attention-pool query and biases count), is saved as a file; ours built from the name and that file gives timm's
logits within 1e-5 and every gradient within 1e-5 of the largest reference entry, at the model's native size.

Families at 1 block to keep the file short (timm's `depth=` builds a shorter model of the same family on both
sides); one full-depth model through the trainer's own config path (EVA-02-Ti, the smallest)."""

import importlib
import logging

import pytest
import timm
import torch
from safetensors.torch import save_file
from trainer_utils import QUICK_SYNTHETIC, compose_config, train_exit_line

from vit.engine.build import build_model_from_config
from vit.engine.weights import eva_to_vit_keys, load_pretrained, read_weights
from vit.models.foundation import timm_architecture
from vit.models.vit import VisionTransformer, ViTConfig
from vit.train.finetune import load_pretrained_weights, read_pretrained

setup_phase = importlib.import_module("vit.train.setup")

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
    their_grads = eva_to_vit_keys({k: p.grad for k, p in theirs.named_parameters()})
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
    with caplog.at_level(logging.INFO, logger="vit.engine.build"):
        model = build_model_from_config(cfg.model, num_classes=3)
    assert model.embed_dim == 384 and model.no_embed_class  # timm's architecture
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert ignored == [
        "model.pretrained=timm:deit3_small_patch16_224 fixes the architecture; ignored: model.embed_dim=192 "
        "(timm's: 384)"
    ]
    caplog.clear()  # the registry's own values (vit_tiny's 192 wide, 3 heads) are no choice: nothing to say
    with caplog.at_level(logging.INFO, logger="vit.engine.build"):
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
    export.py (vit/deploy/weights.py), every weight in place."""
    from vit.deploy.weights import build_model
    from vit.engine.weights import load_checkpoint
    from vit.train import run

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
