"""The augmentation both loaders apply (vit/data/augment/batch.py, vit/data/augment/rand_augment.py): every policy
at every magnitude on both code paths, timm's RandAugment op by op against timm's own Pillow ops and its sampling, the
two loaders giving the same batches, the defaults declared once, the loader choice, and bad policy strings."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from timm.data import auto_augment as timm_aa
from trainer_utils import REPO, assert_measurement_record, compose_config, load_script, run_cli

from vit.cli.args import run_script
from vit.data import DataError, build_data, resources
from vit.data.augment import rand_augment as ra
from vit.data.augment import rand_augment_ops as rops
from vit.data.augment.batch import BatchAugment, random_hflip
from vit.data.augment.policies import build_policy
from vit.data.augment.spec import augment_settings
from vit.errors import ConfigError
from vit.settings.data import AugmentSettings, DataSettings
from vit.train.config import validate

FILL = (124, 116, 104)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def smooth_images(n: int, height: int = 24, width: int = 28, seed: int = 0) -> torch.Tensor:
    """uint8 (n, 3, H, W): blurry shapes plus noise, so geometric ops move visible structure."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.rand(n, 3, height // 4, width // 4, generator=generator) * 255
    x = torch.nn.functional.interpolate(base, (height, width), mode="bilinear", align_corners=False)
    x = x + torch.randn(x.shape, generator=generator) * 20
    return x.clamp(0, 255).round().to(torch.uint8)


# ---- every policy, every magnitude, both code paths ----

RAND_STRINGS = [
    f"rand-m{m}-mstd{std}-inc{inc}" for m in range(0, 11) for std in (0, 0.5, 100, 101) for inc in (0, 1)
] + ["rand-m15-mmax20-mstd1", "rand-m30-mmax30-inc1", "rand-m10-n4-p1.0-mstd101", "rand-m9-mstd0.5-inc1-tweights-n3"]
POLICIES = ["autoaug", "trivial", *RAND_STRINGS, *[f"augmix-m{m}-w2" for m in (1, 5, 10)], "augmix-m3-w3-d3-a0.5"]


@pytest.mark.parametrize("path", ["pillow", "tensor-subsets", "tensor-whole-batch"])
def test_every_policy_and_magnitude_runs_on_every_code_path(path):
    """timm's RandAugment through Pillow (the CPU's path) and the tensor kernels on gathered samples or on the whole
    batch (the CUDA path), the other policies on both of theirs, at every magnitude bin, the extremes, the largest
    noise (mstd > 100 is uniform; mstd 100 clips to 0 and 10 half the time) and 0-bit posterize: no exception,
    uint8 in, uint8 out, shape kept."""
    x = smooth_images(24)
    for text in POLICIES:
        policy = build_policy(text, 24, (0.5, 0.45, 0.4))
        if hasattr(policy, "subsets"):
            policy.subsets = path == "tensor-subsets"
        if hasattr(policy, "pillow"):
            policy.pillow = path == "pillow"
        out = policy(x, torch.Generator().manual_seed(1))
        assert out.shape == x.shape and out.dtype == torch.uint8, text


def test_pillow_and_tensor_paths_agree():
    """The same draws through Pillow and through the tensor kernels: one op per image (n1, p1.0), every op
    drawn many times, equal to the pixel except the geometric ops' bilinear rounding (within 1)."""
    x = smooth_images(120)
    policy = build_policy("rand-m8-n1-p1.0-mstd3", 24, (0.5, 0.45, 0.4))
    outputs = {}
    for pillow in (True, False):
        policy.pillow = pillow
        outputs[pillow] = policy(x, torch.Generator().manual_seed(3)).int()
    (op, _), *_ = policy.draw(120, torch.device("cpu"), torch.Generator().manual_seed(3))
    assert set(op.tolist()) == set(range(len(rops.OPS)))
    diff = (outputs[True] - outputs[False]).abs().amax(dim=(1, 2, 3))  # (B,)
    geometric = rops._is(op, rops.GEOMETRIC)
    assert diff[~geometric].max() == 0 and diff[geometric].max() <= 1


