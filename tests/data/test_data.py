"""The data package on generated image trees, archives (safe extraction), synthetic data, both loaders."""

import io
import os
import tarfile
import threading
import time
import zipfile

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from torch.utils.data import DistributedSampler
from trainer_utils import MODES, REPO, compose_config, make_tree, noise_image

import vit.data.loading.decoded_cache as decoded_cache
import vit.data.sources.archive as archive_module
from vit.data import DataError, build_data
from vit.data.augment.batch import random_erasing, random_pad_crop, random_resized_crop
from vit.data.augment.policies import build_policy
from vit.data.augment.rand_augment import TimmRandAugment
from vit.data.images import to_rgb
from vit.data.loading.sampling import evaluation_order
from vit.data.sources.archive import COMPLETE_MARKER, ArchiveError, extract_archive


def folder_cfg(root, **extra):
    cfg = {
        "name": "imagefolder",
        "root": None if root is None else str(root),
        "img_size": 16,
        "batch_size": 4,
        "num_workers": 0,
        "augment": {"crop": "pad", "hflip": True, "auto_augment": "autoaug", "label_smoothing": 0.1},
    }
    cfg.update(extra)
    return cfg


@pytest.mark.parametrize("mode", MODES + ["LA", "I"])
def test_every_mode_becomes_8bit_rgb(mode):
    image = noise_image("L", 8, 0).convert(mode) if mode in ("LA", "I") else noise_image(mode, 8, 0)
    rgb = to_rgb(image)
    assert rgb.mode == "RGB" and rgb.size == (8, 8)
    if mode == "I;16":  # the 16-bit range is scaled, not clipped to white
        assert 0 < np.asarray(rgb).mean() < 255 and np.asarray(rgb).std() > 20


def test_16bit_is_a_fixed_rescale_not_a_clip_or_stretch():
    mid_grey = Image.fromarray(np.full((4, 4), 128 * 257, dtype=np.uint16))  # I;16
    assert mid_grey.mode == "I;16"
    assert np.asarray(to_rgb(mid_grey)).tolist() == np.full((4, 4, 3), 128).tolist()
    ramp = Image.fromarray(np.linspace(0, 65535, 256).astype(np.uint16).reshape(16, 16))
    values = np.asarray(to_rgb(ramp))[..., 0].ravel()
    assert values[0] == 0 and values[-1] == 255 and (np.diff(values.astype(int)) >= 0).all()


def test_imagefolder_tree_batches_and_class_map(tmp_path):
    bundle = build_data(folder_cfg(make_tree(tmp_path / "tree")))
    assert bundle.class_to_idx == {"cat": 0, "dog": 1, "frog": 2}
    assert bundle.num_classes == 3 and bundle.num_train == 24 and bundle.num_val == 12
    x, y = next(iter(bundle.train_loader))
    assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert len(bundle.train_loader) == 6 and len(bundle.val_loader) == 3
    assert bundle.mixup_fn is None and "LabelSmoothing" in type(bundle.train_criterion).__name__


def test_images_far_smaller_than_img_size_are_said_once(tmp_path, caplog):
    """32 px JPEGs at the image-folder default of 224 px train 49x the pixels: one line says so, with the fix."""
    root = make_tree(tmp_path / "tree", size=20)
    with caplog.at_level("WARNING", logger="vit.data"):
        build_data(folder_cfg(root, img_size=16))
        assert not [r for r in caplog.records if "upsampled" in r.getMessage()]
        build_data(folder_cfg(root, img_size=64))
    (line,) = [r.getMessage() for r in caplog.records if "upsampled" in r.getMessage()]
    assert line.startswith("data.img_size=64 but the training images are about 20 px") and "data.img_size=20" in line
    assert "grey" not in line and "auto_augment" not in line and "hflip" not in line  # photos, AutoAugment already


