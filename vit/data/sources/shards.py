"""Tar shards in the WebDataset layout: the shard list, how many samples each holds, and which of them every rank
and loader worker reads in an epoch.

A shard is a plain tar file of samples, each sample the files of one key: `<key>.jpg` (or .jpeg/.png/.webp) and
`<key>.cls` holding the class index as text. Beside the shards, vit-shards writes `_info.json` (per
split: shard file names and the samples in each, the layout timm's shard reader reads) and `classes.json` (class
name -> index, the sorted order of the image folders).

An epoch's plan. With the shard lengths known (the info file, or counted in local shards), the epoch is one
global order: the shards in a permutation of (seed, epoch), shared by all ranks, their samples concatenated.
Rank r takes the contiguous range [r * M, (r + 1) * M) with M = total // world_size, so every rank gets the same
number of samples (the last total % world_size of the order sit out this epoch, as DistributedSampler's
drop_last). Its batches (M // batch_size full ones; with data.naflex the token budget's schedule, batches of
several sizes) are dealt to its `streams` (one per DataLoader worker) in turn: stream v holds batches v, v + K,
v + 2K, ... and reads them as one contiguous piece of the rank's range, so a stream opens only the shards under
its piece, starting inside the first at a sample offset. Example: 10 shards of 1,000 samples, 2 ranks, 2 workers,
batch 128: M = 5,000, 39 batches per rank (the last 8 samples sit out), stream 0 reads 20 batches (2,560
samples), stream 1 19 (2,432).

With `epoch_samples` declared instead (shards of unknown length, e.g. remote ones without an info file), the
shards are dealt round-robin to the world_size * K streams, each stream reading its shards in turn, again and
again, until it has given its share of the declared epoch: samples may then repeat or sit out within an epoch.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import torch

from vit.data.errors import DataError
from vit.settings.data import WebDatasetSettings

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
LABEL_EXTENSION = "cls"
INFO_NAME = "_info.json"
CLASSES_NAME = "classes.json"

Segment = tuple[int, int, int | None]  # (shard index, first sample, stop sample or None: to the shard's end)


def is_local(url: str) -> bool:
    if url.startswith("file:"):
        return True
    return "://" not in url and not url.startswith("pipe:")


def local_path(url: str) -> Path:
    return Path(url.removeprefix("file://").removeprefix("file:")).expanduser()


def expand_shards(value, key: str) -> list[str]:
    """data.<key> (a brace pattern, or a list of patterns/URLs) as the list of shard URLs; local shards must
    exist."""
    if value is None or value == "" or (not isinstance(value, str) and len(value) == 0):
        raise DataError(f"data.{key} is not set: data=webdataset needs data.{key}=<dir>/train-{{000000..000009}}.tar")
    # webdataset is an optional dependency (pip install .[data]), imported where shards are read (here and below), so
    # that vit/data loads and trains the other datasets without it.
    from webdataset.shardlists import expand_urls

    items = [value] if isinstance(value, str) else [str(v) for v in value]
    urls = [url for item in items for url in expand_urls(item)]
    missing = [url for url in urls if is_local(url) and not local_path(url).is_file()]
    if missing and len(missing) == len(urls):
        raise DataError(f"data.{key}={_shown(value)} matches no file (the first would be {missing[0]})")
    if missing:
        raise DataError(f"data.{key}: shard {missing[0]} does not exist ({len(missing)} of {len(urls)} missing)")
    return urls


def _shown(value) -> str:
    return repr(value) if isinstance(value, str) else repr([str(v) for v in value])


def beside(url: str, name: str) -> str:
    """The file `name` in the folder (or URL prefix) holding shard `url`."""
    return url.rsplit("/", 1)[0] + "/" + name if "/" in url else name


def read_json(url: str) -> dict | None:
    """A JSON file beside the shards, or None when there is none; one that does not parse is a DataError."""
    try:
        if is_local(url):
            path = local_path(url)
            if not path.is_file():
                return None
            text = path.read_text()
        else:
            from webdataset.gopen import gopen  # optional dependency: see expand_shards

            with gopen(url) as stream:
                text = stream.read().decode()
    except Exception:  # a remote store without the file
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{url} is not valid JSON ({err})") from None


def info_lengths(info: dict | None, url: str) -> dict[str, int]:
    """Shard file name -> sample count, from every split of an info file."""
    table = {}
    try:
        for split in (info or {}).get("splits", {}).values():
            table.update(zip(split["filenames"], (int(n) for n in split["shard_lengths"]), strict=True))
    except (KeyError, TypeError, ValueError) as err:
        raise DataError(f"{beside(url, INFO_NAME)}: no filenames/shard_lengths per split ({err!r})") from None
    return table


def count_samples(url: str) -> int:
    """The samples (distinct keys) of a local shard, read from its tar headers only."""
    from webdataset.tariterators import base_plus_ext  # optional dependency: see expand_shards

    keys = set()
    try:
        with tarfile.open(local_path(url)) as tar:
            for member in tar:
                key, ext = base_plus_ext(member.name)
                if member.isreg() and key is not None and not member.name.startswith("__"):
                    keys.add(key)
    except (tarfile.TarError, OSError) as err:
        why = str(err).strip().splitlines()[-1].lstrip("- ")  # tarfile lists one reason per compression tried
        raise DataError(f"shard {url} is not a readable tar file ({why})") from None
    return len(keys)


def shard_lengths(urls: list[str]) -> list[int] | None:
    """Samples per shard: the info file beside the shards, else counted in local shards; None when a remote
    shard's count is unknown."""
    table = info_lengths(read_json(beside(urls[0], INFO_NAME)), urls[0])
    lengths = []
    for url in urls:
        name = url.rsplit("/", 1)[-1]
        if name in table:
            lengths.append(table[name])
        elif is_local(url):
            lengths.append(count_samples(url))
        else:
            return None
    return lengths


