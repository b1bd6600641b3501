"""The two levers of "Vision Transformer for Small-Size Datasets" (Lee, Lee & Song 2021): Shifted Patch
Tokenization (`model.patch_embed=spt`) and Locality Self-Attention (`model.lsa=true`).

Expected values are built here by other means than the code under test: shifted copies with torch.roll and
zeroed borders, patches with unfold, LayerNorm and softmax written out, counts from the closed forms.
"""

import pytest
import timm
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from trainer_utils import compose_config

from vit.errors import ConfigError
from vit.models import Attention, LocalitySelfAttention, capture_attention, complexity, create_model
from vit.models.patch_embed import PatchEmbed, ShiftedPatchEmbed
from vit.models.vit import VisionTransformer, ViTConfig
from vit.tasks.build import build_model_from_config

# ---------------------------------------------------------------- Shifted Patch Tokenization


def shifted_by_roll(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """The copy whose pixel (i, j) is x[i + dy, j + dx], zero where that falls outside the image."""
    out = torch.roll(x, shifts=(-dy, -dx), dims=(-2, -1))  # out[i, j] = x[(i + dy) % H, (j + dx) % W]
    height, width = x.shape[-2:]
    if dy < 0:
        out[..., :-dy, :] = 0  # rows that wrapped around from the bottom
    elif dy > 0:
        out[..., height - dy :, :] = 0
    if dx < 0:
        out[..., :, :-dx] = 0
    elif dx > 0:
        out[..., :, width - dx :] = 0
    return out


def stack_by_roll(x: torch.Tensor, s: int) -> torch.Tensor:
    """[x, left-up, right-up, left-bottom, right-bottom] along channels, as the paper and the authors' code."""
    return torch.cat([x] + [shifted_by_roll(x, dy, dx) for dy, dx in ((-s, -s), (-s, s), (s, -s), (s, s))], dim=1)


def test_spt_shape_and_grid():
    embed = ShiftedPatchEmbed(img_size=32, patch_size=4, in_chans=3, embed_dim=16)
    assert embed(torch.randn(2, 3, 32, 32)).shape == (2, 64, 16)
    assert embed.num_patches == 64 and embed.grid_size == (8, 8) and embed.shift == (2, 2)
    # 15 channels (the image and 4 copies) x a 4 x 4 patch = 240 numbers per patch.
    assert embed.norm.normalized_shape == (240,) and embed.proj.in_features == 240
    model = create_model("vit_tiny", img_size=32, patch_size=4, embed_dim=48, depth=1, patch_embed="spt")
    assert model.pos_embed.shape == (1, 65, 48)


def test_spt_shifted_copies_of_a_delta_image():
    """One bright pixel at (row 3, col 2), channel 1 of 3, patch 4 -> shift 2: where it lands in each copy."""
    embed = ShiftedPatchEmbed(img_size=8, patch_size=4, in_chans=3, embed_dim=4)
    x = torch.zeros(1, 3, 8, 8)
    x[0, 1, 3, 2] = 1.0
    stack = embed.shifted_stack(x)
    assert stack.shape == (1, 15, 8, 8)
    # Copy k at (i, j) holds x[i + dy, j + dx]: the bright pixel moves to (3 - dy, 2 - dx). Written by hand:
    where = {0: (3, 2), 1: (5, 4), 2: (5, 0), 3: (1, 4), 4: (1, 0)}  # x, lu, ru, lb, rb
    for copy, (row, col) in where.items():
        expected = torch.zeros(3, 8, 8)
        expected[1, row, col] = 1.0
        torch.testing.assert_close(stack[0, 3 * copy : 3 * copy + 3], expected, rtol=0, atol=0)


def test_spt_shifted_copies_match_roll_with_zeroed_borders():
    embed = ShiftedPatchEmbed(img_size=(8, 12), patch_size=4, in_chans=2, embed_dim=4)
    x = torch.rand(2, 2, 8, 12) + 1.0  # no zeros of its own, so a border that is not zero-filled shows
    torch.testing.assert_close(embed.shifted_stack(x), stack_by_roll(x, 2), rtol=0, atol=0)
    # A pixel near the border leaves the right-bottom copy altogether.
    corner = torch.zeros(1, 2, 8, 12)
    corner[0, 0, 0, 0] = 1.0
    assert embed.shifted_stack(corner)[0, 8:10].abs().sum() == 0


def test_spt_tokens_are_layernormed_flattened_patches():
    embed = ShiftedPatchEmbed(img_size=8, patch_size=4, in_chans=3, embed_dim=6)
    with torch.no_grad():
        embed.norm.weight.uniform_(0.5, 1.5)
        embed.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, 8, 8)
    stack = stack_by_roll(x, 2)  # (2, 15, 8, 8)
    # Cut 2 x 2 patches of 4 x 4 in row-major order and flatten each as (row, col, channel).
    patches = stack.unfold(2, 4, 4).unfold(3, 4, 4)  # (B, 15, 2, 2, 4, 4)
    patches = patches.permute(0, 2, 3, 4, 5, 1).reshape(2, 4, 4 * 4 * 15)
    mean = patches.mean(-1, keepdim=True)
    var = patches.var(-1, unbiased=False, keepdim=True)
    normed = (patches - mean) / torch.sqrt(var + 1e-5) * embed.norm.weight + embed.norm.bias
    expected = normed @ embed.proj.weight.T + embed.proj.bias
    torch.testing.assert_close(embed(x), expected, atol=1e-5, rtol=1e-5)


