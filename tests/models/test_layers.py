"""DropPath, PatchEmbed, Block, position embeddings."""

import math

import pytest
import timm.layers
import timm.models.vision_transformer as timm_vit
import torch

from vit.models import Block, DropPath, PatchEmbed, resample_pos_embed, sinusoid_table


def test_drop_path_keeps_expected_value_and_drops_whole_samples():
    drop = DropPath(0.3).train()
    x = torch.ones(20000, 4, 8)
    y = drop(x)
    per_sample = y.flatten(1)
    # Each sample is either all zeros or all 1 / (1 - p).
    dropped = (per_sample == 0).all(dim=1)
    kept = torch.isclose(per_sample, torch.full_like(per_sample, 1 / 0.7)).all(dim=1)
    assert torch.all(dropped | kept)
    assert dropped.float().mean().item() == pytest.approx(0.3, abs=0.02)
    assert y.mean().item() == pytest.approx(1.0, abs=0.03)


def test_drop_path_is_identity_in_eval_and_at_zero():
    x = torch.randn(8, 5, 3)
    assert torch.equal(DropPath(0.5).eval()(x), x)
    assert torch.equal(DropPath(0.0).train()(x), x)
    with pytest.raises(ValueError, match="drop_path=1.0"):
        DropPath(1.0)


def test_patch_embed_equals_a_linear_on_flattened_patches():
    embed = PatchEmbed(img_size=8, patch_size=4, in_chans=3, embed_dim=5)
    x = torch.randn(2, 3, 8, 8)
    # Cut the 4 patches by hand, row-major, each flattened as (C, p, p).
    patches = x.unfold(2, 4, 4).unfold(3, 4, 4)  # (B, C, 2, 2, 4, 4)
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(2, 4, 3 * 16)
    expected = patches @ embed.proj.weight.reshape(5, -1).T + embed.proj.bias
    torch.testing.assert_close(embed(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("shape", "needle"),
    [((2, 3, 32, 32), "224"), ((2, 1, 224, 224), "in_chans=3"), ((3, 224, 224), "in_chans=3")],
)
def test_patch_embed_rejects_wrong_input(shape, needle):
    with pytest.raises(ValueError, match=needle):
        PatchEmbed(224, 16)(torch.randn(*shape))


def test_patch_embed_rejects_indivisible_image():
    with pytest.raises(ValueError, match="img_size=30 is not divisible by patch_size=4"):
        PatchEmbed(30, 4)


def test_block_matches_timm_block():
    ours = Block(96, num_heads=3, mlp_ratio=4.0, qkv_bias=True)
    theirs = timm_vit.Block(96, num_heads=3, mlp_ratio=4.0, qkv_bias=True, norm_layer=timm.layers.LayerNorm)
    theirs.norm1.eps = theirs.norm2.eps = 1e-6
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 17, 96, requires_grad=True)
    out, ref = ours(x), theirs(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    (g1,) = torch.autograd.grad(out.sum(), x)
    (g2,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(g1, g2, atol=1e-5, rtol=1e-5)


def test_sinusoid_table_formula():
    table = sinusoid_table(50, 16)[0]
    pos, i = 7, 3  # columns 6 and 7
    angle = pos / 10000 ** (2 * i / 16)
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert torch.equal(table[0, 0::2], torch.zeros(8)) and torch.equal(table[0, 1::2], torch.ones(8))


def test_resample_keeps_cls_and_smooth_content():
    cls = torch.randn(1, 1, 8)
    # A table that is constant per channel must stay constant after interpolation.
    patches = torch.arange(8.0).expand(1, 14 * 14, 8)
    pos = torch.cat([cls, patches], dim=1)
    out = resample_pos_embed(pos, (24, 24))
    assert out.shape == (1, 1 + 24 * 24, 8)
    assert torch.equal(out[:, :1], cls)
    torch.testing.assert_close(out[0, 1:], torch.arange(8.0).expand(576, 8), atol=1e-4, rtol=0)
    assert resample_pos_embed(pos, (14, 14)) is pos


def test_resample_rejects_non_square_table_without_grid():
    with pytest.raises(ValueError, match="not a square grid"):
        resample_pos_embed(torch.randn(1, 1 + 12, 4), (4, 4))
