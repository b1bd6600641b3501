"""Progressive resizing: the schedule, the ViT on smaller grids, the trainer's resized batches, and resume."""

import pytest
import torch
from trainer_utils import QUICK_SYNTHETIC, TINY_MODEL, compose_config, stub_step_parts

from vit.data.augment.batch import resize_batch
from vit.errors import ConfigError
from vit.models import create_model
from vit.models.pos_embed import resample_pos_embed
from vit.train import run
from vit.train.config import validate
from vit.train.progressive import ResizeSchedule, allow_recompiles
from vit.train.step_parts import StepState
from vit.train.trainer import train_one_epoch
from vit.weights.read import load_checkpoint

BASE = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.device=cpu", "trainer.deterministic=true", "data.img_size=32"]
BASE += ["data.patch_size=4", "data.augment.crop=pad", "model.drop_path_rate=0.1"]


def test_schedule_ramps_linearly_in_whole_patches():
    # 10 epochs (last index 9), 16 -> 32 px by index 4.5: 16 + 16 * e / 4.5, rounded down to a multiple of 4.
    schedule = ResizeSchedule(min_size=16, full_size=32, start=0.0, end=0.5, multiple=4)
    assert schedule.sizes(10) == [16, 16, 20, 24, 28, 32, 32, 32, 32, 32]
    # Held at the minimum until index 3.6, full from 7.2: 16 + 16 * (e - 3.6) / 3.6 for e = 4..7.
    later = ResizeSchedule(min_size=16, full_size=32, start=0.4, end=0.8, multiple=4)
    assert later.sizes(10) == [16, 16, 16, 16, 16, 20, 24, 28, 32, 32]
    # end=1.0: the last epoch is the first at full size (16 + 16 * e / 4 for e = 0..4).
    whole = ResizeSchedule(min_size=16, full_size=32, start=0.0, end=1.0, multiple=4)
    assert whole.sizes(5) == [16, 20, 24, 28, 32]
    # start == end: a single jump.
    jump = ResizeSchedule(min_size=24, full_size=32, start=0.5, end=0.5, multiple=8)
    assert jump.sizes(4) == [24, 24, 32, 32]


def test_vit_on_a_smaller_grid_equals_a_vit_built_for_that_size():
    """dynamic_img_size at 16 px == a ViT made for 16 px holding the same weights and the resampled table."""
    torch.manual_seed(0)
    kwargs = dict(img_size=32, patch_size=4, num_classes=10, embed_dim=48, depth=2, num_heads=3)
    dynamic = create_model("vit_tiny", dynamic_img_size=True, **kwargs).eval()
    small = create_model("vit_tiny", **{**kwargs, "img_size": 16}).eval()
    state = dynamic.state_dict()
    state["pos_embed"] = resample_pos_embed(state["pos_embed"], (4, 4), 1, (8, 8))  # 8x8 grid -> 4x4
    small.load_state_dict(state)
    images = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(dynamic(images), small(images))
    # At the full size nothing is resampled: the same numbers as the plain model with the same weights.
    plain = create_model("vit_tiny", **kwargs).eval()
    plain.load_state_dict(dynamic.state_dict())
    full = torch.randn(3, 3, 32, 32)
    assert torch.equal(dynamic(full), plain(full))


def test_only_a_dynamic_vit_takes_other_sizes_and_only_whole_patches():
    kwargs = dict(img_size=32, patch_size=4, num_classes=10, embed_dim=32, depth=1, num_heads=2)
    with pytest.raises(ValueError, match=r"expected \(batch, in_chans=3, 32, 32\)"):
        create_model("vit_tiny", **kwargs)(torch.randn(1, 3, 16, 16))
    with pytest.raises(ValueError, match="multiples of the patch size"):
        create_model("vit_tiny", dynamic_img_size=True, **kwargs)(torch.randn(1, 3, 18, 16))