def test_spt_rejects_too_small_patches_and_wrong_input():
    with pytest.raises(ValueError, match=r"^patch_embed='spt' needs patch_size >= 2"):
        create_model("vit_tiny", img_size=8, patch_size=1, patch_embed="spt")
    with pytest.raises(ValueError, match="in_chans=3"):
        ShiftedPatchEmbed(32, 4)(torch.randn(1, 1, 32, 32))


# ---------------------------------------------------------------- Locality Self-Attention


def test_lsa_never_attends_to_self():
    x = torch.randn(2, 3, 32, 32)
    plain = create_model("vit_tiny", img_size=32, patch_size=4, depth=2).eval()
    with capture_attention(plain) as maps:
        plain(x)
    assert all((m.diagonal(dim1=-2, dim2=-1) > 0).all() for m in maps)  # softmax gives every token some weight

    model = create_model("vit_tiny", img_size=32, patch_size=4, depth=2, lsa=True).eval()
    with capture_attention(model) as maps:
        captured = model(x)
    assert [m.shape for m in maps] == [(2, 3, 65, 65)] * 2
    for m in maps:
        assert torch.all(m.diagonal(dim1=-2, dim2=-1) == 0)
        torch.testing.assert_close(m.sum(-1), torch.ones(2, 3, 65))
    # Capturing runs the math path; the fused path gives the same logits.
    torch.testing.assert_close(captured, model(x), atol=1e-5, rtol=0)


def test_lsa_scores_are_the_learned_temperature_times_qk_without_the_diagonal():
    """Two heads of width 2 with Q = K = V = x: the weights are softmax(t_h · x_h x_hᵀ) off the diagonal."""
    attn = LocalitySelfAttention(dim=4, num_heads=2, qkv_bias=False, attn_backend="math")
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([torch.eye(4)] * 3))
        attn.scale.copy_(torch.tensor([0.5, 2.0]))
    x = torch.randn(1, 5, 4)
    with capture_attention(attn) as maps:
        attn(x)
    for head, temperature in enumerate([0.5, 2.0]):
        xh = x[0, :, 2 * head : 2 * head + 2]  # (5, 2)
        scores = temperature * xh @ xh.T
        scores.fill_diagonal_(float("-inf"))
        torch.testing.assert_close(maps[0][0, head], scores.softmax(-1), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("qk_scale", "expected"), [(None, 0.25), (0.1, 0.1)])
def test_lsa_temperature_is_a_learnable_parameter(qk_scale, expected):
    attn = LocalitySelfAttention(dim=48, num_heads=3, qk_scale=qk_scale)  # head_dim 16 -> 16 ** -0.5 = 0.25
    assert isinstance(attn.scale, nn.Parameter) and attn.scale.requires_grad
    assert attn.scale.tolist() == pytest.approx([expected] * 3)
    assert "scale" in dict(attn.named_parameters())
    attn(torch.randn(2, 7, 48)).square().sum().backward()
    assert attn.scale.grad is not None and attn.scale.grad.abs().min() > 0


