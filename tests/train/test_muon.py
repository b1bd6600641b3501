"""vit/train/muon.py: timm's Muon with its Newton-Schulz iterations batched by shape computes timm's per-matrix step
(in the same precision: to fp32 rounding in fp32), keeps timm's routing to the AdamW fallback and its keywords, and
is what the trainer builds for optim=muon."""

import copy

import pytest
import torch
from timm.optim import Muon
from trainer_utils import compose_config

from vit.tasks.build import build_model_from_config
from vit.train.muon import BatchedMuon, native_ns_dtype
from vit.train.optimizer import build_optimizer

CPU = torch.device("cpu")


def model_and_grads(seed: int = 0):
    """The CPU recipe's shapes, small: 3 blocks of a 32-wide ViT (matrices of four shapes, three of each), with a
    fixed random gradient on every parameter."""
    cfg = compose_config(["model.embed_dim=32", "model.depth=3", "model.num_heads=2", "optim=muon"])
    torch.manual_seed(seed)
    model = build_model_from_config(cfg.model, num_classes=10)
    grads = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    return cfg, model, grads


def run_steps(optimizer, model, grads, steps: int = 3) -> dict:
    for step in range(steps):
        for name, p in model.named_parameters():
            p.grad = grads[name] * (1 + step)  # a different gradient each step, so the momentum matters
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("nesterov", [False, True])
def test_the_batched_step_is_timms_per_matrix_step_in_fp32(nesterov, monkeypatch):
    """Both in fp32 (timm's step computes in bf16 unless told: its per-matrix function is given fp32 here), three
    steps of momentum, weight decay and the per-shape rate scale: the same weights to fp32 rounding."""
    import timm.optim.muon as timm_muon

    cfg, model, grads = model_and_grads()
    ours_model = copy.deepcopy(model)
    timm_built = build_optimizer(model, cfg.optim, lr=1e-2, device=CPU)
    assert isinstance(timm_built, BatchedMuon)
    settings = {**timm_built.defaults, "nesterov": nesterov}
    theirs = Muon(timm_built.param_groups, **settings)  # timm's own class on the same groups
    ours = BatchedMuon(build_optimizer(ours_model, cfg.optim, lr=1e-2, device=CPU).param_groups, **settings)
    ours.ns_dtype = torch.float32

    per_matrix = timm_muon.zeropower_via_newtonschulz

    def in_fp32(*args, **kwargs):
        assert args[0].ndim == 2  # timm's step: one matrix at a time
        return per_matrix(*args, **{**kwargs, "dtype": torch.float32})

    monkeypatch.setattr(timm_muon, "zeropower_via_newtonschulz", in_fp32)
    expected = run_steps(theirs, model, grads)
    monkeypatch.setattr(timm_muon, "zeropower_via_newtonschulz", per_matrix)
    calls = []
    monkeypatch.setattr(
        timm_muon, "zeropower_via_newtonschulz", lambda *a, **k: calls.append(a[0].shape) or per_matrix(*a, **k)
    )
    got = run_steps(ours, ours_model, grads)
    assert len(calls) == 3 * 4  # one batch per shape (qkv, proj, fc1, fc2) a step, not one call per matrix
    assert all(shape[0] == 3 for shape in calls)  # each of the 3 blocks' matrices of that shape together
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert timm_muon.muon is not None and "batched" not in repr(timm_muon.muon)  # timm's function is back


def test_the_fallback_routing_and_keywords_are_timms():
    cfg, model, grads = model_and_grads()
    cfg.optim.kwargs.ns_steps = 3
    built = build_optimizer(model, cfg.optim, lr=1e-3, device=CPU)
    assert isinstance(built, BatchedMuon) and built.defaults["ns_steps"] == 3 and built.defaults["momentum"] == 0.95
    run_steps(built, model, grads, steps=1)
    routed = {name: built.state[p]["use_muon"] for name, p in model.named_parameters()}
    assert routed["blocks.0.attn.qkv.weight"] and routed["blocks.2.mlp.fc2.weight"]
    assert not routed["patch_embed.proj.weight"] and not routed["head.weight"] and not routed["pos_embed"]
    assert "exp_avg" in built.state[model.head.weight]  # the AdamW half's state, as timm keeps it


def test_the_newton_schulz_precision_is_the_devices_native_one(monkeypatch):
    import vit.train.muon as muon_module

    monkeypatch.setattr(muon_module, "cpu_has_native_bf16", lambda: False)
    assert native_ns_dtype(CPU) == torch.float32  # AVX2: emulated bf16 is slower than fp32
    monkeypatch.setattr(muon_module, "cpu_has_native_bf16", lambda: True)
    assert native_ns_dtype(CPU) == torch.bfloat16
