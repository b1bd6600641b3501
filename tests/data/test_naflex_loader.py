"""NaFlex training batches (vit/data/loading/naflex_loader.py): the token budget's schedule, the batches' patches and
grids, every image once an epoch, the same batches after a skip (a resume inside an epoch), and disjoint ranks."""

import numpy as np
import pytest
import torch

from vit.data.augment.batch import BatchAugment
from vit.data.loading.naflex_loader import NaFlexLoader, batch_schedule, grid_for
from vit.data.loading.sampling import epoch_order
from vit.naflex import patchify
from vit.settings.data import AugmentSettings

SEQ_LENS = (16, 36, 64)  # 16, 24 and 32 px of a 32 px image in 4 px patches


def test_the_schedule_holds_the_token_budget_and_is_fixed_by_the_seed():
    schedule = batch_schedule(1000, SEQ_LENS, tokens=8 * 64, seed=3)
    assert schedule == batch_schedule(1000, SEQ_LENS, tokens=8 * 64, seed=3)
    assert schedule != batch_schedule(1000, SEQ_LENS, tokens=8 * 64, seed=4)
    assert {seq_len for seq_len, _, _ in schedule} == set(SEQ_LENS)
    for seq_len, size, patch in schedule:
        assert size == 8 * 64 // seq_len and patch is None  # 32 images of 16 tokens, 14 of 36, 8 of 64
    used = sum(size for _, size, _ in schedule)
    assert 1000 - 32 < used <= 1000  # stops only when the next batch would not be full


@pytest.mark.parametrize(
    "image_hw, seq_len, expected",
    [((32, 32), 16, (16, 16)), ((32, 32), 36, (24, 24)), ((32, 32), 64, (32, 32)), ((32, 64), 32, (16, 32))],
)
def test_a_batch_grid_keeps_the_aspect_ratio_within_its_tokens(image_hw, seq_len, expected):
    assert grid_for(image_hw, 4, seq_len) == expected


def loader(n=96, *, rank=0, world_size=1, seed=0, batch_size=4, patch_sizes=None):
    images = np.random.default_rng(0).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    spec = AugmentSettings(crop="pad", pad=4, hflip=True, auto_augment=None)
    augment = BatchAugment(spec, (0.0,) * 3, (1.0,) * 3, 32, train=True)
    targets = np.arange(n)  # each image's own label: which images a batch holds
    common = dict(batch_size=batch_size, device="cpu", seed=seed, rank=rank, world_size=world_size)
    common.update(patch_sizes=patch_sizes)
    return NaFlexLoader(images, targets, augment, seq_lens=SEQ_LENS, max_seq_len=64, patch_size=4, **common)


def test_batches_are_packed_patches_of_each_batch_grid_and_every_image_comes_once():
    data = loader()
    seen = []
    batches = list(data)
    assert len(batches) == len(data) == len(data.schedule)
    for (batch, targets), (seq_len, size, _, _) in zip(batches, data.schedule.of_epoch(0), strict=True):
        assert batch["patches"].shape == (size, seq_len, 4 * 4 * 3)
        side = int(seq_len**0.5)
        assert batch["patch_valid"].all()  # square images fill their square grids
        assert batch["patch_coord"][:, -1].tolist() == [[side - 1, side - 1]] * size
        assert targets.shape == (size,)
        seen += targets.tolist()
    assert len(seen) == len(set(seen)) == sum(size for _, size, _ in data.schedule.batches)  # no image twice


def test_the_patches_are_the_augmented_image_resized_to_the_grid():
    data = loader()
    data.augment = BatchAugment(AugmentSettings(crop="none", hflip=False, auto_augment=None), (0.0,) * 3,
                                (1.0,) * 3, 32, train=True)  # fmt: skip
    batch, targets = next(iter(data))
    seq_len, size, start, _ = data.schedule.of_epoch(0)[0]
    side = int(seq_len**0.5) * 4
    order = epoch_order(96, seed=0, epoch=0)[start : start + size]
    images = data.images[order].float() / 255
    images = torch.nn.functional.interpolate(images, size=(side, side), mode="bilinear", antialias=True)
    torch.testing.assert_close(batch["patches"], patchify(images, (4, 4))[0])
    torch.testing.assert_close(targets, data.targets[order])


def test_skipped_batches_resume_the_epoch_with_the_same_batches():
    whole = list(loader())
    resumed = loader()
    resumed.skip_batches(3)
    assert len(resumed) == len(whole) - 3
    rest = list(resumed)
    assert len(rest) == len(whole) - 3
    for (a, ta), (b, tb) in zip(whole[3:], rest, strict=True):
        torch.testing.assert_close(a["patches"], b["patches"])
        assert torch.equal(ta, tb)
    second = list(resumed)  # the next epoch: a new order of the same batches
    assert sorted(t.numel() for _, t in second) == sorted(t.numel() for _, t in whole)
    assert [t.numel() for _, t in second] != [t.numel() for _, t in whole]