def _masks(n):
    # Random keep-masks that always keep the next token, so no row is empty once the diagonal is taken away.
    bool_mask = (torch.rand(2, 1, n, n) > 0.3) | torch.eye(n, dtype=torch.bool).roll(1, dims=1)
    return [None, bool_mask, torch.randn(2, 1, n, n)]


@pytest.mark.parametrize("mask_index", [0, 1, 2])
def test_lsa_fused_and_math_backends_agree(mask_index):
    math_attn = LocalitySelfAttention(32, num_heads=4, qkv_bias=True, attn_backend="math")
    sdpa_attn = LocalitySelfAttention(32, num_heads=4, qkv_bias=True, attn_backend="sdpa")
    with torch.no_grad():
        math_attn.scale.uniform_(0.1, 1.0)  # different temperatures per head
    sdpa_attn.load_state_dict(math_attn.state_dict())
    mask = _masks(7)[mask_index]
    x = torch.randn(2, 7, 32, requires_grad=True)
    out_math, out_sdpa = math_attn(x, attn_mask=mask), sdpa_attn(x, attn_mask=mask)
    torch.testing.assert_close(out_math, out_sdpa, atol=1e-5, rtol=0)
    out_math.square().sum().backward()
    out_sdpa.square().sum().backward()
    torch.testing.assert_close(math_attn.scale.grad, sdpa_attn.scale.grad, atol=1e-4, rtol=1e-4)
    # And LSA does change the numbers: the plain layer with the same weights disagrees.
    plain = Attention(32, num_heads=4, qkv_bias=True, attn_backend="sdpa")
    plain.load_state_dict({k: v for k, v in math_attn.state_dict().items() if k != "scale"})
    assert not torch.allclose(plain(x, attn_mask=mask), out_sdpa, atol=1e-3)


# ---------------------------------------------------------------- defaults, registry, configs


def test_defaults_keep_timm_state_dict():
    theirs = list(timm.create_model("vit_tiny_patch16_224", pretrained=False).state_dict())
    assert list(create_model("vit_tiny").state_dict()) == theirs
    off = create_model("vit_tiny", patch_embed="standard", lsa=False)
    assert list(off.state_dict()) == theirs
    assert isinstance(off.patch_embed, PatchEmbed) and not isinstance(off.blocks[0].attn.scale, nn.Parameter)


def test_levers_add_exactly_their_parameters():
    plain = create_model("vit_tiny", img_size=32, patch_size=4)
    both = create_model("vit_tiny", img_size=32, patch_size=4, patch_embed="spt", lsa=True)
    added = set(both.state_dict()) - set(plain.state_dict())
    assert added == {"patch_embed.norm.weight", "patch_embed.norm.bias"} | {f"blocks.{i}.attn.scale" for i in range(12)}
    assert set(plain.state_dict()) - set(both.state_dict()) == set()
    assert both.state_dict()["patch_embed.proj.weight"].shape == (192, 15 * 4 * 4)
    assert both.state_dict()["blocks.0.attn.scale"].shape == (3,)


def test_registry_kwargs_path():
    model = create_model("vit_tiny", img_size=32, patch_size=4, patch_embed="spt", lsa=True)
    assert isinstance(model.patch_embed, ShiftedPatchEmbed)
    assert all(isinstance(block.attn, LocalitySelfAttention) for block in model.blocks)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)
    for name in ("vit_small", "vit_base"):
        other = create_model(name, img_size=32, patch_size=4, depth=1, patch_embed="spt", lsa=True)
        assert isinstance(other.patch_embed, ShiftedPatchEmbed) and isinstance(
            other.blocks[0].attn, LocalitySelfAttention
        )


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [({"patch_embed": "foo"}, r"^patch_embed='foo' must be one of"), ({"lsa": "yes"}, r"^lsa='yes' must be")],
)
def test_bad_values_name_the_key(overrides, needle):
    with pytest.raises(ValueError, match=needle):
        create_model("vit_tiny", img_size=32, patch_size=4, **overrides)