@pytest.mark.parametrize("loader", ["torch", "resident"])
def test_the_strongest_settings_train_batches_on_both_loaders(loader):
    """What crashed the torch loader with Pillow 13 (timm's PosterizeIncreasing at magnitude 10: 0 bits)."""
    for text in ("rand-m10-mstd101-inc1", "rand-m10-n4-p1.0-inc1", "rand-m0-mstd100", "augmix-m10-w3-d3"):
        cfg = synthetic_cfg(loader, crop="rrc", auto_augment=text, re_prob=0.5)
        for x, _ in build_data(cfg).train_loader:
            assert x.dtype == torch.float32 and torch.isfinite(x).all()
            assert x.abs().max() < 10  # normalised uint8 images, not garbage


# ---- timm's RandAugment: the ops against timm's Pillow ops ----


def timm_reference(name: str, level: float, negate: bool, increasing: bool, image: Image.Image) -> Image.Image:
    """timm's own op (bilinear, as its training transforms ask) at `level`, with the sign forced."""
    if increasing and name in ("Posterize", "Solarize", *ra.ENHANCE):
        name += "Increasing"
    op = timm_aa.AugmentOp(name, prob=1.0, magnitude=level, hparams={"img_mean": FILL, "interpolation": 2})
    original = timm_aa._randomly_negate
    timm_aa._randomly_negate = (lambda v: -v) if negate else (lambda v: v)
    try:
        return op(image)
    finally:
        timm_aa._randomly_negate = original


def ours(name: str, level: float, negate: bool, increasing: bool, x: torch.Tensor) -> torch.Tensor:
    op = torch.tensor([rops.OP_INDEX[name]])
    argument = ra.op_argument(op, torch.tensor([float(level)], dtype=torch.float64), torch.tensor([negate]), increasing)
    if name in rops.GEOMETRIC:
        return rops.warp_bilinear(x, rops.pillow_inverse_affine(op, argument, *x.shape[-2:]), FILL)
    if name in rops.BLENDS:
        return rops.apply_blends(x, op, argument, {name})
    return rops.apply_tables(x, op, rops.static_tables(op, argument), {name})


@pytest.mark.parametrize("increasing", [False, True], ids=["plain", "inc1"])
@pytest.mark.parametrize("name", rops.OPS)
def test_each_op_matches_timms_pillow_op(name, increasing):
    """Tables and blends equal Pillow's exactly; the geometric ops are within 1 (bilinear rounding)."""
    tolerance = 1 if name in rops.GEOMETRIC else 0
    compared = 0
    for i, level in enumerate((0, 1.3, 5, 7.5, 9, 9.7, 10)):
        for negate in (False, True):
            x = smooth_images(1, seed=i)
            image = Image.fromarray(x[0].permute(1, 2, 0).numpy())
            try:
                expected = timm_reference(name, level, negate, increasing, image)
            except ValueError:  # Pillow 13 refuses 0 bits: timm's own op cannot run here
                assert name == "Posterize"
                assert ours(name, level, negate, increasing, x).max() == 0  # 0 bits kept: black, as Pillow < 13
                continue
            expected = torch.from_numpy(np.array(expected)).permute(2, 0, 1)
            diff = (ours(name, level, negate, increasing, x)[0].int() - expected.int()).abs()
            assert diff.max() <= tolerance, (name, level, negate)
            compared += 1
    assert compared >= 10


def test_posterize_at_full_increasing_magnitude_keeps_no_bits():
    op = torch.tensor([rops.OP_INDEX["Posterize"]])
    argument = ra.op_argument(op, torch.tensor([10.0], dtype=torch.float64), torch.tensor([False]), True)
    assert argument.item() == 0
    assert ours("Posterize", 10, False, True, smooth_images(1)).max() == 0


# ---- timm's RandAugment: the sampling against timm's ----


