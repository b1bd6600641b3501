"""Today's ViT variants (qk-norm, registers, rotary positions, SwiGLU, any input size) against timm's reference
models with the same weights, and through the rest of the project: training, exact resume, ONNX export, the
config's refusals."""

import copy
import re

import numpy as np
import onnxruntime as ort
import pytest
import timm
import torch
from einops import rearrange
from omegaconf import OmegaConf
from torch import nn
from trainer_utils import (
    QUICK_SYNTHETIC,
    REPO,
    TINY_MODEL,
    assert_resumes_exactly,
    compose_config,
    load_script,
    run_cli,
)

from vit.cli.args import run_script
from vit.errors import ConfigError
from vit.models import create_model
from vit.tasks.build import build_model_from_config
from vit.train import run
from vit.weights.read import load_checkpoint, load_pretrained
from vit.weights.timm_names import timm_keys_to_ours

SMALL = {"img_size": 64, "num_classes": 10}  # 4 x 4 patches of 16: every part of the model, at a test's cost

# name: (our model and overrides, timm's reference and its overrides). The references are timm's own model
# functions, sized down to 64 px (and the SwiGLU one to ViT-S width and 2 blocks, from DINOv2-g's 40 x 1536).
REFERENCES = {
    "qk_norm": (("vit_small", {"qk_norm": True}), ("vit_small_patch16_224", {"qk_norm": True})),
    "registers": (
        ("vit_base", {"reg_tokens": 4, "class_token": False, "no_embed_class": True, "global_pool": "avg"}),
        ("vit_base_patch16_reg4_gap_256", {}),
    ),
    "rope": (
        ("vit_small", {"pos_embed": "rope", "init_values": 1e-5}),
        ("vit_small_patch16_rope_224", {}),
    ),
    "rope_mixed": (
        ("vit_small", {"pos_embed": "rope_mixed", "init_values": 1e-5}),
        ("vit_small_patch16_rope_mixed_224", {}),
    ),
    "swiglu": (
        ("vit_small", {"mlp": "swiglu", "mlp_ratio": 2.66667 * 2, "init_values": 1e-5, "depth": 2, "patch_size": 14}),
        ("vit_giant_patch14_dinov2", {"embed_dim": 384, "depth": 2, "num_heads": 6}),
    ),
}