@pytest.mark.parametrize("model_name", ["vit_tiny", "vit_small", "vit_base"])
def test_config_defaults_are_off(model_name):
    cfg = compose_config([f"model={model_name}"])
    assert cfg.model.patch_embed == "standard" and cfg.model.lsa is False


def test_config_overrides_reach_the_model():
    cfg = compose_config(["model.patch_embed=spt", "model.lsa=true", "model.depth=2"])
    model = build_model_from_config(cfg.model)
    assert isinstance(model.patch_embed, ShiftedPatchEmbed) and all(
        isinstance(b.attn, LocalitySelfAttention) for b in model.blocks
    )
    with pytest.raises(ConfigError, match=r"^model\.patch_embed='foo'"):
        build_model_from_config(compose_config(["model.patch_embed=foo"]).model)
    with pytest.raises(ConfigError, match=r"^model\.lsa='maybe'"):
        build_model_from_config(compose_config(["model.lsa=maybe"]).model)


# ---------------------------------------------------------------- cost and training


def test_complexity_counts_the_larger_spt_projection():
    plain = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10, attn_backend="math")
    spt = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10, attn_backend="math", patch_embed="spt")
    c_plain, c_spt = complexity(plain), complexity(spt)
    # N = 64 patches, C = 192: the projection reads 15·16 numbers per patch instead of 3·16.
    assert c_spt.macs - c_plain.macs == 64 * 192 * (15 - 3) * 16
    assert c_spt.by_component["patch_embed"] == 64 * 192 * 15 * 16
    # Linear 240 -> 192 instead of Conv 48 -> 192 (same bias), plus the LayerNorm's weight and bias.
    assert c_spt.params - c_plain.params == (240 - 48) * 192 + 2 * 240
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        spt.eval()(torch.zeros(1, 3, 32, 32))
    assert c_spt.flops == counter.get_total_flops()


def test_both_levers_overfit_a_fixed_batch():
    torch.manual_seed(0)
    config = ViTConfig(
        img_size=16, patch_size=4, num_classes=4, embed_dim=32, depth=2, num_heads=2, patch_embed="spt", lsa=True
    )
    model = VisionTransformer(config)
    images, labels = torch.randn(16, 3, 16, 16), torch.randint(0, 4, (16,))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start = model.blocks[0].attn.scale.detach().clone()
    losses = []
    for _ in range(30):
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0], losses
    assert not torch.equal(model.blocks[0].attn.scale.detach(), start)  # the temperature is trained too


# ---------------------------------------------------------------- T2T-style overlapping soft split


