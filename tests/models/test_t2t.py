"""T2T-ViT: soft-split token counts, the token attentions, paper sizes, the official state-dict layout."""

import os

import pytest
import torch
from trainer_utils import reference_code

from vit.models import T2TViT, capture_attention, complexity, create_model, list_models
from vit.models.performer import TokenPerformer
from vit.models.registry import official_qk_scale
from vit.models.t2t import TokenTransformer
from vit.weights.read import load_pretrained


def _stage_shapes(model, x):
    """(input, output) shapes of the two token-attention stages and of `project`."""
    t2t = model.tokens_to_token
    shapes = {}
    hooks = [
        getattr(t2t, name).register_forward_hook(
            lambda m, i, o, name=name: shapes.__setitem__(name, (tuple(i[0].shape), tuple(o.shape)))
        )
        for name in ("attention1", "attention2", "project")
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return shapes


@pytest.mark.parametrize("tokens_type", ["performer", "transformer"])
def test_token_counts_at_224(tokens_type):
    model = create_model("t2t_vit_7", tokens_type=tokens_type).eval()
    assert model.tokens_to_token.grid_sides == [56, 28, 14]
    shapes = _stage_shapes(model, torch.randn(1, 3, 224, 224))
    assert shapes["attention1"] == ((1, 3136, 147), (1, 3136, 64))
    assert shapes["attention2"] == ((1, 784, 576), (1, 784, 64))
    assert shapes["project"] == ((1, 196, 576), (1, 196, 256))
    assert model.pos_embed.shape == (1, 197, 256)


def test_cifar_setting_gives_an_8x8_grid():
    model = create_model("t2t_vit_7", img_size=32, num_classes=10).eval()
    assert model.tokens_to_token.splits == ((3, 1, 1), (3, 2, 1), (3, 2, 1))
    shapes = _stage_shapes(model, torch.randn(2, 3, 32, 32))
    assert shapes["attention1"] == ((2, 1024, 27), (2, 1024, 64))
    assert shapes["attention2"] == ((2, 256, 576), (2, 256, 64))
    assert shapes["project"] == ((2, 64, 576), (2, 64, 256))
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_worked_example_49_to_64_through_the_token_transformer():
    block = TokenTransformer(dim=49, dim_out=64, num_heads=1, qk_scale=49**-0.5).eval()
    x = torch.randn(13, 100, 49)
    with capture_attention(block) as maps:
        out = block(x)
    assert maps[0].shape == (13, 1, 100, 100) and out.shape == (13, 100, 64)
    assert block.attn.scale == pytest.approx(49**-0.5)


def test_token_scale_conventions():
    official = create_model("t2t_vit_t_14", depth=1).tokens_to_token  # one block: only the T2T module matters
    assert official.attention1.attn.scale == pytest.approx(147**-0.5)
    assert official.attention2.attn.scale == pytest.approx(576**-0.5)
    output_width = create_model("t2t_vit_t_14", depth=1, token_scale="output").tokens_to_token
    assert output_width.attention1.attn.scale == pytest.approx(64**-0.5)


def test_token_transformer_math_and_sdpa_agree():
    math_block = TokenTransformer(147, dim_out=64, qk_scale=147**-0.5, attn_backend="math").eval()
    sdpa_block = TokenTransformer(147, dim_out=64, qk_scale=147**-0.5, attn_backend="sdpa").eval()
    sdpa_block.load_state_dict(math_block.state_dict())
    x = torch.randn(2, 300, 147)
    torch.testing.assert_close(math_block(x), sdpa_block(x), atol=1e-5, rtol=0)


def test_performer_equals_the_direct_formula():
    block = TokenPerformer(dim=27, dim_out=16, kernel_ratio=0.5).eval()
    x = torch.randn(2, 50, 27)
    k, q, v = block.kqv(x).split(16, dim=-1)

    def phi(t):  # exp(w·t − |t|²/2) / sqrt(m), written out
        return torch.exp(t @ block.w.T - (t * t).sum(-1, keepdim=True) / 2) / block.m**0.5

    kernel = phi(q) @ phi(k).transpose(1, 2)  # (B, N, N): the approximate exp(q·k)
    y = kernel @ v / (kernel.sum(-1, keepdim=True) + block.eps)
    expected = v + block.proj(y)
    torch.testing.assert_close(block.attention(x), expected, atol=1e-5, rtol=1e-4)
    assert block.m == 8 and not block.w.requires_grad


def test_performer_kernel_stays_fp32_under_autocast():
    """bf16 autocast would round w·k before exp (1-2% off); the kernel part must ignore it."""
    block = TokenPerformer(dim=27, dim_out=64).eval()
    q, k, v = (0.5 * torch.randn(3, 1, 500, 64)).unbind(0)  # |k| about 4, as LayerNorm-ed tokens give
    expected = block.kernel_attention(q, k, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = block.kernel_attention(q, k, v)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


# The paper's Table 1 (parameters, M) and MACs (G) at 224 px.
PAPER_PARAMS = {
    "t2t_vit_7": 4.3,
    "t2t_vit_10": 5.9,
    "t2t_vit_12": 6.9,
    "t2t_vit_14": 21.5,
    "t2t_vit_19": 39.2,
    "t2t_vit_24": 64.1,
    "t2t_vit_t_14": 21.5,
}
PAPER_MACS = {"t2t_vit_14": 4.8, "t2t_vit_t_14": 6.1, "t2t_vit_7": 1.1}


@pytest.mark.parametrize("name", sorted(PAPER_PARAMS))
def test_parameter_counts_match_the_paper(name):
    params = sum(p.numel() for p in create_model(name).parameters())
    assert params / 1e6 == pytest.approx(PAPER_PARAMS[name], abs=0.05 + 1e-9)


@pytest.mark.parametrize("name", sorted(PAPER_MACS))
def test_macs_match_the_paper(name):
    macs = complexity(create_model(name)).macs / 1e9
    assert abs(macs - PAPER_MACS[name]) / PAPER_MACS[name] <= 0.05


def test_every_t2t_name_is_registered():
    assert set(list_models("t2t_*")) == set(PAPER_PARAMS) | {"t2t_vit_t_19", "t2t_vit_t_24"}


def _official_layout(embed_dim, depth, mlp_ratio, tokens_type, classes=1000, token_dim=64):
    """The official T2T-ViT state dict, written out from the description of its modules."""
    layout = {"cls_token": (1, 1, embed_dim), "pos_embed": (1, 197, embed_dim)}
    for stage, width in (("attention1", 147), ("attention2", token_dim * 9)):
        p = f"tokens_to_token.{stage}"
        if tokens_type == "performer":
            layout |= {
                f"{p}.w": (token_dim // 2, token_dim),  # the module's own parameter comes before its children's
                f"{p}.kqv.weight": (3 * token_dim, width),
                f"{p}.kqv.bias": (3 * token_dim,),
                f"{p}.proj.weight": (token_dim, token_dim),
                f"{p}.proj.bias": (token_dim,),
                f"{p}.norm1.weight": (width,),
                f"{p}.norm1.bias": (width,),
                f"{p}.norm2.weight": (token_dim,),
                f"{p}.norm2.bias": (token_dim,),
                f"{p}.mlp.0.weight": (token_dim, token_dim),
                f"{p}.mlp.0.bias": (token_dim,),
                f"{p}.mlp.2.weight": (token_dim, token_dim),
                f"{p}.mlp.2.bias": (token_dim,),
            }
        else:
            layout |= {
                f"{p}.norm1.weight": (width,),
                f"{p}.norm1.bias": (width,),
                f"{p}.attn.qkv.weight": (3 * token_dim, width),
                f"{p}.attn.proj.weight": (token_dim, token_dim),
                f"{p}.attn.proj.bias": (token_dim,),
                f"{p}.norm2.weight": (token_dim,),
                f"{p}.norm2.bias": (token_dim,),
                f"{p}.mlp.fc1.weight": (token_dim, token_dim),
                f"{p}.mlp.fc1.bias": (token_dim,),
                f"{p}.mlp.fc2.weight": (token_dim, token_dim),
                f"{p}.mlp.fc2.bias": (token_dim,),
            }
    layout |= {
        "tokens_to_token.project.weight": (embed_dim, token_dim * 9),
        "tokens_to_token.project.bias": (embed_dim,),
    }
    hidden = int(embed_dim * mlp_ratio)
    for i in range(depth):
        layout |= {
            f"blocks.{i}.norm1.weight": (embed_dim,),
            f"blocks.{i}.norm1.bias": (embed_dim,),
            f"blocks.{i}.attn.qkv.weight": (3 * embed_dim, embed_dim),  # qkv_bias=False
            f"blocks.{i}.attn.proj.weight": (embed_dim, embed_dim),
            f"blocks.{i}.attn.proj.bias": (embed_dim,),
            f"blocks.{i}.norm2.weight": (embed_dim,),
            f"blocks.{i}.norm2.bias": (embed_dim,),
            f"blocks.{i}.mlp.fc1.weight": (hidden, embed_dim),
            f"blocks.{i}.mlp.fc1.bias": (hidden,),
            f"blocks.{i}.mlp.fc2.weight": (embed_dim, hidden),
            f"blocks.{i}.mlp.fc2.bias": (embed_dim,),
        }
    layout |= {"norm.weight": (embed_dim,), "norm.bias": (embed_dim,)}
    return layout | {"head.weight": (classes, embed_dim), "head.bias": (classes,)}


@pytest.mark.parametrize(
    ("name", "layout"),
    [
        ("t2t_vit_t_14", _official_layout(384, 14, 3.0, "transformer")),
        ("t2t_vit_7", _official_layout(256, 7, 2.0, "performer")),
    ],
)
def test_state_dict_matches_the_official_layout(name, layout):
    ours = {k: tuple(v.shape) for k, v in create_model(name).state_dict().items()}
    assert list(ours) == list(layout)
    assert ours == layout


def test_official_checkpoint_file_loads_with_other_classes_and_size(tmp_path, caplog):
    source = create_model("t2t_vit_7").eval()
    path = tmp_path / "71.7_T2T_ViT_7.pth.tar"
    torch.save({"state_dict_ema": source.state_dict(), "epoch": 300}, path)
    same = load_pretrained(create_model("t2t_vit_7"), path).eval()
    x = torch.randn(1, 3, 224, 224)
    torch.testing.assert_close(same(x), source(x))
    other = load_pretrained(create_model("t2t_vit_7", num_classes=10, img_size=384), path)
    assert "checkpoint has 1000 classes, model has 10" in caplog.text
    assert other.pos_embed.shape == (1, 1 + 24 * 24, 256)  # the fixed table, recomputed for 384 px
    torch.testing.assert_close(other.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)


def test_capture_includes_the_token_transformer_stages():
    model = create_model("t2t_vit_t_14", img_size=32, num_classes=10, depth=2).eval()
    with capture_attention(model) as maps:
        model(torch.randn(1, 3, 32, 32))
    assert [m.shape[-1] for m in maps] == [1024, 256, 65, 65]


@pytest.mark.parametrize(("size", "needle"), [(200, "img_size=200"), (30, "multiple of 4")])
def test_untileable_image_size_names_size_and_choices(size, needle):
    with pytest.raises(ValueError, match=needle):
        create_model("t2t_vit_7", img_size=size)
    with pytest.raises(ValueError, match=r"multiple of 16, e\.g\. 192 or 208"):
        create_model("t2t_vit_7", img_size=200)


def test_bad_t2t_arguments():
    with pytest.raises(ValueError, match="tokens_type='conv'"):
        create_model("t2t_vit_7", tokens_type="conv")
    with pytest.raises(ValueError, match="num_heads=5"):
        create_model("t2t_vit_7", num_heads=5)
    with pytest.raises(ValueError, match="soft_split='huge'"):
        create_model("t2t_vit_7", soft_split="huge")
    with pytest.raises(ValueError, match="in_chans=3"):
        create_model("t2t_vit_7", img_size=32)(torch.randn(1, 3, 64, 64))
    for size in (0, -32):
        with pytest.raises(ValueError, match=f"img_size={size} must be positive"):
            create_model("t2t_vit_7", img_size=size)
    with pytest.raises(ValueError, match=r"img_size=\(32, 48\) must be"):
        create_model("t2t_vit_7", img_size=(32, 48))
    assert create_model("t2t_vit_7", img_size=[32, 32]).img_size == (32, 32)
    with pytest.raises(ValueError, match="in_chans=0"):
        create_model("t2t_vit_7", in_chans=0)
    with pytest.raises(ValueError, match=r"soft_split=\[1, 2, 3\] must be three"):
        create_model("t2t_vit_7", soft_split=[1, 2, 3])


OFFICIAL = os.environ.get("VIT_T2T_OFFICIAL")


@pytest.mark.skipif(not OFFICIAL, reason="VIT_T2T_OFFICIAL (a checkout of the official T2T-ViT code) is not set")
@pytest.mark.parametrize("name", ["t2t_vit_7", "t2t_vit_t_14"])
# Each import of the official modules registers their model names with timm again.
@pytest.mark.filterwarnings("ignore:Overwriting .* in registry")
def test_same_numbers_as_the_official_code(name):
    """Optional, beside the layout test above: the official modules with their weights give our numbers."""
    with reference_code(OFFICIAL):
        import models.t2t_vit as official

        theirs = getattr(official, name)(qk_scale=official_qk_scale(name)).eval()
    ours = create_model(name, qk_scale=official_qk_scale(name)).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)


def test_t2t_is_a_t2tvit():
    assert isinstance(create_model("t2t_vit_7"), T2TViT)


def test_t2t_vit_shares_the_encoder_with_vit():
    from vit.models import TransformerClassifier, VisionTransformer

    model = create_model("t2t_vit_7", img_size=32, num_classes=10)
    assert isinstance(model, TransformerClassifier) and issubclass(VisionTransformer, TransformerClassifier)
    assert model.embed is model.tokens_to_token and model.grid_size == (8, 8)


def test_distillation_token_on_t2t_vit():
    """One encoder: the distillation token and its head build on T2T-ViT as on a ViT, under timm's names."""
    from vit.models import sinusoid_table

    model = create_model("t2t_vit_7", img_size=32, num_classes=10, distill_token=True)
    names = list(model.state_dict())
    assert names[:3] == ["cls_token", "dist_token", "pos_embed"] and names[-2:] == [
        "head_dist.weight",
        "head_dist.bias",
    ]
    torch.testing.assert_close(model.pos_embed, sinusoid_table(2 + 64, 256))  # a fixed row for each prefix token
    assert model.no_weight_decay() == {"cls_token", "dist_token", "pos_embed"}

    x = torch.randn(2, 3, 32, 32)
    logits, logits_dist = model.train()(x)  # training: both heads apart, for the distillation loss
    assert logits.shape == logits_dist.shape == (2, 10) and not torch.allclose(logits, logits_dist)
    (logits.sum() + logits_dist.sum()).backward()
    assert model.dist_token.grad is not None and model.dist_token.grad.abs().sum() > 0

    model.eval()
    tokens = model.forward_features(x)  # (2, 2 + 64, 256)
    averaged = (tokens[:, 0] @ model.head.weight.T + model.head.bias + tokens[:, 1] @ model.head_dist.weight.T) / 2
    torch.testing.assert_close(model(x), averaged + model.head_dist.bias / 2)
    assert complexity(model).by_component["head_dist"] == 256 * 10


def test_distilled_t2t_vit_loads_its_own_weights_and_refuses_undistilled_ones(tmp_path):
    source = create_model("t2t_vit_7", img_size=32, num_classes=10, distill_token=True).eval()
    path = tmp_path / "distilled.pth"
    torch.save(source.state_dict(), path)
    loaded = load_pretrained(create_model("t2t_vit_7", img_size=32, num_classes=10, distill_token=True), path)
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(loaded.eval()(x), source(x), rtol=0, atol=0)
    plain = tmp_path / "plain.pth"
    torch.save(create_model("t2t_vit_7", img_size=32, num_classes=10).state_dict(), plain)
    with pytest.raises(ValueError, match=r"3 missing keys \(e\.g\. dist_token, head_dist\.weight, head_dist\.bias\)"):
        load_pretrained(create_model("t2t_vit_7", img_size=32, num_classes=10, distill_token=True), plain)