def test_op_and_level_draws_follow_timms_policy():
    """Over many draws: each op 1/15 of the slots, applied with probability p, level ~ N(m, mstd) clipped to
    [0, 10]; timm's RandAugment object (its op list and settings) is what the expectations come from."""
    reference = timm_aa.rand_augment_transform("rand-m9-mstd0.5-inc1-p0.7", {"img_mean": FILL})
    assert [op.name.replace("Increasing", "") for op in reference.ops] == list(rops.OPS)
    expected_p, magnitude, std = reference.ops[0].prob, reference.ops[0].magnitude, reference.ops[0].magnitude_std
    policy = build_policy("rand-m9-mstd0.5-inc1-p0.7", 32, (0.5,) * 3)
    slots = policy.draw(60_000, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert len(slots) == reference.num_layers
    op, argument = slots[0]
    applied = op >= 0
    assert abs(applied.float().mean().item() - expected_p) < 0.01
    counts = torch.bincount(op[applied], minlength=len(rops.OPS)).float() / applied.sum()
    assert (counts - 1 / len(rops.OPS)).abs().max() < 0.01
    # Rotate's argument is level / 10 * 30 with a random sign: |argument| / 3 is the level.
    level = argument[op == rops.OP_INDEX["Rotate"]].abs() / 3
    samples = np.clip(np.random.default_rng(0).normal(magnitude, std, 100_000), 0, 10)
    assert abs(level.mean().item() - samples.mean()) < 0.02 and abs(level.std().item() - samples.std()) < 0.02
    assert 0.45 < (argument[op == rops.OP_INDEX["Rotate"]] < 0).float().mean().item() < 0.55


def test_weighted_choice_follows_timms_weights_without_repeats():
    reference = timm_aa.rand_augment_transform("rand-m9-n1-tweights", {"img_mean": FILL})
    weights = dict(
        zip([op.name.replace("Increasing", "") for op in reference.ops], reference.choice_weights, strict=True)
    )
    policy = build_policy("rand-m9-n1-p1.0-tweights", 32, (0.5,) * 3)
    (op, _), *_ = policy.draw(60_000, torch.device("cpu"), torch.Generator().manual_seed(0))
    counts = torch.bincount(op, minlength=len(rops.OPS)).double() / len(op)
    for name, weight in weights.items():
        assert abs(counts[rops.OP_INDEX[name]].item() - weight) < 0.01, name
    two = build_policy("rand-m9-n2-p1.0-tweights", 32, (0.5,) * 3).draw(5000, torch.device("cpu"), None)
    assert (two[0][0] != two[1][0]).all()  # no op twice in one image


def test_draws_come_from_the_generator_alone():
    policy = build_policy("rand-m9-mstd0.5-inc1", 24, (0.5,) * 3)
    x = smooth_images(16)
    state = torch.random.get_rng_state()
    a = policy(x, torch.Generator().manual_seed(5))
    b = policy(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and not torch.equal(a, policy(x, torch.Generator().manual_seed(6)))
    assert torch.equal(torch.random.get_rng_state(), state)


# ---- one augmentation, whichever loader ----


def synthetic_cfg(loader: str, **augment) -> dict:
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 8, "num_workers": 0, "loader": loader}
    cfg["synthetic"] = {"num_train": 32, "num_val": 8}
    cfg["augment"] = augment
    return cfg


@pytest.mark.parametrize(
    "augment",
    [
        {"crop": "pad", "hflip": True, "auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.5},
        {"crop": "pad", "pad": 2, "auto_augment": "autoaug"},
        {"crop": "none", "auto_augment": "trivial", "re_prob": 0.25},
        {"crop": "pad", "auto_augment": "augmix-m3-w2-d1"},
        {"crop": "pad", "hflip": True, "hflip_alternate": True, "auto_augment": None},
    ],
    ids=["rand", "autoaug", "trivial", "augmix", "alternating-flip"],
)
def test_both_loaders_yield_the_same_batches(augment):
    """Same seed and config: the torch DataLoader (decoding in workers) and the GPU-resident loader give equal
    training batches, epoch after epoch, and equal validation batches."""
    torch_bundle = build_data(synthetic_cfg("torch", **augment), seed=7)
    resident_bundle = build_data(synthetic_cfg("resident", **augment), seed=7)
    assert (torch_bundle.loader_kind, resident_bundle.loader_kind) == ("torch", "resident")
    for epoch in (0, 1):
        for bundle in (torch_bundle, resident_bundle):
            bundle.train_loader.set_epoch(epoch)
            if bundle.train_sampler is not None:
                bundle.train_sampler.set_epoch(epoch)
        pairs = list(zip(torch_bundle.train_loader, resident_bundle.train_loader, strict=True))
        assert len(pairs) == 4
        for (xa, ya), (xb, yb) in pairs:
            assert torch.equal(ya, yb) and torch.equal(xa, xb)
    for (xa, ya), (xb, yb) in zip(torch_bundle.val_loader, resident_bundle.val_loader, strict=True):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_both_loaders_evaluate_with_the_crop_fraction_and_filter_given(tmp_path):
    """data.crop_pct and data.interpolation reach evaluation on both loaders alike: the resident loader decodes the
    split (here already at its size) as the torch loader's workers do, and the images differ from the default's."""
    batches = {}
    for loader in ("torch", "resident"):
        for crop in ({}, {"crop_pct": 0.8, "interpolation": "bicubic"}):
            cfg = {**synthetic_cfg(loader, crop="none"), "cache_dir": str(tmp_path), **crop}
            batches[loader, bool(crop)] = torch.cat([x for x, _ in build_data(cfg, seed=7).val_loader])
    assert torch.equal(batches["torch", True], batches["resident", True])
    assert torch.equal(batches["torch", False], batches["resident", False])
    assert not torch.equal(batches["torch", True], batches["torch", False])


@pytest.mark.parametrize(
    "size, crop_pct, interpolation", [(64, 0.9, "bicubic"), (160, None, "bilinear"), (40, 1.0, "bicubic")]
)
def test_evaluation_geometry_is_timms_evaluation_transform(size, crop_pct, interpolation):
    """val_transform with data.crop_pct and data.interpolation is timm's evaluation transform (create_transform,
    is_training=False) of the same settings, on a non-square image: resize to floor(size / crop_pct), the filter,
    the centre crop, the normalisation (crop_pct null: timm's default 0.875 from 128 px up)."""
    from timm.data import create_transform

    from vit.data.augment.transforms import val_transform

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (11, 8, 3), dtype=np.uint8)).resize((97, 131), Image.BICUBIC)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    data = DataSettings(img_size=size, crop_pct=crop_pct, interpolation=interpolation, mean=mean, std=std)
    timms = create_transform(size, crop_pct=crop_pct or 0.875, interpolation=interpolation, mean=mean, std=std)
    torch.testing.assert_close(val_transform(data)(image), timms(image), atol=1e-6, rtol=0)