def perturbed(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter moved off its init (LayerNorms off 1 and 0, LayerScale off 1e-5, zero biases and tokens
    made non-zero), so a weight that is loaded but not used, or used in the wrong place, shows in the outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    return model


def ours_and_timms(variant: str, img_size: int = 64, depth: int | None = None, perturb: bool = True):
    """Our model and timm's reference for `variant`, timm's perturbed (unless `perturb` is false); `depth`: both cut
    to that many blocks."""
    (name, overrides), (timm_name, timm_kwargs) = REFERENCES[variant]
    if overrides.get("patch_size") == 14:
        img_size = 56
    cut = {} if depth is None else {"depth": depth}
    theirs = timm.create_model(timm_name, pretrained=False, img_size=img_size, num_classes=10, **{**timm_kwargs, **cut})
    theirs = (perturbed(theirs) if perturb else theirs).eval()
    ours = create_model(name, **{**SMALL, "img_size": img_size, **overrides, **cut}).eval()
    return ours, theirs, img_size


def their_state_dict(theirs: nn.Module) -> dict:
    state = theirs.state_dict()
    return timm_keys_to_ours(state) if type(theirs).__name__ == "Eva" else state


def assert_same_numbers(ours: nn.Module, theirs: nn.Module, x: torch.Tensor) -> None:
    """Logits within 1e-5 and every gradient within 1e-5 of the largest reference entry (the bounds of the
    plain ViT's timm test, tests/models/test_vit.py)."""
    out, ref = ours(x), theirs(x)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 1e-5
    out.square().sum().backward()
    ref.square().sum().backward()
    their_grads = {k: p.grad for k, p in their_state_dict_params(theirs).items()}
    for key, param in ours.named_parameters():
        g, g_ref = param.grad, their_grads[key]
        bound = 1e-5 * max(1.0, g_ref.abs().max().item())
        assert (g - g_ref).abs().max().item() <= bound, key


def their_state_dict_params(theirs: nn.Module) -> dict:
    params = dict(theirs.named_parameters())
    return timm_keys_to_ours(params) if type(theirs).__name__ == "Eva" else params


@pytest.mark.parametrize("variant", list(REFERENCES))
def test_each_variant_loads_timms_weights_strictly_and_computes_timms_numbers(variant):
    # The whole models' parameter names and shapes, built on the meta device (nothing allocated or initialised) ...
    with torch.device("meta"):
        whole_ours, whole_theirs, _ = ours_and_timms(variant, perturb=False)
    theirs_meta = their_state_dict(whole_theirs)
    assert {k: v.shape for k, v in whole_ours.state_dict().items()} == {k: v.shape for k, v in theirs_meta.items()}
    # ... and the numbers two blocks deep (every block is the same code; the registers' ViT-B took 8 s whole).
    torch.manual_seed(0)
    ours, theirs, size = ours_and_timms(variant, depth=2)
    state = their_state_dict(theirs)
    assert sorted(ours.state_dict()) == sorted(state)
    ours.load_state_dict(state, strict=True)
    assert_same_numbers(ours, theirs, torch.randn(2, 3, size, size))


@pytest.mark.parametrize("variant", ["qk_norm", "registers", "rope", "rope_mixed"])
def test_a_timm_file_of_each_variant_loads_through_model_pretrained(variant, tmp_path):
    """The weights' reader: a timm-layout file of the variant (an Eva layout for the rotary ones) loads into the
    configured model and gives timm's logits."""
    torch.manual_seed(0)
    ours, theirs, size = ours_and_timms(variant, depth=2)
    path = tmp_path / "weights.pth"
    torch.save(theirs.state_dict(), path)
    load_pretrained(ours, str(path))
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("variant", ["plain", "registers", "rope", "rope_mixed"])
def test_any_input_size_equals_timms_dynamic_img_size(variant):
    """One model at three input sizes (two of them not square) against timm's `dynamic_img_size=True` model."""
    (name, overrides), (timm_name, timm_kwargs) = REFERENCES.get(
        variant, (("vit_small", {}), ("vit_small_patch16_224", {}))
    )
    ours = create_model(name, **SMALL, **overrides, depth=2, dynamic_img_size=True).eval()
    theirs = timm.create_model(timm_name, img_size=64, num_classes=10, dynamic_img_size=True, depth=2, **timm_kwargs)
    theirs = perturbed(theirs).eval()
    ours.load_state_dict(their_state_dict(theirs), strict=True)
    for height, width in ((64, 64), (96, 48), (32, 80)):
        x = torch.randn(2, 3, height, width)
        with torch.no_grad():
            assert (ours(x) - theirs(x)).abs().max().item() <= 1e-5, (height, width)


def test_prefix_tokens_are_not_rotated_and_registers_are_not_pooled():
    """The cls and register tokens take no rotation (the identity rows of the rotary table) and the average
    pool reads the image's tokens only: changing a register's value changes the logits only through attention."""
    model = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10, pos_embed="rope", reg_tokens=2)
    tables = model.rope(model.grid_size)
    assert len(tables) == 12 and tables[0].shape == (3 + 64, 2 * 64)
    sin, cos = tables[0][:3].chunk(2, dim=-1)
    assert torch.equal(sin, torch.zeros_like(sin)) and torch.equal(cos, torch.ones_like(cos))
    assert model.num_prefix_tokens == 3 and model.pos_embed is None
    assert "reg_token" in model.no_weight_decay() and "pos_embed" not in model.no_weight_decay()


