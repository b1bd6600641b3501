"""The batched AutoAugment / TrivialAugmentWide (vit/data/augment/batched_policy.py) against torchvision:
every op image by image, exactly; the magnitude tables and sub-policies; the draw frequencies; seeding; and the
policies as the loaders build them."""

import json
import math

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF
from trainer_utils import assert_measurement_record, compose_config, load_script

from vit.cli.args import run_script
from vit.data import build_data
from vit.data.augment import batched_ops as bo
from vit.data.augment import batched_policy as bp
from vit.data.augment.policies import build_policy
from vit.data.loading.resident import ResidentLoader
from vit.errors import ConfigError
from vit.train.config import validate

NEAREST = v2.InterpolationMode.NEAREST


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: on a loaded 2-core machine each multi-threaded op (torchvision's per-image conv2d above all)
    can wait ~20 ms for its second thread, which would make this file several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference(name: str, image: torch.Tensor, m: float) -> torch.Tensor:
    """What torchvision's policies do for (op, magnitude) on one uint8 (3, H, W) image
    (`_AutoAugmentBase._apply_image_or_video_transform` with the default nearest interpolation and fill)."""
    if name == "ShearX":
        shear = [math.degrees(math.atan(m)), 0.0]
        return TF.affine(
            image, angle=0.0, translate=[0, 0], scale=1.0, shear=shear, interpolation=NEAREST, center=[0, 0]
        )
    if name == "ShearY":
        shear = [0.0, math.degrees(math.atan(m))]
        return TF.affine(
            image, angle=0.0, translate=[0, 0], scale=1.0, shear=shear, interpolation=NEAREST, center=[0, 0]
        )
    if name in ("TranslateX", "TranslateY"):
        shift = [int(m), 0] if name == "TranslateX" else [0, int(m)]
        return TF.affine(image, angle=0.0, translate=shift, scale=1.0, shear=[0.0, 0.0], interpolation=NEAREST)
    if name == "Rotate":
        return TF.rotate(image, angle=m, interpolation=NEAREST)
    calls = {
        "Brightness": lambda: TF.adjust_brightness(image, 1.0 + m),
        "Color": lambda: TF.adjust_saturation(image, 1.0 + m),
        "Contrast": lambda: TF.adjust_contrast(image, 1.0 + m),
        "Sharpness": lambda: TF.adjust_sharpness(image, 1.0 + m),
        "Posterize": lambda: TF.posterize(image, int(m)),
        "Solarize": lambda: TF.solarize(image, 255 * m),
        "AutoContrast": lambda: TF.autocontrast(image),
        "Equalize": lambda: TF.equalize(image),
        "Invert": lambda: TF.invert(image),
    }
    return calls[name]()


def sample_images(count: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """uint8 (count, 3, H, W) with the cases the ops branch on: noise, grey (r = g = b), low-contrast, a constant
    channel, a near-constant image (equalize's step 0), smooth gradients."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (count, 3, height, width), generator=g, dtype=torch.uint8)
    ramp = torch.linspace(0, 255, width).round().to(torch.uint8)
    for i in range(count):
        kind = i % 6
        if kind == 1:
            x[i] = x[i, :1]
        elif kind == 2:
            x[i] = 100 + x[i] % 17
        elif kind == 3:
            x[i, 2] = 77
        elif kind == 4:
            x[i] = 200
            x[i, :, 0, 0] = 13
        elif kind == 5:
            x[i] = ramp.expand(3, height, width)
    return x


def all_magnitudes(name: str, height: int, width: int) -> list[float]:
    """Every magnitude the three policies can give `name` on an (H, W) image, signed both ways where signed."""
    values = set()
    for space, bins in ((bp.STANDARD_SPACE, 10), (bp.STANDARD_SPACE, 11), (bp.WIDE_SPACE, 31)):
        table = space[name](bins, height, width) if name in space else None
        values |= {0.0} if table is None else {float(v) for v in table}
    signs = (1.0, -1.0) if name in bp.SIGNED else (1.0,)
    return sorted({v * s for v in values for s in signs})


def test_reference_is_what_torchvisions_policies_apply():
    """`reference` spells out torchvision's private per-op dispatcher with public functions: the same images."""
    policy = v2.AutoAugment()
    x = sample_images(6, 13, 17)
    for name in bo.OPS[1:]:
        for m in all_magnitudes(name, 13, 17)[::5]:
            for image in x:
                theirs = policy._apply_image_or_video_transform(
                    image, name, m, interpolation=NEAREST, fill=policy._fill
                )
                assert torch.equal(reference(name, image, m), theirs), (name, m)


@pytest.mark.parametrize("size", [(13, 17), (16, 16)])  # odd and non-square; square (rotate's rot90 fast paths)
@pytest.mark.parametrize("name", bo.OPS[1:])
def test_every_op_matches_torchvision_image_by_image(name, size):
    mags = all_magnitudes(name, *size)
    x = sample_images(max(12, len(mags)), *size, seed=len(name))
    m = torch.tensor([mags[i % len(mags)] for i in range(len(x))], dtype=torch.float64)
    expected = torch.stack([reference(name, image, float(v)) for image, v in zip(x, m, strict=True)])
    ops = torch.full((len(x),), bo.OP_INDEX[name])
    for subsets in (True, False):  # the CPU's gathered subsets and CUDA's whole-batch-and-where give the same
        out = bo.apply_ops(x, ops, m, subsets=subsets)
        bad = (out != expected).flatten(1).any(1).nonzero().flatten().tolist()
        assert not bad, f"{name}: samples {bad[:5]} (magnitudes {[float(m[i]) for i in bad[:5]]}) differ"
    assert torch.equal(bo.apply_ops(x, ops, m, kinds=(name,), subsets=False), expected)  # the op's kind alone


def test_mixed_ops_in_one_batch_match_torchvision():
    """One slot where every sample drew another op: the one grid_sample and the per-op subsets put each back."""
    x = sample_images(60, 12, 12, seed=3)
    names = [bo.OPS[i % len(bo.OPS)] for i in range(len(x))]
    mags = [all_magnitudes(n, 12, 12)[(7 * i) % len(all_magnitudes(n, 12, 12))] for i, n in enumerate(names)]
    ops = torch.tensor([bo.OP_INDEX[n] for n in names])
    m = torch.tensor(mags, dtype=torch.float64)
    expected = torch.stack(
        [img if n == "Identity" else reference(n, img, v) for img, n, v in zip(x, names, mags, strict=True)]
    )
    for subsets in (True, False):
        assert torch.equal(bo.apply_ops(x, ops, m, subsets=subsets), expected)


# ---- tables and draws ----


POLICIES = {  # ours and torchvision's
    "trivial": (bp.BatchedTrivialAugmentWide(), v2.TrivialAugmentWide()),
    "autoaug-cifar10": (bp.BatchedAutoAugment("cifar10"), v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)),
    "autoaug-imagenet": (bp.BatchedAutoAugment("imagenet"), v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET)),
}


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_op_sets_magnitude_bins_and_signs_are_torchvisions(kind):
    ours, theirs = POLICIES[kind]
    assert list(ours.space) == list(theirs._AUGMENTATION_SPACE)  # the same ops, in the same (drawing) order
    bins = getattr(theirs, "num_magnitude_bins", 10)  # AutoAugment: 10, fixed
    assert ours.num_bins == bins
    for name, (fn, signed) in theirs._AUGMENTATION_SPACE.items():
        assert (name in bp.SIGNED) == signed, name
        for height, width in ((32, 32), (24, 40)):
            expected = fn(bins, height, width)
            if expected is None:
                assert ours.space[name](bins, height, width) is None
            else:
                assert torch.equal(ours.magnitudes(height, width)[bo.OP_INDEX[name]], expected.float()), name