def test_two_ranks_share_each_batch_grid_and_split_its_images():
    ranks = [list(loader(rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    for (a, _), (b, _) in zip(*ranks, strict=True):
        assert a["patches"].shape == b["patches"].shape  # one seq_len and size per global batch
    seen = [t for rank in ranks for _, targets in rank for t in targets.tolist()]
    assert len(seen) == len(set(seen)) == 2 * sum(size for _, size, _ in loader(world_size=2).schedule.batches)


def test_the_torch_loader_keeps_each_image_at_its_own_shape(tmp_path):
    """data.loader=torch: each image decoded whole at its own shape for its batch's seq_len (a wide image on a
    wide grid, a tall one on a tall grid), the images of a batch padded to its seq_len and masked."""
    from trainer_utils import compose_config, mixed_shape_tree

    from vit.data.loading.build import build_data

    root = mixed_shape_tree(tmp_path / "tree")
    cfg = compose_config([
        "data=imagefolder", f"data.root={root}", "data.img_size=32", "data.patch_size=4", "data.batch_size=2",
        "data.loader=torch", "data.num_workers=0", "data.augment.crop=none", "data.augment.auto_augment=null",
        "data.naflex.seq_lens=[16,64]",
    ])  # fmt: skip
    bundle = build_data(cfg.data, device="cpu", seed=0)
    loader = bundle.train_loader
    grids = {seq_len: {grid_for(hw, 4, seq_len) for hw in [(24, 40), (40, 24), (32, 32)]} for seq_len in (16, 64)}
    assert grids[64] == {(24, 40), (40, 24), (32, 32)}  # each file at its own size: 6 x 10, 10 x 6, 8 x 8 patches
    seen = []
    for batch, targets in loader:
        seq_len = batch["patches"].shape[1]
        rows, cols = (batch["patch_coord"].amax(dim=1) + 1).unbind(-1)  # (B,) each: the grid of each image
        for h, w, valid in zip(rows.tolist(), cols.tolist(), batch["patch_valid"], strict=True):
            assert (4 * h, 4 * w) in grids[seq_len] and int(valid.sum()) == h * w <= seq_len
            seen.append((h, w))
        assert batch["patches"].shape[0] == targets.shape[0] == 2 * 64 // seq_len
    assert len({h > w for h, w in seen if h != w}) == 2  # wide and tall grids both kept
    assert len(seen) == sum(size for _, size, _ in loader.batches.schedule.batches)


def test_random_patch_sizes_cut_each_batch_in_its_drawn_side_within_the_token_budget():
    """data.naflex.patch_sizes=[2,4]: each batch draws a side too, fixed by the seed;
    a batch of the run's own side comes flat as before, one of another side unflattened, (size, seq_len, p, p, 3),
    its images resized so that seq_len patches of that side cover them (a 2 px patch: half the image's side)."""
    schedule = batch_schedule(1000, SEQ_LENS, tokens=8 * 64, seed=3, patch_sizes=(2, 4))
    assert {patch for _, _, patch in schedule} == {2, 4}
    assert schedule == batch_schedule(1000, SEQ_LENS, tokens=8 * 64, seed=3, patch_sizes=(2, 4))
    data = loader(patch_sizes=(2, 4))
    sides = set()
    for (batch, _), (seq_len, size, _, patch) in zip(data, data.schedule.of_epoch(0), strict=True):
        side = int(seq_len**0.5)
        if patch == 4:
            assert batch["patches"].shape == (size, seq_len, 4 * 4 * 3)
        else:
            assert batch["patches"].shape == (size, seq_len, 2, 2, 3)
        assert batch["patch_coord"][:, -1].tolist() == [[side - 1, side - 1]] * size
        sides.add(patch)
    assert sides == {2, 4}


def test_the_torch_loader_cuts_each_batch_in_its_drawn_patch_side(tmp_path):
    """data.loader=torch with data.naflex.patch_sizes: each file decoded at its own shape for its batch's seq_len
    patches of the batch's side; a side other than data.patch_size comes unflattened."""
    from trainer_utils import compose_config, mixed_shape_tree

    from vit.data.loading.build import build_data

    root = mixed_shape_tree(tmp_path / "tree")
    cfg = compose_config([
        "data=imagefolder", f"data.root={root}", "data.img_size=32", "data.patch_size=4", "data.batch_size=2",
        "data.loader=torch", "data.num_workers=0", "data.augment.crop=none", "data.augment.auto_augment=null",
        "data.naflex.seq_lens=[16,64]", "data.naflex.patch_sizes=[2,4]",
    ])  # fmt: skip
    loader = build_data(cfg.data, device="cpu", seed=0).train_loader
    planned = loader.batches.schedule.of_epoch(0)
    assert {patch for _, _, _, patch in planned} == {2, 4}
    for (batch, _), (seq_len, size, _, patch) in zip(loader, planned, strict=True):
        expected = (size, seq_len, 4 * 4 * 3) if patch == 4 else (size, seq_len, 2, 2, 3)
        assert tuple(batch["patches"].shape) == expected
