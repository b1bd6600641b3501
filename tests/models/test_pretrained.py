"""load_pretrained: timm names, .pth/.safetensors files, wrappers, resampling, head re-init, no pickle."""

import logging

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit.weights.read as pretrained
from vit.models import create_model
from vit.weights.read import load_pretrained


@pytest.fixture(scope="module")
def timm_tiny():
    return timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()


def _features_agree(ours, theirs, size=224):
    x = torch.randn(2, 3, size, size)
    torch.testing.assert_close(ours.eval().forward_features(x), theirs.forward_features(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("wrapper", [None, "state_dict_ema", "state_dict", "model"])
def test_loads_pth_files_in_every_wrapper(tmp_path, timm_tiny, wrapper):
    sd = timm_tiny.state_dict()
    path = tmp_path / "weights.pth"
    torch.save(sd if wrapper is None else {wrapper: sd, "epoch": 3}, path)
    model = load_pretrained(create_model("vit_tiny"), path)
    _features_agree(model, timm_tiny)
    torch.testing.assert_close(model.head.weight, timm_tiny.head.weight)


def test_loads_safetensors_and_ddp_prefix(tmp_path, timm_tiny):
    path = tmp_path / "weights.safetensors"
    save_file({f"module.{k}": v.contiguous() for k, v in timm_tiny.state_dict().items()}, str(path))
    _features_agree(load_pretrained(create_model("vit_tiny"), path), timm_tiny)


def test_other_class_count_reinitialises_head_and_says_so(tmp_path, timm_tiny, caplog):
    path = tmp_path / "weights.pth"
    torch.save(timm_tiny.state_dict(), path)
    fresh = create_model("vit_tiny", num_classes=10)
    head_before = fresh.head.weight.clone()
    with caplog.at_level(logging.WARNING):
        model = load_pretrained(fresh, path)
    assert "checkpoint has 1000 classes, model has 10" in caplog.text
    assert torch.equal(model.head.weight, head_before)
    _features_agree(model, timm_tiny)


def test_resamples_position_embedding_to_384(timm_tiny):
    model = load_pretrained(create_model("vit_tiny", img_size=384), timm_tiny.state_dict())
    assert model.pos_embed.shape == (1, 1 + 24 * 24, 192)
    torch.testing.assert_close(model.pos_embed[:, :1], timm_tiny.pos_embed[:, :1])
    assert model(torch.randn(1, 3, 384, 384)).shape == (1, 1000)


def test_timm_source_goes_through_timm(monkeypatch, timm_tiny):
    asked = {}

    def fake_create_model(name, pretrained=False, **kwargs):
        asked.update(name=name, pretrained=pretrained)
        return timm_tiny

    monkeypatch.setattr(timm, "create_model", fake_create_model)
    monkeypatch.setattr(pretrained, "host_reachable", lambda host: True)  # as if a network were there
    model = load_pretrained(create_model("vit_tiny"), "timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    assert asked == {"name": "vit_tiny_patch16_224.augreg_in21k_ft_in1k", "pretrained": True}
    _features_agree(model, timm_tiny)


def test_another_model_names_the_mismatch(timm_tiny):
    with pytest.raises(ValueError, match=r"192 wide and 12 deep, the configured one has model.embed_dim=384"):
        load_pretrained(create_model("vit_small"), timm_tiny.state_dict())
    state_dict = timm_tiny.state_dict()
    state_dict["blocks.0.attn.qkv.bias"] = state_dict["blocks.0.attn.qkv.bias"][:10]
    with pytest.raises(ValueError, match=r"shape mismatches \(blocks.0.attn.qkv.bias: checkpoint \(10,\) vs model"):
        load_pretrained(create_model("vit_tiny"), state_dict)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.pth"):
        load_pretrained(create_model("vit_tiny"), tmp_path / "nothing.pth")


class Payload:
    """An object whose unpickling would run code: weights_only must refuse it."""

    def __reduce__(self):
        return (print, ("pwned",))


def test_pickled_code_is_refused(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "payload": Payload()}, path)
    with pytest.raises(ValueError, match="weights_only=True"):
        pretrained.read_weights(path)


def test_truncated_file_is_refused(tmp_path, timm_tiny):
    path = tmp_path / "cut.pth"
    torch.save(timm_tiny.state_dict(), path)
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(ValueError, match="cut.pth"):
        load_pretrained(create_model("vit_tiny"), path)


def test_the_heads_a_file_implies_are_checked_and_named():
    """A bare state dict records no head count, but a qk-norm's (head_dim,) weight implies one: 3 heads of 64 in a
    model configured with 6 is named as the keys to set, before the shapes are compared."""
    from vit.weights.fit import PretrainedError

    weights = create_model("vit_tiny", depth=2, qk_norm=True).state_dict()  # 192 wide, 3 heads
    with pytest.raises(PretrainedError) as error:
        load_pretrained(create_model("vit_tiny", depth=2, qk_norm=True, num_heads=6), weights)
    assert str(error.value) == (
        "state dict is a model 192 wide and 2 deep with 3 heads, the configured one has model.num_heads=6: set "
        "model.num_heads=3 (or pick the model config of those weights)"
    )