def test_torch_loader_resumes_mid_epoch_exactly_with_workers():
    """Every batch draws from its own generator, so skipping batches (a resume) leaves the rest as they were,
    also with worker processes (the crop here happens on the batch, not in the workers)."""
    cfg = synthetic_cfg("torch", crop="pad", auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.5)
    cfg["num_workers"] = 2
    loader = build_data(cfg, seed=3).train_loader
    loader.set_epoch(2)
    straight = [x for x, _ in loader][2:]
    loader.set_epoch(2)
    loader.skip_batches(2)
    resumed = [x for x, _ in loader]
    assert len(resumed) == len(straight) == 2
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed, strict=True))


# ---- declared once ----


def test_the_augment_defaults_are_declared_once_in_their_settings_class():
    """AugmentSettings (vit/settings/data.py) declares every data.augment key and its default; data=cifar10 composes
    exactly those, every data config starts from its dataset's declaration, and a hand-built node's missing keys
    take the declared defaults."""
    declared = AugmentSettings.defaults()
    assert OmegaConf.to_container(compose_config(["data=cifar10"]).data.augment) == declared
    for path in (REPO / "configs" / "data").glob("*.yaml"):
        assert f"- schema/{path.stem}@_here_" in path.read_text(), path.name
    spec = augment_settings({"re_prob": 0.25})
    assert spec.re_prob == 0.25 and spec.crop == declared["crop"] and spec.pad == declared["pad"]
    cifar100 = compose_config(["data=cifar100"]).data
    assert cifar100.name == "cifar100" and cifar100.num_classes == 100
    assert OmegaConf.to_container(cifar100.augment) == declared
    imagefolder = compose_config(["data=imagefolder"]).data.augment  # the 224 px datasets' own
    assert (imagefolder.crop, imagefolder.auto_augment) == ("rrc", "rand-m9-mstd0.5-inc1")


