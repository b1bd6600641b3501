"""Gradient checkpointing (`model.set_grad_checkpointing()`): the same gradients as the plain model, with dropout
and drop-path on, and the blocks really are run a second time in the backward pass."""

import copy

import pytest
import torch

from vit.models import create_model

# The real depth and width of each model, at a small image size so that a step takes well under a second.
MODELS = {
    "vit_tiny": {"img_size": 32, "patch_size": 4},
    "t2t_vit_7": {"img_size": 64},
    "t2t_vit_7_transformer_tokens": {"img_size": 64, "tokens_type": "transformer"},
}


def build(key: str, **overrides) -> torch.nn.Module:
    name = key.removesuffix("_transformer_tokens")
    return create_model(name, num_classes=10, **MODELS[key], **overrides)


def train_step(model: torch.nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """One forward and backward pass from a fixed RNG state (dropout and drop-path masks); the gradients."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    model(images).logsumexp(dim=-1).sum().backward()
    return {name: p.grad for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("key", list(MODELS))
def test_same_gradients_as_the_plain_model_with_drop_path(key):
    plain = build(key, drop_rate=0.1, drop_path_rate=0.5).train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing(True)
    images = torch.randn(8, 3, MODELS[key]["img_size"], MODELS[key]["img_size"])

    expected = train_step(plain, images)
    got = train_step(checkpointed, images)
    assert set(got) == set(expected)
    assert all(grad is not None for grad in got.values())
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_drop_path_draws_differ_between_steps():
    """Guards the test above: with these settings drop-path really drops, so RNG that the recomputation did not
    restore would change the gradients (two steps from different seeds give different gradients)."""
    model = build("vit_tiny", drop_path_rate=0.5).train()
    images = torch.randn(8, 3, 32, 32)
    first = train_step(model, images)["blocks.11.mlp.fc1.weight"].clone()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    model(images).logsumexp(dim=-1).sum().backward()
    assert not torch.equal(model.blocks[11].mlp.fc1.weight.grad, first)


def count_calls(modules: list[torch.nn.Module]) -> list[int]:
    """How often each module's forward starts. A pre-hook: the recomputation stops once it has rebuilt every
    tensor the backward pass needs (torch's early stop), so a block's forward hook fires only the first time."""
    counts = [0] * len(modules)

    def hook(index):
        def increment(module, inputs):
            counts[index] += 1

        return increment

    for index, module in enumerate(modules):
        module.register_forward_pre_hook(hook(index))
    return counts


def repeated_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The encoder blocks, and for T2T-ViT the two token blocks of the T2T module, which are checkpointed too."""
    units = list(model.blocks)
    t2t = getattr(model, "tokens_to_token", None)
    return units + ([t2t.attention1, t2t.attention2] if t2t is not None else [])


@pytest.mark.parametrize("key", ["vit_tiny", "t2t_vit_7"])
@pytest.mark.parametrize(("enabled", "training", "calls"), [(True, True, 2), (False, True, 1), (True, False, 1)])
def test_blocks_are_recomputed_in_the_backward_pass(key, enabled, training, calls):
    """Checkpointed, every block runs twice in a step (forward, then again in backward); off, or in eval mode
    (no training step to save memory for), once."""
    model = build(key).train(training)
    model.set_grad_checkpointing(enabled)
    counts = count_calls(repeated_units(model))
    side = MODELS[key]["img_size"]
    model(torch.randn(2, 3, side, side)).sum().backward()
    assert counts == [calls] * len(counts)


def test_no_recomputation_without_gradients():
    model = build("vit_tiny").train()
    model.set_grad_checkpointing()  # the default is True, as in timm
    counts = count_calls(list(model.blocks))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    assert model.grad_checkpointing and counts == [1] * len(counts)


@pytest.mark.slow  # about 30 s on 2 CPU cores, most of it inductor compiling the graphs
def test_compiled_model_with_checkpointing_trains():
    """torch.compile traces the non-reentrant checkpoint: a compiled step gives the eager step's gradients."""
    eager = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10, depth=2, drop_path_rate=0.2).train()
    eager.set_grad_checkpointing()
    compiled_source = copy.deepcopy(eager)
    compiled = torch.compile(compiled_source)
    images = torch.randn(4, 3, 32, 32)
    expected = train_step(eager, images)
    compiled_source.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    compiled(images).logsumexp(dim=-1).sum().backward()
    for name, param in compiled_source.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-4, atol=1e-5)