@pytest.mark.parametrize("policy", ["cifar10", "imagenet"])
def test_autoaugment_sub_policies_are_torchvisions(policy):
    theirs = v2.AutoAugment(getattr(v2.AutoAugmentPolicy, policy.upper()))._policies
    assert [tuple(sub) for sub in theirs] == list(bp.AUTOAUGMENT_POLICIES[policy])


def torchvision_slot(theirs, slot: int, size: int) -> tuple[torch.Tensor, dict[str, set[float]]]:
    """From torchvision's definition of the policy: how often each op is applied in `slot` ((len(OPS),), Identity
    for "not applied" in AutoAugment) and the magnitudes (unsigned) it can have there."""
    freq = torch.zeros(len(bo.OPS), dtype=torch.float64)
    allowed: dict[str, set[float]] = {}
    space = theirs._AUGMENTATION_SPACE
    if isinstance(theirs, v2.AutoAugment):
        for sub in theirs._policies:
            name, p, b = sub[slot]
            freq[bo.OP_INDEX[name]] += p / len(theirs._policies)
            freq[0] += (1 - p) / len(theirs._policies)
            values = space[name][0](10, size, size)
            allowed.setdefault(name, set()).add(0.0 if values is None else float(values[b]))
    else:
        bins = theirs.num_magnitude_bins
        for name, (fn, _) in space.items():
            freq[bo.OP_INDEX[name]] = 1 / len(space)
            values = fn(bins, size, size)
            if values is None:
                allowed[name] = {0.0}
            else:
                allowed[name] = {float(v) for v in values}
    return freq, allowed