def test_an_unknown_augment_key_is_named():
    with pytest.raises(DataError, match=r"^data.augment.policy_chunk is not a known key \(known: crop, pad"):
        augment_settings({"policy_chunk": 16})


# ---- bad policy strings: one line, exit 2 ----


@pytest.mark.parametrize(
    "text, message",
    [
        ("strong", "data.augment.auto_augment='strong' must be null, autoaug, trivial, rand-<sections>"),
        ("rand-m11", "data.augment.auto_augment='rand-m11': m11 must be in [0, mmax=10] (raise the bound with mmax)"),
        ("rand-m9-x3", "data.augment.auto_augment='rand-m9-x3': section 'x3' is not one of m<int>, n<int>, p<float>"),
        ("rand-m9.5", "data.augment.auto_augment='rand-m9.5': section 'm9.5' is not one of m<int>"),
        ("rand-m9-p1.5", "data.augment.auto_augment='rand-m9-p1.5': p1.5 must be in [0, 1]"),
        ("rand-m9-n0", "data.augment.auto_augment='rand-m9-n0': n0 must be between 1 and 15 ops"),
        ("rand-m9-t3a", "data.augment.auto_augment='rand-m9-t3a': t3a must be tweights"),
        ("augmix-m0", "data.augment.auto_augment='augmix-m0': needs m (severity) in [1, 10]"),
        ("augmix-m3-b1", "data.augment.auto_augment='augmix-m3-b1': section 'b1' is not one of m<int>, w<int>"),
    ],
)
def test_a_bad_policy_is_one_config_error_line(text, message):
    with pytest.raises(ConfigError) as err:
        validate(compose_config(["data=synthetic", f"data.augment.auto_augment={text}"]))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_bad_policy_exits_2_before_any_data_is_read(tmp_path):
    result = run_cli(["data=synthetic", "trainer=debug", "data.augment.auto_augment=rand-m12-inc1"], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["config error: data.augment.auto_augment='rand-m12-inc1': m12 must be in [0, mmax=10] (raise "
                     "the bound with mmax)"]  # fmt: skip
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("*.pt"))


# ---- the loader choice and the worker count ----


def test_loader_choice_is_logged_and_said_why(caplog, monkeypatch):
    """On a CPU, auto holds the decoded splits in memory when they take under a quarter of the free memory."""
    import vit.data.loading.build as loader_module

    caplog.set_level("INFO", logger="vit.data.loading.build")
    monkeypatch.setattr(loader_module, "available_memory", lambda: 2**30)
    bundle = build_data(synthetic_cfg("auto", crop="none"))
    images = bundle.num_train + bundle.num_val
    needed = images * 3 * bundle.img_size**2 / 2**30
    reason = (
        f"data.loader=auto: the device is cpu; {images} images at {bundle.img_size} px take {needed:.2f} GiB, under a "
        "quarter of the 1.0 GiB free in this machine's memory"
    )
    assert (bundle.loader_kind, bundle.loader_reason) == ("resident", reason)
    assert f"loader: resident ({reason})" in caplog.text
    monkeypatch.setattr(loader_module, "available_memory", lambda: 4 * images * 3 * bundle.img_size**2 - 1)
    bundle = build_data(synthetic_cfg("auto", crop="none"))
    assert bundle.loader_kind == "torch" and "over a quarter" in bundle.loader_reason
    assert build_data(synthetic_cfg("resident", crop="none")).loader_reason == "data.loader=resident"


def test_the_former_loader_name_gpu_still_runs_the_resident_loader_with_one_notice(caplog):
    caplog.set_level("INFO", logger="vit.data.loading.build")
    bundle = build_data(synthetic_cfg("gpu", crop="none"))
    assert (bundle.loader_kind, bundle.loader_reason) == ("resident", "data.loader=resident")
    notices = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert notices == ["data.loader=gpu is now data.loader=resident (the same loader); gpu still works"]
    with pytest.raises(DataError, match=r"data.loader='gpus' must be one of \('auto', 'torch', 'resident'\)"):
        build_data(synthetic_cfg("gpus", crop="none"))


