"""Write an image-folder tree, or a .tar/.tar.gz/.zip of one, as tar shards for data=webdataset.

usage: vit-shards source=<folder or archive> out=<output folder> [samples_per_shard=5000] [seed=0]
       [val_split=<name>] [cache_dir=<folder>]

Example (the CIFAR-10 JPEGs that vit-cifar-jpegs writes):

    vit-shards source=data/cifar10-jpeg.tar.gz out=data/cifar10-shards samples_per_shard=5000

Input: <root>/train/<class>/* and <root>/{val,validation,test}/<class>/*, the layout data=imagefolder reads (an
archive is extracted once, beside it or into cache_dir). Written into the output folder `out`:
  train-000000.tar ...    the training images in one random order (fixed by seed), samples_per_shard each
  <split>-000000.tar ...  the validation split, named after its folder (val, validation or test), also shuffled
  classes.json            class name -> index: the sorted class folders, as data=imagefolder numbers them
  _info.json              per split: the shard file names and the samples in each (the layout timm's shard
                          reader reads too); the trainer reads the epoch's length and its split from it
A sample is <key>.<ext>, the image file's own bytes (.jpg, .jpeg, .png and .webp as they are; other formats
re-encoded as .png), and <key>.cls, its class index as text. <key> is the image's position in the sorted listing
of its split (8 digits). Images are copied without being decoded: an unreadable one is found by the loader
(data.on_bad_image). At the end the script prints the train.py command that trains on the shards.

Options: samples_per_shard=<n> (5000), seed=<s> (0), val_split=<name> (default: the first of val, validation,
test that exists), cache_dir=<folder> (where an archive is extracted; default: beside it). The output folder is
created and must not hold shards already. Bad input: one line, exit code 2.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from torchvision.datasets import ImageFolder
from webdataset import TarWriter

from vit.cli.args import Arguments, Key, keys_help, parse_args, refuse_positional, run_script
from vit.data.errors import DataError
from vit.data.sources.archive import ArchiveError, extract_archive, is_archive
from vit.data.sources.folders import VAL_SPLIT_NAMES, find_tree_root
from vit.data.sources.shards import CLASSES_NAME, IMAGE_EXTENSIONS, INFO_NAME

SHARD_MTIME = 0  # every member's time stamp: the same tree and seed give byte-identical shards


KEYS = {
    "source": Key("an image-folder tree, or a .tar/.tar.gz/.zip of one", kind="path"),
    "out": Key("the output folder (must not hold shards already)", kind="path"),
    "samples_per_shard": Key("images a shard", "5000", kind="int", low=1),
    "seed": Key("the order the images are written in", "0", kind="int", low=0),
    "val_split": Key("the validation folder (default: the first of val, validation, test)"),
    "cache_dir": Key("where an archive is extracted (default: beside it)", kind="path"),
}


def positional_form(paths: list[str], argv: list[str]) -> str:
    """The key=value form of paths given without a key: the keys `argv` does not give yet, in the order the tool
    once took its two paths (source, then out)."""
    keys = [key for key in ("source", "out") if not any(arg.startswith(f"{key}=") for arg in argv)]
    named = [f"{key}={path}" for key, path in zip(keys, paths, strict=False)]
    return " ".join(named + [f"{key}=<...>" for key in keys[len(named) :]]) or "every argument as key=value (--help)"


def parse_command(argv: list[str]) -> tuple[str, str, Arguments]:
    """(source, output folder, the `key=value` options)."""
    refuse_positional(argv, lambda paths: positional_form(paths, argv))
    args = parse_args(argv, KEYS, ("source", "out"))
    return args["source"], args["out"], args


def find_tree(source: str, val_split: str | None, cache_dir: str | None) -> tuple[Path, str]:
    """The folder holding train/ (after extracting an archive) and the validation folder's name."""
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise DataError(f"source={source} does not exist")
    if is_archive(path):
        try:
            path = extract_archive(path, cache_dir)
        except ArchiveError as err:
            raise DataError(str(err)) from None
    root = find_tree_root(path)
    names = [val_split] if val_split else list(VAL_SPLIT_NAMES)
    found = next((name for name in names if (root / name).is_dir()), None)
    if found is None:
        raise DataError(f"source={source}: no {'/, '.join(names)}/ folder beside train/ in {root}")
    return root, found