def chi_square(counts: torch.Tensor, freq: torch.Tensor) -> tuple[float, int]:
    expected = freq * counts.sum()
    assert (counts[expected == 0] == 0).all(), "an op the policy never draws was drawn"
    used = expected > 0
    return float(((counts[used] - expected[used]) ** 2 / expected[used]).sum()), int(used.sum()) - 1


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_draws_follow_torchvisions_policy(kind):
    """Over 200k samples: op frequencies within a chi-square bound of torchvision's definition (one sub-policy
    probability off by 0.1, or a missing op, fails it), magnitudes exactly the bins torchvision's definition gives
    the op (AutoAugment: the bins its sub-policies use for that op in that slot), signs random for the signed ops."""
    (ours, theirs), n = POLICIES[kind], 200_000
    tables = ours.tables(32, 32, torch.device("cpu"))
    draws = ours.draw(n, 32, 32, torch.device("cpu"), torch.Generator().manual_seed(0))
    for slot, rows in enumerate(draws):
        ops, magnitude = tables["op"][rows], tables["magnitude"][rows]
        freq, allowed = torchvision_slot(theirs, slot, 32)
        stat, dof = chi_square(torch.bincount(ops, minlength=len(bo.OPS)).double(), freq)
        assert stat < dof + 6 * math.sqrt(2 * dof), (slot, stat, dof)  # about 6 sigma: a 1-in-10^8 false alarm
        for index, name in enumerate(bo.OPS):
            drawn = magnitude[ops == index]
            if len(drawn) == 0 or name == "Identity":
                continue
            assert set(drawn.abs().unique().tolist()) == allowed[name], name  # every allowed bin, nothing else
            negative = float((drawn < 0).double().mean())
            if name in bp.SIGNED and float(drawn.abs().max()) > 0:
                assert abs(negative - 0.5 * float((drawn != 0).double().mean())) < 0.03, name
            else:
                assert negative == 0, name


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_policies_match_torchvision_on_their_own_draws(kind):
    """A whole policy call (its per-bin matrices and tables, the slots in sequence) equals torchvision's ops
    applied image by image in the drawn order with the drawn magnitudes, on both code paths."""
    policy, _ = POLICIES[kind]
    x = sample_images(48, 16, 16, seed=7)
    tables = policy.tables(16, 16, torch.device("cpu"))
    expected = x.clone()
    for rows in policy.draw(len(x), 16, 16, torch.device("cpu"), torch.Generator().manual_seed(1)):
        for i, (op, m) in enumerate(zip(tables["op"][rows].tolist(), tables["magnitude"][rows].tolist(), strict=True)):
            if bo.OPS[op] != "Identity":
                expected[i] = reference(bo.OPS[op], expected[i], m)
    for subsets in (True, False):
        policy.subsets = subsets
        assert torch.equal(policy(x, torch.Generator().manual_seed(1)), expected)
    policy.subsets = None


def test_same_seed_same_batch_other_seed_other_batch():
    x = sample_images(32, 16, 16)
    for policy, _ in POLICIES.values():
        out = [policy(x, torch.Generator().manual_seed(s)) for s in (5, 5, 6)]
        assert torch.equal(out[0], out[1]) and not torch.equal(out[0], out[2])
        assert out[0].dtype == torch.uint8 and out[0].shape == x.shape


def test_global_rng_is_untouched():
    state = torch.random.get_rng_state()
    POLICIES["autoaug-cifar10"][0](sample_images(8, 16, 16), torch.Generator().manual_seed(0))
    assert torch.equal(torch.random.get_rng_state(), state)


# ---- the GPU loader ----