class ShapeRecorder(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model, self.shapes = model, []

    def forward(self, x):
        self.shapes.append(tuple(x.shape))
        return self.model(x)


def test_the_training_step_sees_the_resized_batch():

    torch.manual_seed(0)
    model = create_model("vit_tiny", img_size=32, patch_size=4, num_classes=10, embed_dim=32, depth=1, num_heads=2)
    model.patch_embed.dynamic_img_size = True
    recorder = ShapeRecorder(model)
    settings = stub_step_parts(model, train_model=recorder)
    loader = [(torch.rand(4, 3, 32, 32), torch.randint(0, 10, (4,))) for _ in range(3)]
    train_one_epoch(settings, StepState(train_img_size=20), loader, limit_batches=None)
    assert recorder.shapes == [(4, 3, 20, 20)] * 3


def test_resize_batch_is_an_antialiased_downscale():
    constant = torch.full((1, 3, 32, 32), 0.7)
    torch.testing.assert_close(resize_batch(constant, 16), torch.full((1, 3, 16, 16), 0.7))
    # Stripes 2 px wide halved: plain bilinear sampling (at the middle of each pixel pair) keeps full-contrast
    # 1 px stripes (std 0.5), an aliased picture; antialiasing blurs them towards grey as a real camera would.
    stripes = ((torch.arange(32) // 2) % 2).float().expand(1, 3, 32, 32)
    assert resize_batch(stripes, 16)[..., 2:-2].std() < 0.3
    same = torch.rand(2, 3, 16, 16)
    assert resize_batch(same, 16) is same


def test_a_run_trains_on_the_scheduled_sizes_and_resumes_exactly(tmp_path):
    ramp = [*BASE, "trainer.epochs=4", "trainer.progressive_resize.min_size=16", "trainer.progressive_resize.end=0.5"]
    straight = run(compose_config(ramp), output_dir=tmp_path / "straight")
    # 4 epochs, ramp over the first 2: 16, 16 + 16 / 2 = 24, then the full 32.
    assert [r["train_img_size"] for r in straight["history"]] == [16, 24, 32, 32]
    # Stopped mid-ramp (after the 16 px epoch) and resumed: the same weights as the uninterrupted run.
    run(compose_config([*ramp, "trainer.stop_after_epoch=1"]), output_dir=tmp_path / "resumed")
    resumed = run(compose_config([*ramp, "trainer.resume=auto"]), output_dir=tmp_path / "resumed")
    assert [r["train_img_size"] for r in resumed["history"]] == [16, 24, 32, 32]
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["model"]
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # Off by default: no size recorded, and the same run without the ramp trains differently.
    plain = run(compose_config([*BASE, "trainer.epochs=1"]), output_dir=tmp_path / "plain")
    assert "train_img_size" not in plain["history"][0]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["model=t2t_vit_7", "trainer.progressive_resize.min_size=16"], "needs a ViT model"),
        (["trainer.progressive_resize.min_size=18"], "must be a multiple of model.patch_size=4"),
        (["trainer.progressive_resize.min_size=64"], r"must be in \[1, data.img_size=32\]"),
        (["trainer.progressive_resize.min_size=16", "trainer.progressive_resize.start=0.6"], "start=0.6"),
        (["trainer.progressive_resize.min_size=16", "trainer.progressive_resize.end=1.5"], "end=1.5"),
        (["trainer.progressive_resize.min_size=half"], "progressive_resize.min_size='half' must be an integer"),
    ],
)
def test_bad_progressive_settings_name_the_key(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(compose_config([*BASE, *overrides]))


def test_a_ramp_over_many_sizes_raises_the_compile_limit():
    import torch._dynamo.config as dynamo_config

    with dynamo_config.patch(recompile_limit=8):  # torch's own patch restores the limit for later tests
        allow_recompiles(5)  # within the limit: left alone
        assert dynamo_config.recompile_limit == 8
        # 4 -> 64 px in steps of 4: 16 sizes, each a compilation; at the default limit the last 8 would run eagerly.
        sizes = set(ResizeSchedule(min_size=4, full_size=64, start=0.0, end=1.0, multiple=4).sizes(100))
        assert len(sizes) == 16
        allow_recompiles(len(sizes))
        assert dynamo_config.recompile_limit >= 17
