"""Analytic parameter and multiply-add counts against closed forms and torch's flop counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vit.models import attention_macs, complexity, create_model, mlp_macs


def closed_form_vit_macs(img, patch, dim, depth, mlp_ratio, classes, chans=3):
    n_patches = (img // patch) ** 2
    n = n_patches + 1
    per_block = 4 * n * dim**2 + 2 * n**2 * dim + 2 * n * dim * int(dim * mlp_ratio)
    return n_patches * dim * chans * patch**2 + depth * per_block + dim * classes


def test_formulas_are_4NC2_plus_2N2C_and_2NC_hidden():
    assert attention_macs(10, 8) == 4 * 10 * 64 + 2 * 100 * 8
    assert attention_macs(10, 6, dim_out=8) == 10 * 6 * 24 + 2 * 100 * 8 + 10 * 64  # qkv, q·kᵀ and attn·v, proj
    assert mlp_macs(10, 8, 32) == 2 * 10 * 8 * 32


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("vit_tiny", {}),
        ("vit_tiny", {"img_size": 32, "patch_size": 4, "num_classes": 10}),
        ("vit_small", {"img_size": 64, "patch_size": 8, "mlp_ratio": 2.0}),
    ],
)
def test_counts_match_closed_form_and_flop_counter(name, kwargs):
    model = create_model(name, attn_backend="math", **kwargs)
    c = complexity(model)
    img, patch = model.img_size[0], model.patch_embed.patch_size[0]
    dim, depth = model.embed_dim, len(model.blocks)
    ratio = model.blocks[0].mlp.fc1.out_features / dim
    assert c.macs == closed_form_vit_macs(img, patch, dim, depth, ratio, model.num_classes)
    assert c.params == sum(p.numel() for p in model.parameters())

    with FlopCounterMode(display=False) as counter:
        with torch.no_grad():
            model.eval()(torch.zeros(1, 3, img, img))
    measured = counter.get_total_flops()
    assert abs(c.flops - measured) / measured <= 0.02


def test_paper_sizes():
    # ViT-B/16 at 224: 86.6 M parameters and 17.6 GMACs (the DeiT/timm tables).
    c = complexity(create_model("vit_base"))
    assert c.params / 1e6 == pytest.approx(86.6, abs=0.05)
    assert c.macs / 1e9 == pytest.approx(17.6, abs=0.1)
    assert set(c.by_component) == {"patch_embed", "attention", "mlp", "head"}
