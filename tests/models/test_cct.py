"""The Compact Convolutional Transformer's two parts as ViT switches: its convolutional tokenizer
(`model.patch_embed=cct`, `ConvPoolEmbed`) and its sequence pooling (`model.global_pool=seq`), each rebuilt here
from torch's functional ops with the module's own weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from trainer_utils import compose_config

from vit.errors import ConfigError
from vit.models import create_model
from vit.models.patch_embed import ConvPoolEmbed
from vit.tasks.build import build_model_from_config
from vit.train.optimizer import build_optimizer


@pytest.mark.parametrize("patch", [2, 4, 8])
def test_cct_tokenizer_is_conv_relu_maxpool_stages(patch):
    """log2(p) stages of a 3 x 3 stride-1 convolution without bias, ReLU and a 3 x 3 stride-2 max-pool (padding 1),
    64 channels between the stages and the width after the last, as CCT's `Tokenizer`."""
    torch.manual_seed(0)
    width, size = 32, 4 * patch
    embed = ConvPoolEmbed(size, patch, in_chans=3, embed_dim=width)
    stages = patch.bit_length() - 1
    assert len(embed.stages) == stages and embed.grid_size == (4, 4) and embed.num_patches == 16
    x = torch.randn(2, 3, size, size)
    expected, channels = x, []
    for conv, _, _ in embed.stages:
        assert conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.bias is None
        expected = nn.functional.conv2d(expected, conv.weight, None, stride=1, padding=1).relu()
        expected = nn.functional.max_pool2d(expected, kernel_size=3, stride=2, padding=1)
        channels.append(conv.out_channels)
    assert channels == [64] * (stages - 1) + [width]
    torch.testing.assert_close(embed(x), expected.flatten(2).transpose(1, 2))  # (B, 16, width)


def test_cct_tokenizer_is_a_config_choice_for_power_of_two_patches():
    cfg = compose_config(["model.patch_embed=cct", "model.embed_dim=48", "model.depth=1", "model.num_heads=3"])
    model = build_model_from_config(cfg.model, num_classes=10)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    # Kaiming-normal (fan in) convolutions, as CCT: the first's weights have std sqrt(2 / 27).
    first = model.patch_embed.stages[0][0].weight
    assert abs(first.std().item() - (2 / 27) ** 0.5) < 0.05
    model.patch_embed.dynamic_img_size = True  # progressive resizing: any multiple of the patch size
    assert model.patch_embed(torch.randn(2, 3, 16, 16)).shape == (2, 16, 48)
    for patch in (1, 3, 6):
        with pytest.raises(ValueError, match=r"patch_embed=cct needs a square power-of-two patch size"):
            create_model("vit_tiny", img_size=6 * patch, patch_size=patch, depth=1, patch_embed="cct")
    with pytest.raises(ConfigError, match=r"model.patch_embed='ccct' must be one of \(.*'cct'\)"):
        build_model_from_config(compose_config(["model.patch_embed=ccct"]).model, num_classes=10)


def test_sequence_pooling_is_a_softmax_weighted_mean_of_the_normed_image_tokens():
    """CCT's SeqPool: the final norm, one score per image token from a Linear C -> 1, a softmax over the tokens,
    their weighted sum, then the head; registers are not pooled, and there is no fc_norm."""
    torch.manual_seed(0)
    model = create_model(
        "vit_tiny", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5,
        global_pool="seq", class_token=False, reg_tokens=1,
    ).eval()  # fmt: skip
    assert model.seq_pool.weight.shape == (1, 32) and isinstance(model.fc_norm, nn.Identity)
    nn.init.normal_(model.seq_pool.weight)  # scores that differ from token to token
    x = torch.randn(3, 3, 16, 16)
    features = model.forward_features(x)  # (B, 1 + 16, C), after the final norm
    tokens = features[:, 1:]  # (B, 16, C): the register left out
    scores = tokens @ model.seq_pool.weight.T + model.seq_pool.bias  # (B, 16, 1)
    pooled = (torch.softmax(scores, dim=1).transpose(1, 2) @ tokens).squeeze(1)  # (B, C), CCT's matmul form
    torch.testing.assert_close(model.forward_head(features, pre_logits=True), pooled)
    torch.testing.assert_close(model(x), model.head(pooled))
    assert not torch.allclose(pooled, tokens.mean(dim=1), atol=1e-3)  # not the plain average


def test_cct_switches_train_a_step_with_muon_leaving_the_tokenizer_and_pool_to_adamw():
    cfg = compose_config(
        ["model.patch_embed=cct", "model.global_pool=seq", "model.class_token=false", "model.embed_dim=32",
         "model.depth=1", "model.num_heads=2", "optim=muon"]
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model_from_config(cfg.model, num_classes=10)
    optimizer = build_optimizer(model, cfg.optim, lr=1e-3, device=torch.device("cpu"))
    fallback = {id(p) for g in optimizer.param_groups if g.get("use_fallback") for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in fallback}
    assert {"seq_pool.weight", "seq_pool.bias", "patch_embed.stages.0.0.weight"} <= names
    assert "blocks.0.attn.qkv.weight" not in names
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    optimizer.step()
    for name in ("seq_pool.weight", "patch_embed.stages.1.0.weight", "blocks.0.attn.qkv.weight"):
        assert not torch.equal(before[name], dict(model.named_parameters())[name]), name
