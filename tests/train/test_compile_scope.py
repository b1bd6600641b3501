"""trainer.compile_scope=blocks: every encoder block compiled in place (regional compilation), the rest eager."""

import pytest
import torch
from trainer_utils import FP32, QUICK_SYNTHETIC, TINY_MODEL, compose_config

from vit.errors import ConfigError
from vit.models import create_model
from vit.runtime.compile import compile_blocks, eager
from vit.train import run
from vit.train.config import validate
from vit.weights.read import load_checkpoint


def test_every_block_is_compiled_in_place_and_the_state_dict_is_unchanged():
    vit = create_model("vit_tiny", img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=3, num_heads=2)
    keys = list(vit.state_dict())
    assert compile_blocks(vit) == 3
    assert all(block._compiled_call_impl is not None for block in vit.blocks)
    assert vit.patch_embed._compiled_call_impl is None and vit.head._compiled_call_impl is None
    assert list(vit.state_dict()) == keys  # no `_orig_mod.` prefixes: checkpoints load into a plain model
    # T2T-ViT: its token blocks are regions too (2 token transformers + 1 encoder block).
    t2t = create_model("t2t_vit_t_14", img_size=32, num_classes=3, depth=1, soft_split="cifar")
    assert compile_blocks(t2t) == 3


def test_eager_runs_compiled_blocks_without_compiling():
    torch._dynamo.reset()
    vit = create_model("vit_tiny", img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=1, num_heads=2)
    plain = create_model("vit_tiny", img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=1, num_heads=2)
    plain.load_state_dict(vit.state_dict())
    compile_blocks(vit)
    x = torch.randn(2, 3, 16, 16)
    frames = dict(torch._dynamo.utils.counters["frames"])
    with eager():
        out = vit(x)
    assert dict(torch._dynamo.utils.counters["frames"]) == frames  # nothing traced
    assert torch.equal(out, plain(x))  # and the very same eager numbers


def test_a_run_with_compiled_blocks_trains_like_the_eager_one(tmp_path):
    base = [*QUICK_SYNTHETIC, *TINY_MODEL, *FP32, "trainer.device=cpu", "trainer.epochs=1", "trainer.ema=false"]
    eager_run = run(compose_config(base), output_dir=tmp_path / "eager")
    compiled_run = run(
        compose_config([*base, "trainer.compile=true", "trainer.compile_scope=blocks"]), output_dir=tmp_path / "blocks"
    )
    assert compiled_run["compiled"] and compiled_run["first_step_seconds"] > 0
    # Same data, same initial weights: the compiled kernels only round differently.
    assert compiled_run["final"]["train_loss"] == pytest.approx(eager_run["final"]["train_loss"], rel=1e-3)
    a = load_checkpoint(tmp_path / "eager" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "blocks" / "checkpoints" / "last.pt")["model"]
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-4, rtol=1e-3)


def test_a_bad_scope_is_named():
    with pytest.raises(ConfigError, match=r"trainer.compile_scope='layers' must be one of \('model', 'blocks'\)"):
        validate(compose_config(["trainer.compile_scope=layers"]))