def resident_cfg(**aug):
    cfg = {"name": "synthetic", "img_size": 16, "batch_size": 16, "num_workers": 0, "loader": "resident"}
    cfg["synthetic"] = {"num_train": 64, "num_val": 16}
    cfg["augment"] = {"crop": "pad", "pad": 2, "hflip": True, "auto_augment": "autoaug", **aug}
    return cfg


def test_the_policy_strings_pick_the_batched_policies():
    assert isinstance(build_policy("autoaug", 32, (0.5,) * 3), bp.BatchedAutoAugment)
    assert build_policy("autoaug", 224, (0.5,) * 3).policy == "imagenet"
    assert isinstance(build_policy("trivial", 32, (0.5,) * 3), bp.BatchedTrivialAugmentWide)
    assert isinstance(build_data(resident_cfg()).train_loader.augment.policy, bp.BatchedAutoAugment)


@pytest.mark.parametrize("key", ["policy_impl", "policy_chunk"])
def test_the_removed_implementation_switches_are_unknown_keys(key):
    """One implementation per policy: there is no switch left that would give a config a second meaning."""
    with pytest.raises(ConfigError, match=rf"unknown key data.augment.{key}|data.augment.{key} is not a known key"):
        validate(compose_config(["data=synthetic", f"+data.augment.{key}=1"]))


@pytest.mark.parametrize("policy", ["trivial", "rand-m9-mstd0.5-inc1", "augmix-m2-w2-d1"])
def test_resident_loader_resumes_mid_epoch_exactly(policy):
    """The batches after a skip are the ones an uninterrupted pass yields, without replaying the skipped ones:
    every batch draws from its own generator; the global RNG is not used."""
    loader = build_data(resident_cfg(auto_augment=policy, re_prob=0.5), seed=3).train_loader
    assert isinstance(loader, ResidentLoader) and len(loader) == 4
    loader.set_epoch(1)
    batches = iter(loader)
    next(batches), next(batches)
    straight = [x for x, _ in batches]
    loader.set_epoch(1)
    loader.skip_batches(2)
    torch.manual_seed(12345)  # whatever the global RNG holds
    resumed = [x for x, _ in loader]
    assert len(resumed) == len(straight) == 2
    for a, b in zip(straight, resumed, strict=True):
        assert torch.equal(a, b)


def test_bench_script_prints_its_table(capsys, tmp_path):
    module = load_script("bench_augment")
    tiny = ["batch=16", "size=8", "repeats=1", "warmup=0", "count_batches=1"]
    assert module.main([*tiny, f"json={tmp_path / 'augment.json'}"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-11].startswith("| policy | implementation | ms / batch (median) | aten ops / batch |")
    rows = [line.split(" | ") for line in lines[-9:]]
    assert [(r[0][2:], r[1]) for r in rows[:4]] == [("none", "-"), *[("autoaug", i) for i, _, _ in module.IMPLS]]
    assert [r[1] for r in rows[-2:]] == ["ours", "ours (whole batch)"]  # timm's RandAugment: no torchvision row
    assert all(int(r[3]) > 0 for r in rows)  # op counts
    # The record: each row's every timed batch, the printed median theirs.
    record = json.loads((tmp_path / "augment.json").read_text())
    assert_measurement_record(record, "bench_augment", "batch=16 size=8 repeats=1")
    assert [(r["policy"], r["implementation"]) for r in record["rows"]] == [(r[0][2:], r[1]) for r in rows]
    for row, printed in zip(record["rows"], rows, strict=True):
        assert len(row["ms_repeats"]) == 1 and f"{row['ms_repeats'][0]:.1f}" == printed[2]


def test_bench_script_refuses_a_bad_value_in_one_line(capsys):
    """A bad key=value is one line on stderr naming the key, exit code 2 (vit/cli/args.py's run_script)."""
    module = load_script("bench_augment")
    for argv, message in [
        (["repeats=0"], "usage error: repeats='0' must be an integer >= 1"),
        (["warmup=-1"], "usage error: warmup='-1' must be an integer >= 0"),
        (["device=gpu"], "usage error: device='gpu' is not a torch device"),
        (["--repeats", "3"], "usage error: argument '--repeats' must look like key=value"),
    ]:
        assert run_script(module.main, argv, usage=module.__doc__) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(message), err
    assert run_script(module.main, ["--help"], usage=module.__doc__) == 0
    assert "usage: python lab/bench_augment.py [policies=" in capsys.readouterr().out
