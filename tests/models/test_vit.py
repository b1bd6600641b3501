"""The ViT against timm's VisionTransformer with the same weights; registry; bad input."""

import pytest
import timm
import torch

from vit.models import VisionTransformer, ViTConfig, capture_attention, create_model, list_models

# (our name, overrides, timm name, timm kwargs)
PAIRS = [
    ("vit_tiny", {}, "vit_tiny_patch16_224", {}),
    ("vit_small", {}, "vit_small_patch16_224", {}),
    ("vit_base", {}, "vit_base_patch16_224", {}),
    (
        "vit_tiny",
        {"img_size": 32, "patch_size": 4, "num_classes": 10},
        "vit_tiny_patch16_224",
        {"img_size": 32, "patch_size": 4, "num_classes": 10},
    ),
    (
        "vit_tiny",
        {"img_size": 32, "patch_size": 4, "num_classes": 10, "global_pool": "avg"},
        "vit_tiny_patch16_224",
        {"img_size": 32, "patch_size": 4, "num_classes": 10, "global_pool": "avg"},
    ),
]


@pytest.mark.parametrize(("name", "overrides", "timm_name", "timm_kwargs"), PAIRS)
def test_same_weights_same_numbers_as_timm(name, overrides, timm_name, timm_kwargs):
    # The whole model's parameters, names and shapes, on the meta device (nothing allocated or initialised) ...
    with torch.device("meta"):
        whole = create_model(name, **overrides).state_dict()
        whole_timm = timm.create_model(timm_name, pretrained=False, **timm_kwargs).state_dict()
    assert [(k, v.shape) for k, v in whole.items()] == [(k, v.shape) for k, v in whole_timm.items()]
    # ... and the numbers of its first two blocks (every block is the same code): a CPU second, not ten for ViT-B.
    ours = create_model(name, **{**overrides, "depth": 2}).eval()
    theirs = timm.create_model(timm_name, pretrained=False, **{**timm_kwargs, "depth": 2}).eval()
    theirs_sd = theirs.state_dict()
    assert list(ours.state_dict()) == list(theirs_sd)
    ours.load_state_dict(theirs_sd, strict=True)

    size = ours.img_size[0]
    x = torch.randn(2, 3, size, size)
    out, ref = ours(x), theirs(x)
    assert (out - ref).abs().max().item() <= 1e-5

    out.square().sum().backward()
    ref.square().sum().backward()
    their_params = dict(theirs.named_parameters())
    for key, param in ours.named_parameters():
        g, g_ref = param.grad, their_params[key].grad
        # Gradients are sums over the batch and tokens of products of activations; their fp32 rounding
        # grows with the magnitude, so the bound is relative to the largest entry of the reference.
        bound = 1e-5 * max(1.0, g_ref.abs().max().item())
        assert (g - g_ref).abs().max().item() <= bound, key


def test_registry_lists_and_overrides():
    assert {"vit_tiny", "vit_small", "vit_base"} <= set(list_models())
    assert list_models("vit_s*") == ["vit_small"]
    model = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10)
    assert model.patch_embed.num_patches == 64 and model.pos_embed.shape == (1, 65, 192)
    assert model.head.out_features == 10
    assert len(model.blocks) == 12 and model.blocks[0].attn.num_heads == 3


def test_every_attention_knob_reaches_every_block():
    model = create_model("vit_tiny", img_size=32, patch_size=4, num_heads=4, qkv_bias=False, qk_scale=0.1)
    attns = [b.attn for b in model.blocks]
    assert all(a.num_heads == 4 and a.qkv.bias is None and a.scale == 0.1 for a in attns)


def test_drop_path_rates_rise_linearly():
    model = create_model("vit_tiny", img_size=32, patch_size=4, depth=5, drop_path_rate=0.2)
    rates = [b.drop_path1.drop_prob for b in model.blocks]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])


def test_sinusoidal_position_embedding_is_fixed_and_in_state_dict():
    model = create_model("vit_tiny", img_size=32, patch_size=4, pos_embed="sinusoidal")
    assert not model.pos_embed.requires_grad and "pos_embed" in model.state_dict()
    assert model.pos_embed[0, 0, 1].item() == 1.0  # cos(0) at position 0


def test_capture_returns_one_map_per_block():
    model = create_model("vit_tiny", img_size=32, patch_size=4, depth=3).eval()
    x = torch.randn(2, 3, 32, 32)
    with capture_attention(model) as maps:
        logits = model(x)
    assert [m.shape for m in maps] == [(2, 3, 65, 65)] * 3
    torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=0)  # capturing changes no number


def test_forward_features_and_head():
    model = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=7).eval()
    x = torch.randn(2, 3, 32, 32)
    feats = model.forward_features(x)
    assert feats.shape == (2, 65, 192)
    assert model.forward_head(feats, pre_logits=True).shape == (2, 192)
    torch.testing.assert_close(model.forward_head(feats), model(x))


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"num_heads": 5}, "num_heads=5"),
        ({"img_size": 30, "patch_size": 4}, "img_size=30"),
        ({"drop_path_rate": 1.5}, "drop_path_rate=1.5"),
        ({"qk_scale": -0.5}, "qk_scale=-0.5"),
        ({"global_pool": "max"}, "global_pool='max'"),
        (
            {"pos_embed": "alibi"},
            "pos_embed='alibi' must be one of .'learned', 'sinusoidal', 'sincos2d', 'factorized', 'rope', 'rope_mix",
        ),
        (
            {"pos_embed": "factorized"},
            "pos_embed=factorized has rows for the image's tokens only: it needs no_embed_class",
        ),
        (
            {"pos_embed": "factorized", "no_embed_class": True, "pos_embed_interp": "bilinear"},
            "pos_embed_interp='bilinear' resamples a 2D table; pos_embed=factorized resamples its row and column",
        ),
        ({"depth_": 3}, "depth_"),
    ],
)
def test_bad_model_arguments(overrides, needle):
    with pytest.raises(ValueError, match=needle):
        create_model("vit_tiny", **overrides)


def test_unknown_model_name_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown model name 'vit_huge'.*vit_base.*vit_small.*vit_tiny"):
        create_model("vit_huge")


def test_wrong_input_size_or_channels():
    model = create_model("vit_tiny", img_size=32, patch_size=4)
    with pytest.raises(ValueError, match="32, 32"):
        model(torch.randn(1, 3, 64, 64))
    with pytest.raises(ValueError, match="in_chans=3"):
        model(torch.randn(1, 1, 32, 32))


def test_no_weight_decay_names_are_parameters():
    model = VisionTransformer(ViTConfig(img_size=32, patch_size=4, embed_dim=32, depth=1, num_heads=2))
    names = dict(model.named_parameters())
    assert model.no_weight_decay() <= set(names)