def list_split(folder: Path) -> ImageFolder:
    try:
        return ImageFolder(str(folder), allow_empty=True)  # lists files, decodes nothing
    except (FileNotFoundError, RuntimeError) as err:
        raise DataError(f"{folder}: {err}") from None


def encoded(path: str) -> tuple[str, bytes]:
    """(extension, bytes) of one image: the file as it is, or re-encoded as PNG for other formats."""
    ext = Path(path).suffix.lower().lstrip(".")
    if ext in IMAGE_EXTENSIONS:
        return ext, Path(path).read_bytes()
    buffer = io.BytesIO()
    try:
        with Image.open(path) as image:
            image.save(buffer, format="PNG")
    except (OSError, ValueError) as err:
        raise DataError(f"{path} cannot be re-encoded as PNG ({err})") from None
    return "png", buffer.getvalue()


def write_split(dataset: ImageFolder, order: np.ndarray, output: Path, prefix: str, per_shard: int) -> dict:
    """Shards <prefix>-000000.tar ... of the samples in `order`; the split's entry of _info.json."""
    filenames, lengths = [], []
    for shard, start in enumerate(range(0, len(order), per_shard)):
        name = f"{prefix}-{shard:06d}.tar"
        chunk = order[start : start + per_shard]
        with TarWriter(str(output / name), encoder=False, mtime=SHARD_MTIME) as sink:
            for index in chunk:
                path, label = dataset.samples[index]
                ext, data = encoded(path)
                sink.write({"__key__": f"{index:08d}", ext: data, "cls": str(label).encode()})
        filenames.append(name)
        lengths.append(len(chunk))
    return {"name": prefix, "num_samples": int(len(order)), "filenames": filenames, "shard_lengths": lengths}


def brace(prefix: str, count: int) -> str:
    return f"{prefix}-{{000000..{count - 1:06d}}}.tar" if count > 1 else f"{prefix}-000000.tar"


def main(argv: list[str]) -> int:
    source, output, args = parse_command(argv)
    per_shard, seed = args.integer("samples_per_shard"), args.integer("seed", minimum=0)
    root, val_name = find_tree(source, args["val_split"] or None, args["cache_dir"] or None)
    train, val = list_split(root / "train"), list_split(root / val_name)
    if val.class_to_idx != train.class_to_idx:
        raise DataError(f"{root}: the class folders of train/ and {val_name}/ differ; both need the same classes")
    for split, dataset in (("train", train), (val_name, val)):
        if len(dataset) == 0:
            raise DataError(f"{root / split} holds no image files")
    output = Path(output).expanduser()
    if output.exists() and (any(output.glob("*.tar")) or (output / INFO_NAME).exists()):
        raise DataError(f"out={output} already holds shards: choose an empty or new folder")
    output.mkdir(parents=True, exist_ok=True)
    # Both splits shuffled: every shard holds every class, and data.limit_val_samples (the first samples of the
    # validation shards) is a random subset rather than the first classes.
    rng = np.random.default_rng(seed)
    splits = {
        "train": write_split(train, rng.permutation(len(train)), output, "train", per_shard),
        val_name: write_split(val, rng.permutation(len(val)), output, val_name, per_shard),
    }
    (output / CLASSES_NAME).write_text(json.dumps(train.class_to_idx, indent=1) + "\n")
    info = {"name": root.name, "classes": len(train.classes), "seed": seed, "splits": splits}
    (output / INFO_NAME).write_text(json.dumps(info, indent=1) + "\n")  # last: shards without it are unfinished
    counts = {name: len(split["filenames"]) for name, split in splits.items()}
    print(
        f"wrote {counts['train']} training shards ({len(train)} images) and {counts[val_name]} {val_name} shards "
        f"({len(val)} images) of {len(train.classes)} classes to {output}"
    )
    where = output.resolve()
    # Quoted twice: the shell keeps the braces (no shell brace expansion), Hydra reads the value as one string.
    print(
        f"train on them: python train.py data=webdataset \"data.urls='{where}/{brace('train', counts['train'])}'\" "
        f"\"data.val_urls='{where}/{brace(val_name, counts[val_name])}'\""
    )
    return 0


def console() -> None:
    """`vit-shards`."""
    sys.exit(run_script(main, usage=__doc__, keys=keys_help(KEYS)))
