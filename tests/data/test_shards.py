"""data=webdataset: shards written by vit-shards, read back over ranks and loader workers (every
sample once an epoch), resumed inside an epoch, trained on through train.py; bad shards stopped with one line."""

import collections
import importlib.util
import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image
from trainer_utils import (
    REPO,
    assert_measurement_record,
    assert_resumes_exactly,
    installed,
    load_script,
    run_cli,
)
from webdataset import TarWriter

from vit.data import DataError, build_data
from vit.data.loading.naflex_loader import grid_for
from vit.data.loading.stream import NaFlexShardStream, ShardStream

CLASSES = ("cat", "dog", "frog")
TINY = ["model=vit_tiny", "model.depth=1", "model.embed_dim=32", "model.num_heads=2"]
TINY += ["data.img_size=32", "data.patch_size=8", "trainer.device=cpu", "trainer.attn_maps_every_n_epochs=0"]


def load_make_shards():
    return load_script("shards")


def write_tree(root, per_class=(30, 10)):
    """root/train/<class>/ and root/val/<class>/: small noise images, a third of them PNG."""
    rng = np.random.default_rng(0)
    for split, count in zip(("train", "val"), per_class, strict=True):
        for name in CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                image = Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8))
                image.save(folder / f"img {i}.{'png' if i % 3 == 0 else 'jpg'}")
    return root


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """90 training images in 6 shards (16 per shard, the last 10) and 30 validation images in 2."""
    base = tmp_path_factory.mktemp("shards")
    tree = write_tree(base / "tree")
    assert load_make_shards().main([f"source={tree}", f"out={base / 'out'}", "samples_per_shard=16"]) == 0
    return base / "out"


def cfg_for(shards, **extra):
    cfg = {"name": "webdataset", "urls": str(shards / "train-{000000..000005}.tar"), "img_size": 16}
    cfg.update(batch_size=4, num_workers=2, shuffle_buffer=8, augment={"crop": "pad", "auto_augment": "autoaug"})
    cfg.update(extra)
    return cfg


class KeyStream(ShardStream):
    """The real stream with each image replaced by its sample key, to count which samples a loader gives."""

    def _decode(self, sample, seed):
        return torch.tensor([int(sample["__key__"])]), self._label(sample, sample["__url__"], sample["__key__"])


def keys_of(loader) -> list[int]:
    """Sample keys of one pass of a bundle's loader (DeviceBatches -> StreamLoader -> DataLoader)."""
    loader.loader.dataset.__class__ = KeyStream
    return [int(k) for images, _, _ in loader.loader.loader for k in images.flatten()]


def read_shard(path) -> dict[str, dict[str, bytes]]:
    samples = collections.defaultdict(dict)
    with tarfile.open(path) as tar:
        for member in tar:
            key, ext = member.name.split(".", 1)
            samples[key][ext] = tar.extractfile(member).read()
    return samples