def test_qk_norm_bounds_the_attention_logits():
    """With qk-norm the logits stay bounded however large the tokens grow; without it they grow with them."""
    torch.manual_seed(0)
    plain, normed = (
        create_model("vit_tiny", img_size=32, patch_size=4, qk_norm=q).blocks[0].attn for q in (False, True)
    )
    x = 1000.0 * torch.randn(1, 65, 192)
    logits = []
    for attn in (plain, normed):
        q, k, _ = rearrange(attn.qkv(x), "b n (three h d) -> three b h n d", three=3, h=attn.num_heads)
        q, k = attn.q_norm(q), attn.k_norm(k)
        logits.append((q @ k.transpose(-2, -1)).abs().max().item())
    assert logits[1] <= 64 < 1e4 < logits[0]  # |q·k| <= |q| |k| = head_dim for unit-variance normalised rows


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.class_token=false"], "model.class_token=false needs global_pool=avg"),
        (["model.pos_embed=rope", "model.no_embed_class=true"], "model.no_embed_class=true places a position table"),
        (["model.rope_temperature=50"], "model.rope_temperature=50 is for pos_embed=rope|rope_mixed"),
        (["model.mlp=relu"], "model.mlp='relu' must be one of ('gelu', 'quick_gelu', 'gelu_tanh', 'swiglu')"),
        (["model.reg_tokens=-1"], "model.reg_tokens=-1 must be an integer >= 0"),
        (["model.mlp=swiglu", "model.mlp_ratio=1.5", "model.embed_dim=33", "model.num_heads=3"], "even fc1 width"),
        (["model=t2t_vit_7", "data.img_size=32", "model.dynamic_img_size=true"], "dynamic_img_size=true is for ViTs"),
        (["model.distill_token=true", "model.class_token=false", "model.global_pool=avg"], "needs global_pool=token"),
    ],
)
def test_combinations_that_cannot_work_are_one_config_error_naming_the_key(tmp_path, overrides, message):
    """Each is a ConfigError (train.py: `config error: <it>`, exit 2, the next test) raised before any data is
    read or anything written."""
    cfg = compose_config([*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.device=cpu", *overrides])
    with pytest.raises(ConfigError) as err:
        run(cfg, output_dir=tmp_path / "run")
    assert str(err.value).startswith("model.") and message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_bad_combination_through_train_py(tmp_path):
    done = run_cli(["data=synthetic", "model.class_token=false", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "config error: model.class_token=false needs global_pool=avg, map or seq: global_pool=token reads the cls token"
    )


# Each variant on the tiny model of the trainer tests (32 wide, 2 blocks): a run of a few seconds.
VARIANTS = {
    "qk_norm": ["model.qk_norm=true"],
    "registers": ["model.reg_tokens=2"],
    "registers_gap": [
        "model.reg_tokens=2",
        "model.class_token=false",
        "model.no_embed_class=true",
        "model.global_pool=avg",
    ],
    "rope": ["model.pos_embed=rope"],
    "rope_mixed": ["model.pos_embed=rope_mixed", "model.reg_tokens=1"],
    "factorized": ["model.pos_embed=factorized", "model.no_embed_class=true"],
    "swiglu": ["model.mlp=swiglu", "model.mlp_ratio=2.0"],
    "dynamic": ["model.dynamic_img_size=true", "model.qk_norm=true"],
}
# Every variant in one of three runs (the combinations that work together), each stopped after its first epoch
# and resumed: the learned parts (registers, rotary frequencies, qk-norm, SwiGLU) come back bit for bit.
COMBINED = {
    "qk_norm+registers+rope_mixed+swiglu": [
        "model.qk_norm=true",
        "model.reg_tokens=2",
        "model.pos_embed=rope_mixed",
        "model.mlp=swiglu",
        "model.mlp_ratio=2.0",
    ],
    "registers_gap+factorized+dynamic": [
        *VARIANTS["registers_gap"],
        *VARIANTS["factorized"],
        "model.dynamic_img_size=true",
    ],
    "rope+dynamic": ["model.pos_embed=rope", "model.dynamic_img_size=true"],
}
BASE = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.epochs=2", "trainer.device=cpu", "trainer.deterministic=true"]
BASE += ["data.synthetic.num_train=128", "model.drop_path_rate=0.1", "trainer.attn_maps_every_n_epochs=0"]


@pytest.mark.parametrize("variants", list(COMBINED))
def test_the_variants_train_and_resume_exactly(tmp_path, variants):
    straight, _, _ = assert_resumes_exactly([*BASE, *COMBINED[variants]], tmp_path)
    assert np.isfinite(straight["history"][-1]["train_loss"])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_exports_to_onnx_within_tolerance(tmp_path, variant):
    cfg = compose_config(["data=cifar10", *TINY_MODEL, *VARIANTS[variant]])
    torch.manual_seed(0)
    model = perturbed(build_model_from_config(cfg.model, num_classes=10)).eval()
    config = OmegaConf.to_container(cfg, resolve=True)
    classes = {f"class_{i}": i for i in range(10)}
    checkpoint = tmp_path / "best.pt"
    torch.save({"model": model.state_dict(), "config": config, "class_to_idx": classes, "ema": None}, checkpoint)
    script = load_script("export")
    assert run_script(script.main, [f"checkpoint={checkpoint}"], usage=script.__doc__) == 0
    session = ort.InferenceSession(str(tmp_path / "best.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = model(x).numpy()
    assert np.abs(session.run(None, {"images": x.numpy()})[0] - expected).max() <= 1e-4


def test_the_model_configs_declare_each_variant_key_once():
    """The keys come from the code (the config dataclass, through `registry/<name>`), so every model config has
    them with the same defaults and none restates them."""
    for model in ("vit_tiny", "vit_small", "vit_base", "t2t_vit_7", "t2t_vit_14", "t2t_vit_t_14"):
        cfg = compose_config([f"model={model}"])
        assert cfg.model.qk_norm is False and cfg.model.reg_tokens == 0 and cfg.model.mlp == "gelu"
        assert cfg.model.dynamic_img_size is False
    for path in (REPO / "configs" / "model").glob("*.yaml"):
        text = path.read_text()
        assert f"registry/{path.stem}@_here_" in text and not re.search(r"^(qk_norm|reg_tokens|mlp):", text, re.M)


def test_evaluate_py_at_another_image_size_with_dynamic_img_size(tmp_path, capsys):
    """A ViT trained at 32 px evaluated on 48 px images: refused with one line naming model.dynamic_img_size, and
    with it the loss of the model run here on the images the evaluation's transform makes."""
    import json

    import torch.nn.functional as F
    from trainer_utils import make_tree

    from vit.cli.evaluate import cli
    from vit.data.augment.transforms import val_transform
    from vit.data.images import read_rgb

    root = make_tree(tmp_path / "data", per_class=4, size=40)
    cfg = compose_config(
        ["data=imagefolder", f"data.root={root}", "data.img_size=32", "data.patch_size=4", *TINY_MODEL]
    )
    torch.manual_seed(0)
    model = perturbed(build_model_from_config(cfg.model, num_classes=3)).eval()
    classes = {"cat": 0, "dog": 1, "frog": 2}
    config = OmegaConf.to_container(cfg, resolve=True)
    checkpoint = tmp_path / "best.pt"
    torch.save({"model": model.state_dict(), "config": config, "class_to_idx": classes, "ema": None}, checkpoint)
    common = [f"checkpoint={checkpoint}", "device=cpu", "data.num_workers=0", "amp=none", "data.img_size=48"]

    assert cli(common) == 2
    assert "model.dynamic_img_size=true" in capsys.readouterr().err
    assert cli([*common, "model.dynamic_img_size=true"]) == 0
    result = json.loads(capsys.readouterr().out)

    transform = val_transform({**config["data"], "img_size": 48})
    items = [(p, c) for name, c in classes.items() for p in sorted((root / "val" / name).iterdir())]
    x = torch.stack([transform(read_rgb(p)) for p, _ in items])
    model.embed.dynamic_img_size = True
    with torch.no_grad():
        loss = F.cross_entropy(model(x), torch.tensor([c for _, c in items])).item()
    assert x.shape[-1] == 48 and result["count"] == len(items) and result["loss"] == pytest.approx(loss, rel=1e-4)


@pytest.mark.parametrize("variant", ["plain", "registers_gap", "rope"])
def test_set_input_size_equals_the_dynamic_model_and_exports_at_another_size(tmp_path, variant):
    """A 32 px model run at 48 px: fixed with set_input_size (the table resampled once) it computes what the
    dynamic model computes, and vit-export writes that size, checked by onnxruntime."""
    overrides = {"plain": [], "registers_gap": VARIANTS["registers_gap"], "rope": ["model.pos_embed=rope"]}[variant]
    cfg = compose_config(["data=cifar10", *TINY_MODEL, *overrides])
    torch.manual_seed(0)
    model = perturbed(build_model_from_config(cfg.model, num_classes=10)).eval()
    x = torch.randn(2, 3, 48, 48)
    model.embed.dynamic_img_size = True
    with torch.no_grad():
        expected = model(x)
    model.embed.dynamic_img_size = False
    fixed = copy.deepcopy(model)
    fixed.set_input_size(48)
    with torch.no_grad():
        assert (fixed(x) - expected).abs().max().item() <= 1e-6
    assert fixed.img_size == (48, 48) and fixed.grid_size == (12, 12)

    config = OmegaConf.to_container(cfg, resolve=True)
    classes = {f"class_{i}": i for i in range(10)}
    checkpoint = tmp_path / "best.pt"
    torch.save({"model": model.state_dict(), "config": config, "class_to_idx": classes, "ema": None}, checkpoint)
    script = load_script("export")
    argv = [f"checkpoint={checkpoint}", "data.img_size=48", "model.dynamic_img_size=true"]
    assert run_script(script.main, argv, usage=script.__doc__) == 0
    session = ort.InferenceSession(str(tmp_path / "best.onnx"), providers=["CPUExecutionProvider"])
    assert np.abs(session.run(None, {"images": x.numpy()})[0] - expected.numpy()).max() <= 1e-4


def test_gradient_checkpointing_gives_the_same_gradients_with_the_variants():
    """The rotary tables go through the checkpointed blocks as arguments: gradients equal (atol=0), the mixed
    frequencies' included, with drop-path on."""
    kwargs = {"qk_norm": True, "reg_tokens": 2, "pos_embed": "rope_mixed", "mlp": "swiglu", "drop_path_rate": 0.5}
    plain = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10, depth=4, **kwargs).train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing(True)
    images = torch.randn(4, 3, 32, 32)
    grads = []
    for model in (plain, checkpointed):
        torch.manual_seed(1)
        model(images).logsumexp(dim=-1).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0]["rope.freqs"].abs().sum() > 0
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=0, atol=0)


def test_a_student_with_the_variants_distils_from_a_checkpoint(tmp_path):
    """A student with the distillation token, registers after it and rotary positions trains towards a teacher."""
    run_args = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.device=cpu", "trainer.attn_maps_every_n_epochs=0"]
    run_args += ["data.synthetic.num_train=64", "data.synthetic.num_val=32", "trainer.epochs=1"]
    run(compose_config(run_args), output_dir=tmp_path / "teacher")
    teacher = tmp_path / "teacher" / "checkpoints" / "last.pt"
    student = ["model.distill_token=true", "model.reg_tokens=2", "model.pos_embed=rope", "model.qk_norm=true"]
    metrics = run(
        compose_config([*run_args, *student, f"distill.teacher={teacher}", "distill.type=hard"]),
        output_dir=tmp_path / "student",
    )
    weights = load_checkpoint(tmp_path / "student" / "checkpoints" / "last.pt")["model"]
    assert {"dist_token", "reg_token", "head_dist.weight"} <= set(weights) and "pos_embed" not in weights
    assert np.isfinite(metrics["history"][-1]["train_loss"]) and "teacher" in metrics


def test_complexity_counts_the_variants_tokens_and_mlp():
    """Registers are tokens like the others (N = 1 + 4 + 64 in every attention and MLP); SwiGLU's fc1 holds gate
    and value (C x w), its fc2 takes half of it (w / 2 x C): 4/3 of mlp_ratio 2 is the plain MLP's size."""
    from vit.models import attention_macs, complexity

    common = {"img_size": 32, "patch_size": 4, "num_classes": 10, "embed_dim": 96, "depth": 6, "num_heads": 3}
    plain = complexity(create_model("vit_tiny", **common, mlp_ratio=2.0))
    registers = complexity(create_model("vit_tiny", **common, mlp_ratio=2.0, reg_tokens=4))
    swiglu = complexity(create_model("vit_tiny", **common, mlp="swiglu", mlp_ratio=2.6667))
    assert registers.by_component["attention"] == 6 * attention_macs(69, 96)
    assert registers.by_component["mlp"] == 6 * 69 * 2 * 96 * 192
    assert swiglu.by_component["mlp"] == 6 * 65 * (96 * 256 + 128 * 96) == plain.by_component["mlp"]
    assert swiglu.params == plain.params + 6 * 64  # the same weights; fc1 has 256 biases where the plain one has 192


def test_attention_figures_hide_the_registers_and_say_their_share(tmp_path, capsys):
    """scripts/plot_registers.py and the attention views: the maps cover the image's tokens, the registers' share
    is the cls row's attention on them, a model without a cls token reads the image tokens' mean row."""
    from PIL import Image

    from vit.models import capture_attention
    from vit.tasks.figures import attention_views

    script = load_script("plot_registers")
    paths = []
    for name, overrides in (("base", []), ("reg", ["model.reg_tokens=4"]), ("gap", VARIANTS["registers_gap"])):
        cfg = compose_config(["data=cifar10", *TINY_MODEL, *overrides])
        torch.manual_seed(0)
        model = perturbed(build_model_from_config(cfg.model, num_classes=10))
        config = OmegaConf.to_container(cfg, resolve=True)
        state = {"model": model.state_dict(), "config": config, "class_to_idx": {str(i): i for i in range(10)}}
        torch.save({**state, "ema": None}, tmp_path / f"{name}.pt")
        paths.append(str(tmp_path / f"{name}.pt"))
    images = tmp_path / "images"
    images.mkdir()
    for i in range(2):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(
            images / f"{i}.png"
        )

    out = tmp_path / "registers.png"
    argv = [f"checkpoints={','.join(paths)}", "names=base,reg,gap", f"image={images}", f"out={out}"]
    assert run_script(script.main, argv, usage=script.__doc__) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("base: largest/median token norm") and "registers take" not in lines[0]
    assert "registers take" in lines[1] and "registers take" in lines[2] and out.stat().st_size > 0

    model = build_model_from_config(compose_config(["data=cifar10", *TINY_MODEL, "model.reg_tokens=4"]).model)
    x = torch.randn(2, 3, 32, 32)
    views = attention_views(model, x)
    with torch.no_grad(), capture_attention(model.eval()) as maps:
        model(x)
    share = maps[-1][:, :, 0, 1:5].sum(dim=-1).mean(dim=1)  # the cls row on the 4 registers, head mean
    torch.testing.assert_close(views["register_share"], share)
    assert views["heads"].shape == (2, 2, 32, 32) and views["rollout"].shape == (2, 1, 32, 32)


def test_plot_pos_embed_draws_a_registers_table_and_a_factorized_pair_and_names_a_rotary_model(tmp_path, capsys):
    script = load_script("plot_pos_embed")
    factorized = ["model.pos_embed=factorized", "model.no_embed_class=true"]
    for name, overrides in (
        ("reg", VARIANTS["registers_gap"]),
        ("rope", ["model.pos_embed=rope"]),
        ("fac", factorized),
    ):
        cfg = compose_config(["data=cifar10", *TINY_MODEL, *overrides])
        model = build_model_from_config(cfg.model, num_classes=10)
        state = {"model": model.state_dict(), "config": OmegaConf.to_container(cfg, resolve=True), "ema": None}
        torch.save({**state, "class_to_idx": {str(i): i for i in range(10)}}, tmp_path / f"{name}.pt")
    argv = [f"checkpoint={tmp_path / 'reg.pt'}", f"out={tmp_path / 'pos.png'}"]
    assert run_script(script.main, argv, usage=script.__doc__) == 0 and (tmp_path / "pos.png").exists()
    argv = [f"checkpoint={tmp_path / 'fac.pt'}", f"out={tmp_path / 'fac.png'}"]
    assert run_script(script.main, argv, usage=script.__doc__) == 0 and (tmp_path / "fac.png").exists()
    assert run_script(script.main, [f"checkpoint={tmp_path / 'rope.pt'}"], usage=script.__doc__) == 2
    assert "no position table to draw (model.pos_embed=rope" in capsys.readouterr().err


def test_t2t_vit_takes_the_encoder_variants():
    """qk-norm, registers and SwiGLU in T2T-ViT's encoder (its token stages unchanged): built from the config keys,
    registers after the cls token, and a backward pass reaches them."""
    cfg = compose_config(["model=t2t_vit_7", "data=cifar10", "model.depth=2", "model.qk_norm=true"])
    cfg.model.reg_tokens, cfg.model.mlp, cfg.model.mlp_ratio = 2, "swiglu", 2.0
    model = build_model_from_config(cfg.model, num_classes=10)
    assert model.num_prefix_tokens == 3 and model.pos_embed.shape == (1, 3 + 64, 256)
    assert type(model.blocks[0].mlp).__name__ == "SwiGLU" and type(model.blocks[0].attn.q_norm).__name__ == "LayerNorm"
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert model.reg_token.grad.abs().sum() > 0