def split_range(total: int, parts: int) -> list[tuple[int, int]]:
    """[0, total) in `parts` contiguous pieces, the first total % parts one longer."""
    bounds, start = [], 0
    for part in range(parts):
        size = total // parts + (part < total % parts)
        bounds.append((start, start + size))
        start += size
    return bounds


def shard_order(count: int, seed: int, epoch: int) -> list[int]:
    """The shards' order in an epoch: one permutation of (seed, epoch), the same on every rank."""
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()


def segments(lengths: list[int], order: list[int], start: int, stop: int) -> list[Segment]:
    """Positions [start, stop) of the shards concatenated in `order`, as (shard, first, stop) pieces."""
    pieces, offset = [], 0
    for shard in order:
        lo, hi = max(start, offset), min(stop, offset + lengths[shard])
        if lo < hi:
            pieces.append((shard, lo - offset, hi - offset))
        offset += lengths[shard]
    return pieces


def train_plan(lengths, *, seed, epoch, rank, world_size, streams, batch_sizes, limit=None) -> list[list[Segment]]:
    """Each stream's pieces of the epoch (the module docstring's worked example), `batch_sizes` the samples of
    each of the rank's batches in the epoch's order (batch i read by stream i % streams); limit: only the first
    `limit` samples of the epoch's order."""
    total = min(sum(lengths), limit) if limit else sum(lengths)
    start = rank * (total // world_size)
    order = shard_order(len(lengths), seed, epoch)
    plan = []
    for stream in range(streams):
        count = sum(batch_sizes[stream::streams])
        plan.append(segments(lengths, order, start, start + count))
        start += count
    return plan


def val_plan(lengths, *, rank, world_size, streams, limit=None) -> list[list[Segment]]:
    """Every validation sample once over all ranks: the shards in their given order, rank r a contiguous share
    (sizes differ by at most one), split evenly over its streams."""
    total = min(sum(lengths), limit) if limit else sum(lengths)
    lo, hi = split_range(total, world_size)[rank]
    order = list(range(len(lengths)))
    return [segments(lengths, order, lo + a, lo + b) for a, b in split_range(hi - lo, streams)]


def cyclic_plan(count: int, *, seed, epoch, rank, world_size, streams) -> list[list[Segment]]:
    """data.epoch_samples: the shards of the epoch's order dealt round-robin to all world_size * streams
    streams; each stream reads its whole shards in turn until it has its quota."""
    order = shard_order(count, seed, epoch)
    total_streams = world_size * streams
    if count < total_streams:
        raise DataError(
            f"data.epoch_samples: {count} shards cannot feed {world_size} ranks x {streams} loader workers (each "
            "reads shards of its own): make more shards, or use fewer workers (data.num_workers)"
        )
    return [[(s, 0, None) for s in order[rank * streams + v :: total_streams]] for v in range(streams)]


def split_of(info: dict | None, url: str) -> str | None:
    name = url.rsplit("/", 1)[-1]
    for split, entry in (info or {}).get("splits", {}).items():
        if name in entry.get("filenames", ()):
            return split
    return None


def val_shards(cfg: WebDatasetSettings, train_urls: list[str]) -> tuple[list[str], str]:
    """data.val_urls, else the one other split the info file beside the training shards lists; and its name."""
    info_url = beside(train_urls[0], INFO_NAME)
    info = read_json(info_url)
    if cfg.val_urls:
        urls = expand_shards(cfg.val_urls, "val_urls")
        return urls, split_of(read_json(beside(urls[0], INFO_NAME)), urls[0]) or "val"
    train_split = split_of(info, train_urls[0])
    others = [name for name in (info or {}).get("splits", {}) if name != train_split]
    if len(others) != 1:
        raise DataError(
            f"data.val_urls is not set and {info_url} does not name one validation split: "
            "set data.val_urls=<dir>/val-{000000..000001}.tar"
        )
    filenames = info["splits"][others[0]].get("filenames") or []
    return expand_shards([beside(train_urls[0], f) for f in filenames], "val_urls"), others[0]


def class_map(cfg: WebDatasetSettings, train_urls: list[str]) -> tuple[int, dict[str, int]]:
    """data.num_classes, else the size of classes.json beside the shards; and the class-to-index map."""
    url = beside(train_urls[0], CLASSES_NAME)
    classes = read_json(url)
    if classes is not None and not (isinstance(classes, dict) and all(isinstance(v, int) for v in classes.values())):
        raise DataError(f'{url} must map class names to indices ({{"cat": 0, ...}})')
    num_classes = cfg.num_classes or len(classes or {})
    if num_classes <= 0:
        raise DataError(f"data.num_classes is not set and there is no {url}: set data.num_classes")
    if classes and num_classes < len(classes):
        raise DataError(f"data.num_classes={num_classes} but {url} lists {len(classes)} classes")
    return num_classes, dict(classes) if classes else {str(i): i for i in range(num_classes)}


def known_lengths(urls: list[str], key: str, declared: int | None) -> list[int] | None:
    if declared:
        return None
    lengths = shard_lengths(urls)
    if lengths is None:
        raise DataError(
            f"data.{key}: the sample counts of the remote shards are unknown ({urls[0]} is not listed in an "
            f"{INFO_NAME} beside it): put make_shards.py's {INFO_NAME} there"
            + (", or set data.epoch_samples=<samples per epoch>" if key == "urls" else "")
        )
    return lengths