def test_make_shards_writes_every_image_once_with_its_class(shards):
    info = json.loads((shards / "_info.json").read_text())
    assert json.loads((shards / "classes.json").read_text()) == {"cat": 0, "dog": 1, "frog": 2}
    assert info["splits"]["train"]["shard_lengths"] == [16, 16, 16, 16, 16, 10]
    assert info["splits"]["val"]["filenames"] == ["val-000000.tar", "val-000001.tar"]
    train = [read_shard(shards / name) for name in info["splits"]["train"]["filenames"]]
    order = [int(key) for shard in train for key in shard]
    assert sorted(order) == list(range(90)) and order != sorted(order)  # every image once, shuffled
    for shard in train:  # key k is image k of the sorted listing: 30 per class, classes in order
        for key, sample in shard.items():
            assert int(sample["cls"]) == int(key) // 30
            assert set(sample) in ({"cls", "jpg"}, {"cls", "png"})
    val = [int(key) for name in info["splits"]["val"]["filenames"] for key in read_shard(shards / name)]
    assert sorted(val) == list(range(30)) and val != sorted(val)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["samples_per_shard=0"], "samples_per_shard='0' must be an integer >= 1"),
        (["seed=-1"], "seed='-1' must be an integer >= 0"),
        (["--samples-per-shard", "16"], "argument '--samples-per-shard' must look like key=value"),
        (["shard_size=16"], "unknown argument 'shard_size'"),
        (["extra"], "argument 'extra' must look like key=value"),
    ],
)
def test_make_shards_says_a_bad_argument_in_one_line_with_exit_code_2(args, named, tmp_path, capsys):
    from vit.cli.args import run_script

    assert run_script(load_make_shards().main, [f"source={tmp_path}", f"out={tmp_path / 'out'}", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("usage error: ") and named in err[0], err
    assert not (tmp_path / "out").exists()


def test_two_ranks_with_two_workers_see_every_training_sample_once(shards):
    seen, batches = collections.Counter(), []
    for rank in range(2):
        bundle = build_data(cfg_for(shards), seed=3, rank=rank, world_size=2)
        keys = keys_of(bundle.train_loader)
        batches.append(len(bundle.train_loader))
        assert len(keys) == len(bundle.train_loader) * 4
        seen.update(keys)
    # 90 samples: 45 per rank, 11 full batches of 4 each; the 2 left over sit out this epoch.
    assert batches == [11, 11] and len(seen) == 88 and set(seen.values()) == {1}
    assert set(seen) <= set(range(90))


def test_validation_sees_every_sample_once_over_ranks(shards):
    keys = []
    for rank in range(2):
        bundle = build_data(cfg_for(shards, num_workers=2), seed=3, rank=rank, world_size=2)
        assert (bundle.num_val, bundle.val_name, bundle.loader_kind) == (30, "val", "webdataset")
        keys += keys_of(bundle.val_loader)
    assert sorted(keys) == list(range(30))


def test_an_epoch_is_reproducible_and_the_next_one_differs(shards):
    orders = []
    for epoch in (1, 1, 2):
        bundle = build_data(cfg_for(shards, num_workers=1), seed=7)
        bundle.train_loader.loader.dataset.set_epoch(epoch)
        orders.append(keys_of(bundle.train_loader))
    assert orders[0] == orders[1] and orders[0] != orders[2] and sorted(orders[0]) != orders[0]


@pytest.mark.parametrize("crop", ["rrc", "pad"])
def test_skip_batches_resumes_with_the_uninterrupted_epochs_batches(shards, crop):
    cfg = cfg_for(shards, augment={"crop": crop, "auto_augment": "autoaug"})
    full_bundle = build_data(cfg, seed=5)
    full_bundle.train_loader.set_epoch(2)
    full = list(full_bundle.train_loader)
    resumed = build_data(cfg, seed=5).train_loader
    resumed.set_epoch(2)
    resumed.skip_batches(3)
    assert len(resumed) == len(full) - 3 == 19
    rest = list(resumed)
    assert len(rest) == 19
    for (images, targets), (images2, targets2) in zip(full[3:], rest, strict=True):
        assert torch.equal(images, images2) and torch.equal(targets, targets2)


NAFLEX = dict(patch_size=4, naflex={"seq_lens": [4, 16], "max_seq_len": 16})


class KeyedNaFlex(NaFlexShardStream):
    """The real NaFlex stream (images decoded, cropped and resized to their batch's grid) with each sample's class
    replaced by its key, to count which samples its batches hold."""

    def _label(self, sample, url, key):
        return int(key)


def naflex_batches(shards, rank=0, world_size=1, skip=0, **extra):
    """One pass of a NaFlex shard bundle's training batches (packed dict, keys) at epoch 2, after `skip` of them."""
    bundle = build_data(cfg_for(shards, **NAFLEX, **extra), seed=5, rank=rank, world_size=world_size)
    loader = bundle.train_loader
    loader.loader.dataset.__class__ = KeyedNaFlex
    loader.set_epoch(2)
    loader.skip_batches(skip)
    assert len(loader) == len(loader.batches.schedule) - skip
    return list(loader), loader.batches.schedule


def test_naflex_batches_from_shards_follow_the_token_budget_and_see_every_sample_once(shards):
    """Two ranks of two workers: each rank's batches are its schedule's (seq_len, images) in the epoch's order, each
    image (20 x 24 px) on its own grid for that seq_len, every sample once over both ranks."""
    seen = collections.Counter()
    for rank in range(2):
        batches, schedule = naflex_batches(shards, rank, world_size=2)
        # 45 samples a rank, a budget of 4 x 16 tokens: 16 images at 4 tokens or 4 at 16, batches until one is short
        expected = [(seq_len, size) for seq_len, size, _, _ in schedule.of_epoch(2)]
        assert [(batch["patches"].shape[1], len(keys)) for batch, keys in batches] == expected
        assert {size for _, size in expected} == {16, 4} and sum(size for _, size in expected) <= 45
        for batch, _ in batches:
            rows, cols = (batch["patch_coord"].amax(dim=1) + 1).unbind(-1)  # each image's grid (rows, columns)
            grids = {(int(r), int(c)) for r, c in zip(rows, cols, strict=True)}
            height, width = grid_for((20, 24), 4, batch["patches"].shape[1])  # timm's rule for the image's grid
            assert grids == {(height // 4, width // 4)}
            assert torch.equal(batch["patch_valid"].sum(1), rows * cols)
        seen.update(int(key) for _, keys in batches for key in keys)
    assert set(seen.values()) == {1} and set(seen) <= set(range(90)) and len(seen) > 60


@pytest.mark.parametrize("crop", ["rrc", "pad"])
def test_naflex_batches_from_shards_resume_inside_an_epoch(shards, crop):
    augment = {"crop": crop, "auto_augment": "autoaug"}
    full, _ = naflex_batches(shards, augment=augment)
    rest, _ = naflex_batches(shards, skip=3, augment=augment)
    assert len(rest) == len(full) - 3 > 0
    for (batch, keys), (batch2, keys2) in zip(full[3:], rest, strict=True):
        assert torch.equal(keys, keys2) and all(torch.equal(batch[name], batch2[name]) for name in batch)


def test_train_py_trains_naflex_batches_from_shards_and_resumes_exactly(shards, tmp_path):
    urls = f"data.urls='{shards}/train-{{000000..000005}}.tar'"
    runs = ["data=webdataset", urls, *TINY, "data.patch_size=4", "model.patch_size=4", "data.batch_size=4"]
    runs += ["data.num_workers=0", "data.naflex.seq_lens=[4,16]", "trainer.epochs=2", "trainer.deterministic=true"]
    straight, _, _ = assert_resumes_exactly(runs, tmp_path)
    assert straight["loader"] == "webdataset" and straight["history"][-1]["val_top1"] is not None


def write_bad_shard(folder, samples, classes=True):
    """One shard of `samples` ({ext: bytes} per key) and, if asked, the class map beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    good = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(good, format="PNG")
    with TarWriter(str(folder / "train-000000.tar"), encoder=False) as sink:
        for index in range(8):
            sink.write({"__key__": f"{index:08d}", "png": good.getvalue(), "cls": b"1"})
        for key, sample in samples.items():
            sink.write({"__key__": key, **sample})
    if classes:
        (folder / "classes.json").write_text(json.dumps({c: i for i, c in enumerate(CLASSES)}))
    return str(folder / "train-000000.tar")


BAD = {
    "corrupt": ({"broken": {"jpg": b"\xff\xd8 not a jpeg", "cls": b"0"}}, r"sample broken\.jpg cannot be decoded"),
    "no label": ({"nolabel": {"png": b"x"}}, r"sample nolabel has no \.cls label"),
    "not a number": ({"word": {"png": b"x", "cls": b"cat"}}, r"sample word\.cls holds b'cat', not a class index"),
    "out of range": ({"big": {"png": b"x", "cls": b"7"}}, r"sample big\.cls holds 7, outside 0\.\.2"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_sample_stops_with_one_line_naming_shard_and_key(tmp_path, case):
    samples, needle = BAD[case]
    url = write_bad_shard(tmp_path, samples)
    cfg = {"name": "webdataset", "urls": url, "val_urls": url, "img_size": 8, "batch_size": 3, "num_workers": 2}
    with pytest.raises(DataError) as err:
        list(build_data({**cfg, "augment": {"crop": "none"}, "shuffle_buffer": 0}).train_loader)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"shard {url}: ")
    assert re.search(needle, message), message


def test_on_bad_image_skip_counts_it_and_keeps_the_number_of_batches(tmp_path, caplog):
    url = write_bad_shard(tmp_path, {"broken": {"jpg": b"\xff\xd8 not a jpeg", "cls": b"0"}})
    cfg = {"name": "webdataset", "urls": url, "val_urls": url, "img_size": 8, "batch_size": 3, "num_workers": 0}
    bundle = build_data({**cfg, "augment": {"crop": "none"}, "on_bad_image": "skip"})
    with caplog.at_level(logging.WARNING, logger="vit.data.loading.stream"):
        batches = list(bundle.train_loader)
    assert len(batches) == len(bundle.train_loader) == 3  # 9 samples, the broken one's place taken
    assert sum(len(t) for _, t in batches) == 9
    # (warnings only: an earlier test of the session may have left INFO lines of building the loader on)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "data.on_bad_image=skip: 1 unreadable training images this epoch (epoch 0); each place taken by the next "
        "readable image"
    ]


def test_settings_that_cannot_work_are_named(shards, tmp_path):
    (tmp_path / "text.tar").write_text("not a tar file")
    one_missing = [str(shards / "train-000000.tar"), str(tmp_path / "gone.tar")]
    text, where = {"urls": str(tmp_path / "text.tar"), "val_urls": str(tmp_path / "text.tar")}, re.escape(str(tmp_path))
    cases = [
        ({"urls": one_missing}, rf"^data\.urls: shard {where}/gone\.tar does not exist \(1 of 2 missing\)$"),
        ({**text, "num_classes": 3}, rf"^shard {where}/text\.tar is not a readable tar file \(method tar"),
        (text, rf"^data\.num_classes is not set and there is no {where}/classes\.json: set data\.num_classes$"),
        ({"urls": None}, r"^data\.urls is not set: data=webdataset needs data\.urls="),
        ({"urls": str(tmp_path / "none-{0..3}.tar")}, r"^data\.urls='.*none-\{0\.\.3\}\.tar' matches no file"),
        ({"loader": "resident"}, r"^data\.loader=resident cannot read data=webdataset"),
        ({"num_classes": 2}, r"^data\.num_classes=2 but .*classes\.json lists 3 classes"),
        ({"shuffle_buffer": "many"}, r"^data\.shuffle_buffer='many' must be an integer"),
        ({"batch_size": 128}, r"^data\.batch_size=128 is larger than the 90 training samples"),
        ({"augment": {"hflip_alternate": True}}, r"^data\.augment\.hflip_alternate=true is not available with data"),
    ]
    for extra, needle in cases:
        with pytest.raises(DataError, match=needle):
            build_data(cfg_for(shards, **extra))


def test_epoch_samples_reads_each_workers_shards_until_the_declared_epoch(shards):
    seen = collections.Counter()
    for rank in range(2):
        bundle = build_data(cfg_for(shards, epoch_samples=120), seed=1, rank=rank, world_size=2)
        assert bundle.num_train == 120 and len(bundle.train_loader) == 15  # 60 per rank, batches of 4
        seen.update(keys_of(bundle.train_loader))
    assert sum(seen.values()) == 120 and max(seen.values()) > 1  # 90 samples in 120 places: some repeat


def test_train_py_trains_an_epoch_on_shards(shards, tmp_path):
    urls = f"data.urls='{shards}/train-{{000000..000005}}.tar'"
    done = run_cli(["data=webdataset", urls, *TINY, "trainer.epochs=1", "data.batch_size=16", "data.num_workers=0",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    # 90 samples, batches of 16: 5 steps; validation on the 30 samples of the val split named in _info.json.
    assert metrics["epochs_done"] == 1 and metrics["history"][0]["step"] == 5 and metrics["loader"] == "webdataset"


def test_train_py_stops_on_a_pattern_that_matches_nothing(tmp_path):
    missing = run_cli(["data=webdataset", f"data.urls='{tmp_path}/nothing-{{0..9}}.tar'", *TINY], cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"data error: data.urls='{tmp_path}/nothing-{{0..9}}.tar' matches no file (the first would be "
        f"{tmp_path}/nothing-0.tar)"
    ]


@pytest.mark.slow
def test_two_processes_train_one_epoch_on_shards(shards, tmp_path):
    """torchrun, 2 gloo processes on the CPU, 2 loader workers each: 90 samples, 45 per rank, 5 steps of 8."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    args = ["data=webdataset", f"data.urls='{shards}/train-{{000000..000005}}.tar'", *TINY, "trainer.epochs=1"]
    args += ["data.batch_size=8", "data.num_workers=2", f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run([*launcher, str(REPO / "train.py"), *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["epochs_done"] == 1 and metrics["history"][0]["step"] == 5


def test_bench_shards_records_every_repeat(tmp_path, monkeypatch):
    """lab/bench_shards.py's record holds every repeat's images/s of each row and loader, beside the medians
    and ratios it prints (the passes answer from a table here; tests/e2e/test_docs_commands.py runs the documented
    command on the tests' small CIFAR-10 archive)."""
    script = load_script("bench_shards")
    monkeypatch.setattr(script, "prepare", lambda args: (tmp_path / "tree", tmp_path / "shards"))
    monkeypatch.setattr(script, "loaders", lambda args, tree, shards: {"folders": "f", "shards": "s"})
    rate = {"f": 100.0, "s": 150.0}
    monkeypatch.setattr(script, "timed_pass", lambda loader, epoch, row: rate[loader] * (1 + epoch))
    args = ["archive=a.tar", f"work={tmp_path}", "repeats=3", f"json={tmp_path / 's.json'}"]
    threads = torch.get_num_threads()
    try:
        assert script.main(args) == 0
    finally:
        torch.set_num_threads(threads)  # the script runs on one thread; the tests after it on the suite's setting
    record = json.loads((tmp_path / "s.json").read_text())
    assert_measurement_record(record, "bench_shards", "archive=a.tar", "repeats=3")
    assert [row["row"] for row in record["rows"]] == ["loader workers only", "full pipeline", script.READ_ONLY]
    for row in record["rows"]:
        assert row["folders_img_per_s_repeats"] == [100.0, 200.0, 300.0] and row["folders_img_per_s"] == 200.0
        assert row["shards_img_per_s_repeats"] == [150.0, 300.0, 450.0] and row["shards_over_folders"] == 1.5
    assert record["repeats"] == 3 and record["images"] == 10000


def test_bench_shards_refuses_a_bad_value_in_one_line(capsys, monkeypatch):
    """A bad key=value, or no archive, is one line on stderr naming the key, exit code 2 (vit/cli/args.py)."""
    from vit.cli.args import run_script

    spec = importlib.util.spec_from_file_location("bench_shards", REPO / "lab" / "bench_shards.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.delenv("VIT_CIFAR10_ARCHIVE", raising=False)
    spec.loader.exec_module(script)
    threads = torch.get_num_threads()
    try:
        for argv, message in [
            (["archive=a.tar", "workers=-1"], "usage error: workers='-1' must be an integer >= 0"),
            (["archive=a.tar", "samples_per_shard=0"], "usage error: samples_per_shard='0' must be an integer >= 1"),
            (["archive=a.tar", "--repeats", "3"], "usage error: argument '--repeats' must look like key=value"),
            (["repeats=1"], "usage error: archive=<image-folder archive> is required"),
        ]:
            assert run_script(script.main, argv, usage=script.__doc__) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith(message), err
    finally:
        torch.set_num_threads(threads)


ARCHIVE = os.environ.get("VIT_CIFAR10_ARCHIVE")


@pytest.mark.slow
@pytest.mark.skipif(not ARCHIVE, reason="VIT_CIFAR10_ARCHIVE is not set (CI sets it)")
def test_cifar10_archive_becomes_shards_with_one_command(tmp_path):
    out = tmp_path / "shards"
    args = [f"source={ARCHIVE}", f"out={out}", f"cache_dir={tmp_path / 'cache'}", "samples_per_shard=10000"]
    done = subprocess.run([installed("vit-shards"), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads((out / "_info.json").read_text())
    assert info["splits"]["train"]["shard_lengths"] == [10000] * 5
    assert info["splits"]["test"]["shard_lengths"] == [10000]
    assert len(json.loads((out / "classes.json").read_text())) == 10
    assert "data.val_urls='" + str(out.resolve()) + "/test-000000.tar'" in done.stdout