def test_more_workers_than_cpus_are_lowered_once(monkeypatch, caplog):
    monkeypatch.setattr(resources, "available_cpus", lambda: 2)
    monkeypatch.setattr(resources, "_SAID", set())  # as in a fresh process
    caplog.set_level("INFO", logger="vit.data")
    # the train loader, the validation loader and the image scan each ask; the line is said once
    assert [resources.num_workers(DataSettings(num_workers=12)) for _ in range(3)] == [2, 2, 2]
    assert caplog.text.count("data.num_workers=12 but this process has 2 CPUs: using 2 workers") == 1
    assert resources.num_workers(DataSettings(num_workers=1)) == 1
    assert resources.num_workers(DataSettings(num_workers=None)) == 2


# ---- a real image-folder run with its default augmentation ----


def image_folder_root(tmp_path: Path) -> str:
    """A small generated tree of JPEGs of ImageNet-like shapes (50-89 x 40-69 px: the random-resized crop has
    something to crop; the CIFAR-10 archive's 60,000 images would first be scanned, for 200 of them)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 40), ("val", 10)):
        for c in range(4):
            folder = tmp_path / "tree" / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 255, (3, 4, 3), dtype=np.uint8)
                image = Image.fromarray(pixels).resize((50 + 7 * i % 40, 40 + 5 * i % 30), Image.BILINEAR)
                image.save(folder / f"{i}.jpg", quality=90)
    return str(tmp_path / "tree")


def test_image_folder_trains_with_its_default_augmentation(tmp_path):
    """data=imagefolder's own augmentation (random-resized crop, flip, rand-m9-mstd0.5-inc1 at 224 px) through
    train.py on JPEG files: finishes, and the run says which policy and loader it used."""
    args = [
        "data=imagefolder",
        f"data.root={image_folder_root(tmp_path)}",
        "data.batch_size=40",
        "data.num_workers=0",
        "model.depth=1",
        "model.embed_dim=48",
        "model.num_heads=3",
        "trainer=debug",
        "trainer.epochs=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    result = run_cli(args, tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    # data.loader=auto on a CPU: decoded once into memory (the splits are small), said with the reason.
    assert metrics["loader"] == "resident" and "the device is cpu" in metrics["loader_reason"]
    assert math.isfinite(metrics["final"]["val_loss"])
    config = OmegaConf.load(tmp_path / "run" / ".hydra" / "config.yaml")
    assert config.data.augment.auto_augment == "rand-m9-mstd0.5-inc1" and config.data.img_size == 224


def test_batch_augment_only_normalises_for_evaluation():
    spec = augment_settings({"auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.5})
    augment = BatchAugment(spec, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), 16, train=False)
    x = smooth_images(4, 16, 16)
    torch.testing.assert_close(augment(x), (x.float() / 255 - 0.5) / 0.25)


def test_cpu_loader_benchmark_prints_its_table(capsys, tmp_path):
    module = load_script("bench_cpu_loader")
    assert module.main(["images=6", "repeats=1", "batch=3", f"json={tmp_path / 'loader.json'}"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "6 JPEGs x 1 repeats, batches of 3, 1 thread, policy rand-m9-mstd0.5-inc1"
    rows = [line.split(" | ") for line in lines[-2:]]
    assert [row[0] for row in rows] == ["| full pipeline on the CPU", "| loader workers only (GPU training)"]
    assert all(float(row[1]) > 0 and float(row[2]) > 0 for row in rows)
    # The record: every batch's seconds on both sides, the printed img/s their sums' rates.
    record = json.loads((tmp_path / "loader.json").read_text())
    assert_measurement_record(record, "bench_cpu_loader", "images=6 repeats=1 batch=3")
    for row, printed in zip(record["rows"], rows, strict=True):
        assert [b["images"] for b in row["batches"]] == [3, 3]
        assert f"{6 / sum(b['ours_s'] for b in row['batches']):.1f}" == printed[1]
        assert f"{6 / sum(b['timm_s'] for b in row['batches']):.1f}" == printed[2]


def test_cpu_loader_benchmark_refuses_a_bad_value_in_one_line(capsys, tmp_path):
    """A bad key=value is one line on stderr naming the key, exit code 2 (vit/cli/args.py's run_script)."""
    module = load_script("bench_cpu_loader")
    for argv, message in [
        (["batch=0"], "usage error: batch='0' must be an integer >= 1"),
        (["images=many"], "usage error: images='many' must be an integer >= 1"),
        ([f"folder={tmp_path / 'missing'}"], "usage error: folder="),
        ([f"folder={tmp_path}"], "usage error: folder="),  # no JPEGs in it
        (["--images", "4"], "usage error: argument '--images' must look like key=value"),
    ]:
        assert run_script(module.main, argv, usage=module.__doc__) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(message), err


def mirrored_by_index(bundle, epoch: int, skip: int = 0) -> dict[int, bool]:
    """{image index: mirrored?} for the train batches of `epoch` (crop none, no policy: each output is one image of
    the split or its mirror, found by value)."""
    loader = bundle.train_loader
    plain, mirror = bundle.val_loader.augment(loader.images), bundle.val_loader.augment(loader.images.flip(3))
    loader.set_epoch(epoch)
    loader.skip_batches(skip)
    seen = {}
    for x, _ in loader:
        for row in x:
            same = [(i, False) for i in range(len(plain)) if torch.equal(row, plain[i])]
            same += [(i, True) for i in range(len(mirror)) if torch.equal(row, mirror[i])]
            assert len(same) == 1, "every training image is one image of the split, mirrored or not"
            seen[same[0][0]] = same[0][1]
    return seen


def test_alternating_flip_mirrors_each_image_in_every_other_epoch():
    """data.augment.hflip_alternate, as airbench's loader does it: a random half of the images mirrored in the first
    epoch, then every image's flip reversed each epoch; a resumed epoch's remaining batches flip as they would
    have (the torch loader's batches equal these: test_both_loaders_yield_the_same_batches)."""
    alternating = dict(crop="none", hflip=True, hflip_alternate=True, auto_augment=None)
    bundle = build_data(synthetic_cfg("resident", **alternating), seed=5)
    epochs = [mirrored_by_index(bundle, epoch) for epoch in range(3)]
    assert all(sorted(seen) == list(range(32)) for seen in epochs)
    assert 8 <= sum(epochs[0].values()) <= 24  # a fair draw of 32: outside this about once in 500 seeds
    assert all(epochs[1][i] != epochs[0][i] and epochs[2][i] == epochs[0][i] for i in range(32))
    resumed = mirrored_by_index(bundle, 1, skip=2)
    assert len(resumed) == 16 and all(epochs[1][i] == mirrored for i, mirrored in resumed.items())
    other_seed = build_data(synthetic_cfg("resident", **alternating), seed=6)
    assert mirrored_by_index(other_seed, 0) != epochs[0]


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"hflip": False, "hflip_alternate": True}, "data.augment.hflip_alternate=true needs data.augment.hflip=true"),
        ({"hflip_alternate": True, "repeated_aug": 3}, "data.augment.hflip_alternate=true with data.repeated_aug=3"),
    ],
)
def test_an_alternating_flip_with_nothing_to_alternate_is_refused(cfg, message):
    data = synthetic_cfg("resident", crop="none", auto_augment=None)
    data["augment"]["hflip"] = cfg.get("hflip", True)
    data["augment"]["hflip_alternate"] = True
    if "repeated_aug" in cfg:
        data["repeated_aug"] = cfg["repeated_aug"]
    with pytest.raises(DataError, match=message.replace(".", r"\.")):
        build_data(data)


def test_flip_mirrors_exactly_the_drawn_samples():
    """Every sample either mirrored or untouched, as its draw says, also when no sample of a batch flips (a batch
    of one: about half the seeds) or all do."""
    x = smooth_images(1, 8, 8)
    outcomes = set()
    for seed in range(12):
        for batch in (x, x.repeat(5, 1, 1, 1)):
            flip = torch.rand(len(batch), generator=torch.Generator().manual_seed(seed)) < 0.5
            out = random_hflip(batch, torch.Generator().manual_seed(seed))
            assert torch.equal(out, torch.where(flip.view(-1, 1, 1, 1), batch.flip(3), batch))
            outcomes.add((len(batch), int(flip.sum())))
    assert (1, 0) in outcomes and (1, 1) in outcomes