def test_small_grey_digits_at_the_folder_defaults_get_the_settings_that_fit(tmp_path, caplog):
    """8x8 grey images (scikit-learn's digits are such) at the image-folder defaults (224 px, a random-resized
    crop, flips, a policy): one line names the size, the grey and each setting to change."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("val", 2)):
        for name in ("one", "seven"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 17, (8, 8), dtype=np.uint8) * 15
                Image.fromarray(pixels).save(tmp_path / split / name / f"{i}.png")
    defaults = {"img_size": 224, "augment": {"crop": "rrc", "hflip": True, "auto_augment": "rand-m9-mstd0.5-inc1"}}
    with caplog.at_level("WARNING", logger="vit.data"):
        build_data(folder_cfg(tmp_path, **defaults))
    (line,) = [r.getMessage() for r in caplog.records if "upsampled" in r.getMessage()]
    assert line.startswith("data.img_size=224 but the training images are about 8 px on their longer side, grey: ")
    assert line.endswith(
        "small images train at their own size: data.img_size=8 data.patch_size=2 data.augment.crop=pad "
        "data.augment.pad=1 data.augment.auto_augment=null (and data.augment.hflip=false where a mirrored image "
        "is another class: digits, letters)"
    )


@pytest.mark.parametrize(("side", "patch"), [(8, 2), (16, 2), (28, 4), (32, 4), (64, 8), (7, 1), (96, 12)])
def test_the_small_image_patch_divides_the_side_and_gives_4_to_8_tokens_a_side(side, patch):
    from vit.data.sources.folders import small_patch

    assert small_patch(side) == patch


@pytest.mark.parametrize("val_name", ["val", "validation", "test"])
def test_val_split_is_found_by_name(tmp_path, val_name):
    bundle = build_data(folder_cfg(make_tree(tmp_path / "t", val=val_name, per_class=4)))
    assert bundle.num_val == 6


def test_missing_root_and_missing_val_are_named(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        build_data(folder_cfg(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="data.root is not set"):
        build_data(folder_cfg(None))
    (tmp_path / "only" / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="no val/, validation/ or test/"):
        build_data(folder_cfg(tmp_path / "only"))
    (tmp_path / "empty" / "images").mkdir(parents=True)
    with pytest.raises(DataError, match="has no train/ folder"):
        build_data(folder_cfg(tmp_path / "empty"))


def test_mismatched_classes_are_named(tmp_path):
    root = make_tree(tmp_path / "t", per_class=2)
    (root / "val" / "zebra").mkdir()
    Image.new("RGB", (8, 8)).save(root / "val" / "zebra" / "z.png")
    with pytest.raises(DataError, match="zebra"):
        build_data(folder_cfg(root))


def _tar_tree(tmp_path, suffix="tar.gz"):
    tree = make_tree(tmp_path / "src" / "mydata", per_class=4)
    archive = tmp_path / f"mydata.{suffix}"
    with tarfile.open(archive, "w:gz" if suffix.endswith("gz") else "w") as tar:
        tar.add(tree, arcname="mydata")
    return archive


def test_archive_is_extracted_once_and_reused(tmp_path):
    archive = _tar_tree(tmp_path)
    cache = tmp_path / "cache"
    bundle = build_data(folder_cfg(archive, cache_dir=str(cache)))
    assert bundle.num_train == 12
    (extracted,) = [p for p in cache.iterdir() if p.is_dir()]  # beside the scan's results (data.cache_dir)
    assert (extracted / COMPLETE_MARKER).is_file()
    stamp = (extracted / COMPLETE_MARKER).stat().st_mtime_ns
    assert extract_archive(archive, cache) == extracted
    assert (extracted / COMPLETE_MARKER).stat().st_mtime_ns == stamp  # not extracted again


def _tree_files(root, undated=()):
    """{relative path: (bytes, or None for a folder; mtime in seconds, or None for the paths in `undated`)}."""
    return {
        name: (path.read_bytes() if path.is_file() else None, None if name in undated else int(path.stat().st_mtime))
        for path in sorted(root.rglob("*"))
        for name in [str(path.relative_to(root))]
    }


def test_a_tar_of_plain_files_extracts_as_the_libraries_data_filter_does(tmp_path):
    """The quick extraction of archives without links (a filter that skips the `data` filter's real-path checks)
    gives the files, folders, bytes and mtimes that tarfile's own `data` filter gives, also for members whose
    folders have no entry of their own and for `./` names."""
    archive = tmp_path / "plain.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(make_tree(tmp_path / "src" / "mydata", per_class=2), arcname="mydata")
        for name, mtime in (("./loose/deep/a.txt", 1_000_000), ("top.txt", 2_000_000)):  # no folder entries
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 3, mtime
            tar.addfile(info, io.BytesIO(b"abc"))
    ours = extract_archive(archive, tmp_path / "c")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "library", filter="data")
    # Folders without an entry of their own take the time each extraction made them: not the archive's to say.
    implicit = ("loose", "loose/deep")
    expected, got = _tree_files(tmp_path / "library", implicit), _tree_files(ours, implicit)
    assert got.items() >= expected.items() and len(expected) > 20
    assert set(got) - set(expected) == {COMPLETE_MARKER}
    assert int((ours / "loose" / "deep" / "a.txt").stat().st_mtime) == 1_000_000


def test_second_call_does_not_extract(tmp_path, monkeypatch):
    archive = _tar_tree(tmp_path)
    first = extract_archive(archive, tmp_path / "c")

    def fail(*args):
        raise AssertionError("extracted again")

    monkeypatch.setattr(archive_module, "_extract", fail)
    assert extract_archive(archive, tmp_path / "c") == first
    assert build_data(folder_cfg(archive, cache_dir=str(tmp_path / "c"))).num_train == 12


def test_processes_extracting_one_archive_at_once_take_turns(tmp_path, monkeypatch):
    """Two extractions of one archive started together (two DDP ranks, two runs): the second waits for the first's
    lock and finds the tree there, instead of extracting it again."""
    archive = _tar_tree(tmp_path)
    started, extractions = threading.Event(), []
    real_extract = archive_module._extract

    def slow_extract(*args):
        extractions.append(threading.current_thread().name)
        started.set()
        time.sleep(0.5)  # the second call arrives while this one holds the lock
        real_extract(*args)

    monkeypatch.setattr(archive_module, "_extract", slow_extract)
    results = {}
    first = threading.Thread(target=lambda: results.update(first=extract_archive(archive, tmp_path / "c")))
    first.start()
    assert started.wait(10)
    second = extract_archive(archive, tmp_path / "c")
    first.join()
    assert second == results["first"] and (second / COMPLETE_MARKER).is_file()
    assert len(extractions) == 1, extractions


def test_replaced_archive_is_extracted_again(tmp_path):
    archive = _tar_tree(tmp_path, "tar")
    target = extract_archive(archive)
    with tarfile.open(archive, "w") as tar:  # a new archive under the same name: one class only
        tar.add(tmp_path / "src" / "mydata" / "train" / "cat", arcname="mydata/train/cat")
        tar.add(tmp_path / "src" / "mydata" / "val" / "cat", arcname="mydata/val/cat")
    os.utime(archive, (1, 1))  # a different mtime, as a copied-over file would have
    assert extract_archive(archive) == target
    assert sorted(p.name for p in (target / "mydata" / "train").iterdir()) == ["cat"]


def test_archive_beside_itself_when_writable(tmp_path):
    archive = _tar_tree(tmp_path, "tar")
    target = extract_archive(archive)
    assert target.parent == tmp_path / ".vit-cache" and target.name.startswith("mydata-")


def test_half_extracted_cache_is_redone(tmp_path):
    archive = _tar_tree(tmp_path)
    target = extract_archive(archive, tmp_path / "c")
    (target / COMPLETE_MARKER).unlink()
    (target / "mydata" / "train").rename(target / "mydata" / "broken")
    again = extract_archive(archive, tmp_path / "c")
    assert (again / "mydata" / "train").is_dir() and (again / COMPLETE_MARKER).is_file()


def test_zip_archive_trains(tmp_path):
    tree = make_tree(tmp_path / "src", per_class=4)
    archive = tmp_path / "tree.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in tree.rglob("*"):
            zf.write(path, path.relative_to(tree))
    bundle = build_data(folder_cfg(archive, cache_dir=str(tmp_path / "c")))
    assert bundle.num_train == 12


def _evil_tar(tmp_path, member: tarfile.TarInfo, data=b"x"):
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return archive


@pytest.mark.parametrize(
    ("name", "kind", "link", "needle"),
    [
        ("../evil.txt", tarfile.REGTYPE, "", "escapes the target"),
        ("/etc/evil.txt", tarfile.REGTYPE, "", "absolute path"),
        ("train/link", tarfile.SYMTYPE, "../../outside", "link pointing outside"),
        ("train/abs", tarfile.SYMTYPE, "/etc/passwd", "link pointing outside"),
        ("train/pipe", tarfile.FIFOTYPE, "", "special file"),
    ],
)
def test_tar_slip_is_refused(tmp_path, name, kind, link, needle):
    member = tarfile.TarInfo(name)
    member.type, member.linkname, member.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    archive = _evil_tar(tmp_path, member)
    with pytest.raises(ArchiveError, match=needle):
        extract_archive(archive, tmp_path / "c")
    assert not (tmp_path / "evil.txt").exists()
    with pytest.raises(DataError, match="refusing to extract"):
        build_data(folder_cfg(archive, cache_dir=str(tmp_path / "c2")))


def test_links_inside_the_tree_extract_but_chained_links_out_are_refused(tmp_path):
    archive = _tar_tree(tmp_path, "tar")
    with tarfile.open(archive, "a") as tar:  # a harmless link to a sibling file
        link = tarfile.TarInfo("mydata/train/cat/alias.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "img 0.jpg"
        tar.addfile(link)
    assert (extract_archive(archive, tmp_path / "c") / "mydata" / "train" / "cat" / "alias.jpg").is_file()
    # sub/up -> .. is the root; sub/up/out -> .. looks like "sub" lexically but is the root's parent.
    members = [("sub/up", ".."), ("sub/up/out", "..")]
    evil = tmp_path / "chain.tar"
    with tarfile.open(evil, "w") as tar:
        for name, target in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    with pytest.raises(ArchiveError):
        extract_archive(evil, tmp_path / "c3")


def test_zip_slip_is_refused(tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../evil.txt", "x")
    with pytest.raises(ArchiveError, match="escapes the target"):
        extract_archive(archive, tmp_path / "c")


def test_synthetic_is_deterministic_and_balanced_limit():
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 32, "num_workers": 0, "augment": {"crop": "none"}}
    cfg["loader"] = "torch"  # the subset's targets are read through the torch loader's dataset
    cfg["synthetic"] = {"num_train": 256, "num_val": 64}
    a, b = build_data(cfg, seed=3), build_data(cfg, seed=3)
    xa, ya = next(iter(a.val_loader))
    xb, yb = next(iter(b.val_loader))
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    limited = build_data({**cfg, "limit_train_samples": 100}, seed=3)
    assert limited.num_train == 100
    counts = np.bincount(limited.train_loader.dataset.dataset.targets, minlength=10)
    assert counts.max() - counts.min() <= 1


def test_mixup_gives_soft_targets_and_matching_loss():
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 8, "num_workers": 0}
    cfg["synthetic"] = {"num_train": 64, "num_val": 16}
    cfg["augment"] = {"crop": "none", "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing": 0.1}
    bundle = build_data(cfg)
    x, y = next(iter(bundle.train_loader))
    mixed_x, soft_y = bundle.mixup_fn(x, y)
    assert soft_y.shape == (8, 10) and torch.allclose(soft_y.sum(1), torch.ones(8))
    assert type(bundle.train_criterion).__name__ == "SoftTargetCrossEntropy"


def test_bad_settings_are_named():
    base = {"name": "synthetic", "img_size": 16, "batch_size": 8, "num_workers": 0}
    with pytest.raises(DataError, match="data.name='mnist'"):
        build_data({**base, "name": "mnist"})
    with pytest.raises(DataError, match="data.loader='fast'"):
        build_data({**base, "loader": "fast"})
    with pytest.raises(DataError, match="data.augment.crop='zoom'"):
        build_data({**base, "augment": {"crop": "zoom"}})
    with pytest.raises(DataError, match="data.augment.auto_augment='strong'"):
        build_data({**base, "augment": {"auto_augment": "strong"}})
    with pytest.raises(DataError, match="data.batch_size=4096"):
        build_data({**base, "batch_size": 4096, "synthetic": {"num_train": 64, "num_val": 8}})


def test_offline_cifar_says_where_it_looked(tmp_path):
    cfg = {"name": "cifar10", "root": str(tmp_path), "img_size": 32, "batch_size": 8, "download": False}
    with pytest.raises(DataError, match=r"cifar-10-batches-py.*data=imagefolder") as err:
        build_data(cfg)
    assert str((tmp_path / "cifar-10-batches-py").resolve()) in str(err.value)


def test_synthetic_classes_are_learnable():
    """Nearest class mean on raw pixels already beats chance by far: the signal a tiny ViT picks up."""
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 64, "num_workers": 0, "augment": {"crop": "none"}}
    cfg["synthetic"] = {"num_train": 512, "num_val": 256}
    bundle = build_data(cfg, seed=0)
    x, y = (torch.cat(t) for t in zip(*bundle.train_loader, strict=True))
    means = torch.stack([x[y == c].mean(0) for c in range(10)])  # (classes, 3, H, W)
    vx, vy = (torch.cat(t) for t in zip(*bundle.val_loader, strict=True))
    predicted = torch.cdist(vx.flatten(1), means.flatten(1)).argmin(1)
    assert (predicted == vy).float().mean() > 0.6
    assert bundle.class_to_idx == {f"class_{i}": i for i in range(10)}


def test_struct_dictconfig_with_missing_keys_works():
    cfg = OmegaConf.create({"name": "synthetic", "img_size": 16, "batch_size": 8, "num_workers": 0})
    cfg.synthetic = {"num_train": 32, "num_val": 8}
    OmegaConf.set_struct(cfg, True)
    bundle = build_data(cfg)
    assert bundle.mean == (0.5, 0.5, 0.5) and len(bundle.train_loader) == 4


def test_torch_loader_order_is_seeded():
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 16, "num_workers": 0, "augment": {"crop": "none"}}
    cfg["synthetic"] = {"num_train": 64, "num_val": 16}
    order = lambda seed: torch.cat([y for _, y in build_data(cfg, seed=seed).train_loader]).tolist()
    assert order(5) == order(5) and order(5) != order(6)


def test_distributed_sampler_shards_the_train_split():
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 8, "num_workers": 0, "loader": "torch"}
    cfg["synthetic"] = {"num_train": 64, "num_val": 16}
    bundle = build_data(cfg, rank=1, world_size=2)
    assert isinstance(bundle.train_sampler, DistributedSampler) and len(bundle.train_loader) == 4


@pytest.mark.parametrize("policy", ["autoaug", "trivial", "rand-m9-mstd0.5-inc1", "augmix-m5-w4-d2"])
@pytest.mark.parametrize("loader", ["torch", "resident"])
def test_every_policy_on_both_loaders(policy, loader):
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 8, "num_workers": 0, "loader": loader}
    cfg["synthetic"] = {"num_train": 16, "num_val": 8}
    cfg["augment"] = {"crop": "rrc", "scale_min": 0.3, "auto_augment": policy, "re_prob": 0.5}
    x, y = next(iter(build_data(cfg).train_loader))
    assert x.shape == (8, 3, 16, 16) and x.dtype == torch.float32 and torch.isfinite(x).all()


def test_autoaugment_policy_follows_image_size():
    assert build_policy("autoaug", 32, (0.5,) * 3).policy == "cifar10"
    assert build_policy("autoaug", 64, (0.5,) * 3).policy == "cifar10"
    assert build_policy("autoaug", 224, (0.5,) * 3).policy == "imagenet"
    rand = build_policy("rand-m9-mstd0.5-inc1", 32, (0.5,) * 3)
    assert isinstance(rand, TimmRandAugment) and rand.magnitude == 9 and rand.magnitude_std == 0.5 and rand.increasing


# ---- the GPU-resident loader, run on the CPU here ----


def resident_cfg(**aug):
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 16, "num_workers": 0, "loader": "resident"}
    cfg["synthetic"] = {"num_train": 64, "num_val": 20}
    cfg["augment"] = {"crop": "pad", "pad": 4, "hflip": True, **aug}
    return cfg


def test_resident_loader_val_batches_are_the_normalised_images():
    bundle = build_data(resident_cfg())
    assert bundle.loader_kind == "resident" and len(bundle.val_loader) == 2  # 20 images: 16 + 4
    xs, ys = zip(*bundle.val_loader, strict=True)
    x = torch.cat(xs)
    order = bundle.val_loader.val_order  # every image once, classes interleaved
    assert sorted(order.tolist()) == list(range(20))
    raw = torch.from_numpy(bundle.val_loader.images.numpy()).float()[order] / 255  # (N, 3, H, W)
    mean, std = torch.tensor(bundle.mean).view(1, 3, 1, 1), torch.tensor(bundle.std).view(1, 3, 1, 1)
    torch.testing.assert_close(x, (raw - mean) / std)
    assert torch.cat(ys).tolist() == bundle.val_loader.targets[order].tolist()


def test_every_prefix_of_the_evaluation_order_is_class_balanced():
    targets = np.repeat([0, 1, 2], [40, 20, 4])  # sorted by class, as an image folder is, and unbalanced
    order = evaluation_order(targets).numpy()
    assert sorted(order.tolist()) == list(range(64))
    for prefix in (3, 16, 32, 48):
        counts = np.bincount(targets[order[:prefix]], minlength=3)
        assert np.abs(counts - prefix * np.array([40, 20, 4]) / 64).max() <= 1, (prefix, counts)
    assert evaluation_order(targets).tolist() == order.tolist()  # fixed: the same images in every run


@pytest.mark.parametrize("loader", ["torch", "resident"])
def test_a_limited_evaluation_of_a_sorted_folder_sees_every_class(tmp_path, loader):
    """limit_val_batches=1 over an image folder (sorted by class) evaluated the first class only."""
    root = make_tree(tmp_path / "tree", per_class=4)
    cfg = folder_cfg(root, loader=loader, batch_size=3, cache_dir=str(tmp_path / "cache"))
    first = next(iter(build_data(cfg).val_loader))[1]
    assert sorted(first.tolist()) == [0, 1, 2]
    # Two ranks: disjoint, every image once, and the first batches together still hold every class.
    ranks = [[y for _, y in build_data(cfg, rank=r, world_size=2).val_loader] for r in (0, 1)]
    assert sorted(torch.cat([torch.cat(r) for r in ranks]).tolist()) == [0, 0, 1, 1, 2, 2]
    assert set(torch.cat([r[0] for r in ranks]).tolist()) == {0, 1, 2}


def test_resident_loader_train_is_seeded_and_augments():
    a, b = build_data(resident_cfg(), seed=1), build_data(resident_cfg(), seed=1)
    xa, ya = next(iter(a.train_loader))
    xb, yb = next(iter(b.train_loader))
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert len(a.train_loader) == 4
    # The second epoch shuffles differently.
    loader = a.train_loader
    loader.set_epoch(0)
    first = torch.cat([y for _, y in loader])
    loader.set_epoch(1)
    second = torch.cat([y for _, y in loader])
    assert not torch.equal(first, second)


def _normalised(loader, images_uint8):
    return (images_uint8.float() / 255 - loader.augment.mean) / loader.augment.std  # mean, std: (1, 3, 1, 1)


def test_gpu_crop_and_flip_change_the_images_and_none_leaves_them():
    for aug, changed in (({"crop": "none", "hflip": False, "auto_augment": None}, False), ({}, True)):
        loader = build_data(resident_cfg(**aug), seed=2).train_loader
        loader.set_epoch(0)
        idx = loader._order()[:16]  # the first batch of epoch 0
        x, y = next(iter(loader))
        assert torch.equal(y, loader.targets[idx])
        same = ((x - _normalised(loader, loader.images[idx])).abs() < 1e-5).flatten(1).all(1)  # (B,) per sample
        assert (same.float().mean() < 0.5) if changed else bool(same.all())


def test_torch_and_gpu_val_batches_agree(tmp_path):
    cfg = folder_cfg(make_tree(tmp_path / "tree", per_class=4), cache_dir=str(tmp_path / "cache"))
    torch_val = torch.cat([x for x, _ in build_data({**cfg, "loader": "torch"}).val_loader])
    gpu_val = torch.cat([x for x, _ in build_data({**cfg, "loader": "resident"}).val_loader])
    torch.testing.assert_close(torch_val, gpu_val)


def test_gpu_ranks_take_disjoint_shards():
    shards = [build_data(resident_cfg(), seed=4, rank=r, world_size=2).train_loader for r in (0, 1)]
    assert [len(s) for s in shards] == [2, 2]
    for shard in shards:
        shard.set_epoch(3)
    first, second = (set(s._order().tolist()) for s in shards)
    assert not first & second and len(first | second) == 64


def test_batched_resized_crop_and_erasing():
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8)
    out = random_resized_crop(x, (0.2, 0.5), generator)
    assert out.shape == x.shape and out.dtype == torch.uint8 and not torch.equal(out, x)
    assert torch.equal(random_resized_crop(x, (1.0, 1.0), generator, ratio=(1.0, 1.0)), x)  # the whole image
    z = torch.zeros(8, 3, 16, 16)
    erased = random_erasing(z, 1.0, generator)
    assert ((erased != 0).flatten(1).sum(1) > 0).all()  # every sample got a box
    assert torch.equal(random_erasing(z, 0.0, generator), z)


def test_gpu_policy_runs_on_uint8_batches():
    bundle = build_data(resident_cfg(auto_augment="autoaug"))
    x, _ = next(iter(bundle.train_loader))
    assert x.shape == (16, 3, 16, 16) and torch.isfinite(x).all()


def test_random_pad_crop_is_a_shifted_window():
    x = torch.arange(2 * 1 * 6 * 6, dtype=torch.uint8).view(2, 1, 6, 6)
    generator = torch.Generator().manual_seed(0)
    out = random_pad_crop(x, 2, generator)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for b in range(2):  # each output is some 6x6 window of its own padded image
        windows = padded[b, 0].unfold(0, 6, 1).unfold(1, 6, 1).reshape(-1, 6, 6)
        assert any(torch.equal(out[b, 0], w) for w in windows)


def test_gpu_decode_cache_is_reused(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "tree", per_class=4)
    cfg = folder_cfg(root, loader="resident", cache_dir=str(tmp_path / "cache"))
    build_data(cfg)
    cached = sorted((tmp_path / "cache").glob("*.npy"))
    assert len(cached) == 4  # images + targets, train + val
    stamps = [p.stat().st_mtime_ns for p in cached]

    def fail(*args):
        raise AssertionError("decoded again")

    monkeypatch.setattr(decoded_cache, "decode_split", fail)
    bundle = build_data(cfg)
    assert [p.stat().st_mtime_ns for p in cached] == stamps
    assert bundle.loader_kind == "resident" and bundle.num_train == 12
    # Another subset of the same folder is a different split: decoded, not confused with the cached one.
    monkeypatch.undo()
    build_data({**cfg, "limit_train_samples": 6})
    assert len(list((tmp_path / "cache").glob("train-*.images.npy"))) == 2


# Repeated augmentation ------------------------------------------------------------------------------------------


def test_repeat_order_repeats_a_slice_of_the_permutation_in_place():
    from vit.data.loading.sampling import repeat_order

    order = torch.tensor([5, 2, 7, 0, 1, 3, 6, 4])
    assert repeat_order(order, 1) is order
    # The first ceil(8 / 3) images of the permutation, three times each, cut to the epoch's 8 samples.
    assert repeat_order(order, 3).tolist() == [5, 5, 5, 2, 2, 2, 7, 7]


@pytest.mark.parametrize("loader", ["torch", "resident"])
def test_repeated_aug_shows_each_image_k_times_and_shards_the_copies(loader):
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 8, "num_workers": 0, "loader": loader}
    cfg.update(synthetic={"num_train": 64, "num_val": 16}, repeated_aug=4, augment={"crop": "pad", "hflip": True})

    def epoch_indices(rank, world):
        bundle = build_data(cfg, seed=3, rank=rank, world_size=world)
        if loader == "resident":
            bundle.train_loader.set_epoch(2)
            return bundle.train_loader._order().tolist()
        bundle.train_sampler.set_epoch(2)
        return list(bundle.train_sampler)

    single = epoch_indices(0, 1)
    assert len(single) == 64 and len(set(single)) == 16  # the epoch's length, a quarter of the images
    assert all(single[i] == single[i + 1] == single[i + 2] == single[i + 3] for i in range(0, 64, 4))
    # Two ranks: every other index of the same order, so each image's copies are split between them.
    assert epoch_indices(0, 2) == single[0::2] and epoch_indices(1, 2) == single[1::2]
    bundle = build_data({**cfg, "repeated_aug": 1}, seed=3)
    if loader == "torch":
        bundle.train_sampler.set_epoch(2)
        assert len(set(bundle.train_sampler)) == 64  # off: every image once


def test_repeated_copies_are_augmented_differently():
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 16, "num_workers": 0, "loader": "resident"}
    cfg.update(synthetic={"num_train": 64, "num_val": 16}, repeated_aug=2, augment={"crop": "pad", "pad": 4})
    loader = build_data(cfg, seed=0).train_loader
    loader.set_epoch(0)
    x, y = next(iter(loader))
    assert torch.equal(y[0::2], y[1::2])  # consecutive copies of the same images
    differs = (x[0::2] != x[1::2]).flatten(1).any(1)  # (8,) a copy pair with different pixels
    assert differs.float().mean() >= 0.75  # two random 9x9 crop offsets rarely coincide (1 in 81 per pair)


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs" / "data").glob("*.yaml")))
def test_a_hand_built_config_means_what_its_file_declares(name):
    """`complete` fills a hand-built data config from its dataset's settings class (vit/settings/data.py), as Hydra
    composes data=<name>: a key a hand-built config leaves out then means what data=<name> gives it (here: every
    key)."""
    from omegaconf import OmegaConf

    from vit.data.sources.registry import complete

    composed = OmegaConf.to_container(compose_config([f"data={name}"]).data, resolve=True)
    assert OmegaConf.to_container(complete({"name": name})) == composed
    assert complete({"name": name, "batch_size": 3}).batch_size == 3  # what the config gives wins


def test_the_data_layer_reads_its_group_once_typed_and_names_a_key_its_dataset_lacks():
    """`data_of`, the data layer's one reading of its group: the named dataset's settings class, a hand-built
    config's missing keys as declared, typed values (a list as a tuple, a sub-group as its class); a key the dataset
    does not have, or a value of the wrong kind, is one DataError naming it."""
    from vit.data.sources.registry import data_of
    from vit.settings.data import ImageFolderSettings, SyntheticSettings

    settings = data_of({"name": "synthetic", "mean": [0.1, 0.2, 0.3], "synthetic": {"num_train": 8}})
    assert isinstance(settings, SyntheticSettings) and settings.mean == (0.1, 0.2, 0.3)
    assert (settings.synthetic.num_train, settings.synthetic.num_val) == (8, SyntheticSettings().synthetic.num_val)
    assert data_of(settings) is settings
    assert isinstance(data_of(compose_config(["data=imagefolder"]).data), ImageFolderSettings)
    with pytest.raises(DataError, match=r"data.unlabelled is not a key of data=synthetic"):
        data_of({"name": "synthetic", "unlabelled": True})
    with pytest.raises(DataError, match=r"data.img_size='big' must be an integer"):
        data_of({"name": "synthetic", "img_size": "big"})


def test_an_archive_given_to_the_cifar_config_points_to_imagefolder(tmp_path):
    archive = tmp_path / "cifar10-jpeg.tar.gz"
    archive.write_bytes(b"x")
    with pytest.raises(DataError, match=r"is an archive: data=cifar10 reads torchvision's cifar-10-batches-py folder"):
        build_data(compose_config(["data=cifar10", f"data.root={archive}"]).data)