@pytest.mark.parametrize("patch", [1, 2, 3, 4, 16])
def test_overlapping_tokens_are_t2ts_unfold_windows_projected(patch):
    """Built the way the official T2T code builds its soft split: nn.Unfold(kernel, stride, padding), then a Linear
    on each column, then LayerNorm; the conv's weights reshaped into that Linear must give the same tokens."""
    from vit.models.patch_embed import OverlappingPatchEmbed

    torch.manual_seed(0)
    size = 6 * patch  # a 6 x 6 grid of patches
    embed = OverlappingPatchEmbed(size, patch, in_chans=3, embed_dim=24)
    x = torch.randn(2, 3, size, size)
    kernel = 2 * patch - 1
    columns = nn.Unfold(kernel_size=kernel, stride=patch, padding=patch // 2)(x)  # (B, 3 * k * k, N)
    assert columns.shape[-1] == (size // patch) ** 2 == embed.num_patches  # the plain ViT's grid
    linear = embed.proj.weight.reshape(24, -1)  # (C, 3 * k * k), unfold's (channel, row, col) order
    tokens = columns.transpose(1, 2) @ linear.T + embed.proj.bias  # (B, N, C)
    expected = nn.functional.layer_norm(tokens, (24,), embed.norm.weight, embed.norm.bias)
    torch.testing.assert_close(embed(x), expected, atol=1e-5, rtol=1e-5)


def test_overlap_at_patch_4_is_t2ts_first_soft_split():
    from vit.models.patch_embed import OverlappingPatchEmbed

    proj = OverlappingPatchEmbed(32, 4, 3, 64).proj
    assert (proj.kernel_size, proj.stride, proj.padding) == ((7, 7), (4, 4), (2, 2))  # T2T: Unfold(7, 4, 2)


def test_overlap_is_a_config_choice_and_keeps_the_encoder():
    cfg = compose_config(["model.patch_embed=overlap", "model.embed_dim=48", "model.depth=1", "model.num_heads=3"])
    model = build_model_from_config(cfg.model, num_classes=10)
    plain = build_model_from_config(
        compose_config(["model.embed_dim=48", "model.depth=1", "model.num_heads=3"]).model, num_classes=10
    )
    ours = {k: v.shape for k, v in model.state_dict().items() if not k.startswith("patch_embed.")}
    assert ours == {k: v.shape for k, v in plain.state_dict().items() if not k.startswith("patch_embed.")}
    # Weights: (2p - 1)^2 * 3 * C + C (conv) + 2C (norm), against p^2 * 3 * C + C.
    count = lambda m: sum(p.numel() for p in m.patch_embed.parameters())  # noqa: E731
    assert count(model) == 49 * 3 * 48 + 48 + 2 * 48 and count(plain) == 16 * 3 * 48 + 48
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    model.patch_embed.dynamic_img_size = True  # progressive resizing: smaller images, still whole patches
    assert model.patch_embed(torch.randn(2, 3, 16, 16)).shape == (2, 16, 48)
    with pytest.raises(
        ConfigError, match=r"patch_embed='overlapping' must be one of \('standard', 'spt', 'overlap', 'conv', 'cct'\)"
    ):
        build_model_from_config(compose_config(["model.patch_embed=overlapping"]).model, num_classes=10)


# ---------------------------------------------------------------- convolutional stem


@pytest.mark.parametrize(("patch", "train"), [(2, False), (4, False), (4, True), (8, False)])
def test_conv_stem_is_strided_convs_batchnorm_relu_then_a_1x1(patch, train):
    """log2(p) 3 x 3 stride-2 convolutions (no bias), each BatchNorm'ed and ReLU'd, channels doubling up to the width,
    then a 1 x 1 convolution with bias: rebuilt here from F.conv2d and F.batch_norm with the module's weights, in
    training mode (batch statistics) and evaluation mode (running statistics)."""
    from vit.models.patch_embed import ConvStemEmbed

    torch.manual_seed(0)
    width, size = 32, 4 * patch
    embed = ConvStemEmbed(size, patch, in_chans=3, embed_dim=width).train(train)
    convs = patch.bit_length() - 1
    layers = list(embed.stem)
    assert len(layers) == convs + 1 and embed.grid_size == (4, 4) and embed.num_patches == 16
    for layer in layers[:-1]:  # random running statistics, so evaluation mode is not the identity
        layer.bn.running_mean.uniform_(-0.5, 0.5)
        layer.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(3, 3, size, size)
    expected, channels = x, []
    for layer in layers[:-1]:
        conv, bn = layer.conv, layer.bn
        assert conv.kernel_size == (3, 3) and conv.stride == (2, 2) and conv.bias is None
        expected = nn.functional.conv2d(expected, conv.weight, None, stride=2, padding=1)
        mean, var = (None, None) if train else (bn.running_mean.clone(), bn.running_var.clone())
        expected = nn.functional.batch_norm(expected, mean, var, bn.weight, bn.bias, training=train, eps=bn.eps)
        expected = expected.relu()
        channels.append(conv.out_channels)
    last = layers[-1].conv
    assert last.kernel_size == (1, 1) and last.bias is not None
    expected = nn.functional.conv2d(expected, last.weight, last.bias)  # (B, width, 4, 4)
    assert channels == [width // 2 ** (convs - 1 - i) for i in range(convs)]
    torch.testing.assert_close(embed(x), expected.flatten(2).transpose(1, 2), atol=1e-5, rtol=1e-5)


def window_side(embed: nn.Module, size: int, row: int, col: int) -> int:
    """The side of the input window one token of `embed` sees: where the gradient of its output reaches."""
    x = torch.randn(1, 3, size, size, requires_grad=True)
    grid = size // embed.patch_size[0]
    embed(x)[0, row * grid + col].sum().backward()
    rows = x.grad.abs().sum(dim=(0, 1, 3)).nonzero()
    return int(rows.max() - rows.min() + 1)


def test_a_deeper_conv_stem_adds_stride_1_convs_to_each_stage_and_widens_every_tokens_window():
    """stem_convs_per_stage=2: after each stride-2 convolution one 3 x 3 of stride 1 at that stage's width, rebuilt
    here from F.conv2d and F.batch_norm (training mode). A token in the middle of the grid sees 19 x 19 pixels
    instead of the plain stem's 7 x 7, and each added convolution costs 576 C^2 multiply-adds per 32 px image."""
    from vit.models.patch_embed import ConvStemEmbed

    torch.manual_seed(0)
    width = 32
    embed = ConvStemEmbed(32, 4, in_chans=3, embed_dim=width, convs_per_stage=2).train()
    layers = list(embed.stem)
    assert [(layer.conv.stride[0], layer.conv.kernel_size[0], layer.conv.out_channels) for layer in layers] == [
        (2, 3, 16), (1, 3, 16), (2, 3, 32), (1, 3, 32), (1, 1, 32)
    ]  # fmt: skip
    x = torch.randn(4, 3, 32, 32)
    expected = x
    for layer in layers[:-1]:
        conv, bn = layer.conv, layer.bn
        expected = nn.functional.conv2d(expected, conv.weight, None, stride=conv.stride, padding=1)
        expected = nn.functional.batch_norm(expected, None, None, bn.weight, bn.bias, training=True, eps=bn.eps)
        expected = expected.relu()
    expected = nn.functional.conv2d(expected, layers[-1].conv.weight, layers[-1].conv.bias)
    torch.testing.assert_close(embed(x), expected.flatten(2).transpose(1, 2), atol=1e-5, rtol=1e-5)

    plain = ConvStemEmbed(64, 4, in_chans=3, embed_dim=width).eval()
    deeper = ConvStemEmbed(64, 4, in_chans=3, embed_dim=width, convs_per_stage=2).eval()
    assert window_side(plain, 64, 8, 8) == 7 and window_side(deeper, 64, 8, 8) == 19

    base = dict(img_size=32, patch_size=4, num_classes=10, patch_embed="conv", embed_dim=width, num_heads=2, depth=1)
    macs = [complexity(create_model("vit_tiny", **base, stem_convs_per_stage=n)).macs for n in (1, 2)]
    assert macs[1] - macs[0] == 2 * 576 * width**2


def test_a_deeper_conv_stem_is_a_config_choice_of_the_conv_stem_only():
    cfg = compose_config(["model.patch_embed=conv", "model.stem_convs_per_stage=2", "model.embed_dim=48"])
    model = build_model_from_config(OmegaConf.merge(cfg.model, {"depth": 1, "num_heads": 3}), num_classes=10)
    assert len(model.patch_embed.stem) == 5 and model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    model.patch_embed.dynamic_img_size = True  # progressive resizing
    assert model.patch_embed(torch.randn(2, 3, 16, 16)).shape == (2, 16, 48)
    with pytest.raises(ConfigError, match=r"^model\.stem_convs_per_stage=2 is for patch_embed=conv, not 'standard'$"):
        build_model_from_config(compose_config(["model.stem_convs_per_stage=2"]).model)
    with pytest.raises(ConfigError, match=r"^model\.stem_convs_per_stage=True must be"):
        build_model_from_config(compose_config(["model.patch_embed=conv", "model.stem_convs_per_stage=true"]).model)


def test_conv_stem_is_a_config_choice_for_power_of_two_patches():
    cfg = compose_config(["model.patch_embed=conv", "model.embed_dim=48", "model.depth=1", "model.num_heads=3"])
    model = build_model_from_config(cfg.model, num_classes=10)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    model.patch_embed.dynamic_img_size = True  # progressive resizing: any multiple of the patch size
    assert model.patch_embed(torch.randn(2, 3, 16, 16)).shape == (2, 16, 48)
    for patch in (1, 3, 6):
        with pytest.raises(ValueError, match=r"patch_embed=conv needs a square power-of-two patch size"):
            create_model("vit_tiny", img_size=6 * patch, patch_size=patch, depth=1, patch_embed="conv")
