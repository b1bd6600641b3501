"""Distillation: the distillation token against timm's distilled DeiT, the loss against a hand computation, the
teacher's input adapter, a run with a teacher (no gradients, student-only checkpoints, exact resume) and the bad
settings (exit 2, one line)."""

import importlib

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed
from trainer_utils import TINY_MODEL, compose_config

from vit.models import create_model, load_pretrained
from vit.train.config import ConfigError, build_model_from_config

run_module = importlib.import_module("vit.train.run")
CPU = ["trainer.device=cpu", "trainer.attn_maps_every_n_epochs=0", "trainer.ema=false"]


def save_safetensors(state_dict, path):
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path))
    return path


# --- the distillation token against timm's VisionTransformerDistilled --------------------------------------------


@pytest.fixture(scope="module")
def deit_pair():
    """timm's distilled DeiT-Ti (2 blocks, random weights) and ours with its state dict."""
    torch.manual_seed(0)
    theirs = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, depth=2)
    ours = create_model("vit_tiny", depth=2, distill_token=True)
    ours.load_state_dict(theirs.state_dict(), strict=True)  # the same names and shapes, nothing left over
    return theirs, ours


def test_distilled_deit_outputs_both_heads_and_the_average(deit_pair):
    theirs, ours = deit_pair
    x = torch.randn(2, 3, 224, 224)
    theirs.train()
    theirs.set_distilled_training(True)
    ours.train()
    cls_t, dist_t = theirs(x)
    cls_o, dist_o = ours(x)
    torch.testing.assert_close(cls_o, cls_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dist_o, dist_t, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(cls_o, dist_o)  # two different heads, not one read twice
    theirs.eval()
    ours.eval()
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours(x), (cls_t + dist_t) / 2, rtol=1e-5, atol=1e-5)


def test_distilled_deit_gradients_match_timm(deit_pair):
    theirs, ours = deit_pair
    x = torch.randn(2, 3, 224, 224)
    target = torch.tensor([3, 7])
    for model in (theirs, ours):
        model.train()
        model.zero_grad()
        cls, dist = model(x)
        (F.cross_entropy(cls, target) + 0.3 * F.cross_entropy(dist, target)).backward()
    grads_t = dict(theirs.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param.grad, grads_t[name].grad, rtol=1e-4, atol=1e-6, msg=name)
    assert ours.dist_token.grad.abs().sum() > 0 and ours.head_dist.weight.grad.abs().sum() > 0


def test_distilled_deit_weights_load_at_cifar_size(deit_pair, tmp_path):
    """224/16 -> 32/4 through the pretrained loader: both prefix rows kept, the grid resampled, both heads replaced."""
    theirs, _ = deit_pair
    source = save_safetensors(theirs.state_dict(), tmp_path / "deit.safetensors")
    model = create_model("vit_tiny", depth=2, distill_token=True, img_size=32, patch_size=4, num_classes=10)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    load_pretrained(model, str(source))
    expected = resample_abs_pos_embed(theirs.pos_embed.detach(), [8, 8], [14, 14], num_prefix_tokens=2)
    torch.testing.assert_close(model.pos_embed.detach(), expected, rtol=0, atol=0)
    torch.testing.assert_close(model.dist_token.detach(), theirs.dist_token.detach(), rtol=0, atol=0)
    for key in ("head.weight", "head_dist.weight"):
        assert torch.equal(model.state_dict()[key], fresh[key]), key  # 1000 -> 10 classes: the fresh heads


def test_t2t_vit_refuses_the_token_and_avg_pool_too():
    with pytest.raises(ConfigError, match="model.distill_token=true: model.name=t2t_vit_7 has no distillation"):
        build_model_from_config(compose_config(["model=t2t_vit_7", "model.distill_token=true"]).model, 10)
    with pytest.raises(ConfigError, match="distill_token=true needs global_pool=token"):
        build_model_from_config(
            compose_config(["model.distill_token=true", "model.global_pool=avg", *TINY_MODEL]).model, 10
        )
