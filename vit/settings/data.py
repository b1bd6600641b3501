"""`data.*`: what is read and how it is augmented (vit/data). `DataSettings` holds the keys every dataset has, with
the CIFAR defaults; a dataset with keys or defaults of its own is a subclass, named in its `DATASETS` entry
(vit/data/sources/registry.py), which is where a dataset's name is written: the Hydra plugin stores each entry's
class as `data/schema/<name>` with `name` set, and configs/data/<name>.yaml starts from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from vit.errors import ConfigError
from vit.settings.schema import Settings, as_given, knob


@dataclass(frozen=True)
class AugmentSettings(Settings):
    """The augmentation, the same whichever loader runs (vit/data/augment/; docs/LEVERS.md lists the policies)."""

    group: ClassVar[str] = "data.augment"

    # pad (zero-pad by `pad`, random crop) | rrc (random-resized crop, area in [scale_min, 1]) | none
    crop: Literal["pad", "rrc", "none"] = knob("pad")
    pad: int = knob(4, low=0)  # crop=pad: the zero border each side, in pixels
    scale_min: float = knob(0.08, low=0.0, high=1.0, low_open=True)  # crop=rrc: the smallest share of the area kept
    hflip: bool = knob(True)  # mirror each training image left to right with probability 0.5
    # with hflip: each image mirrored in every other epoch, from a random half of the images in the first (airbench's
    # derandomized flip: no image goes two epochs unmirrored or mirrored); false: every epoch draws each flip anew
    hflip_alternate: bool = knob(False)
    # null | autoaug (AutoAugment: CIFAR-10 policy up to 64 px, ImageNet's above) | trivial (TrivialAugmentWide)
    # | rand-m9-mstd0.5-inc1 (timm's RandAugment) | augmix (torchvision's AugMix; augmix-m3-w3-d2-a1: severity,
    # width, depth, alpha); checked against the policies' registry (vit/data/augment/policies.py) with the config
    auto_augment: str | None = knob("autoaug")
    re_prob: float = knob(0.0, low=0.0, high=1.0, high_open=True)  # random erasing: probability per image
    mixup_alpha: float = knob(0.0, low=0.0)  # Mixup: the Beta(alpha, alpha) of the mixing weight; 0: off
    cutmix_alpha: float = knob(0.0, low=0.0)  # CutMix: the Beta(alpha, alpha) of the pasted area; 0: off
    mixup_prob: float = knob(1.0, low=0.0, high=1.0)  # the share of batches Mixup or CutMix is applied to
    label_smoothing: float = knob(0.1, low=0.0, high=1.0, high_open=True)  # the target mass spread over all classes


def whole_numbers(key: str, what: str, example: str):
    """The parser of a knob that is null or a list of whole numbers >= 1 (`what` each, as in `example`), returning
    them sorted without repeats; anything else is a ConfigError naming the key."""

    def parse(value) -> tuple[int, ...] | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"{key}={value!r} must be a list of {what}s, e.g. {example}, or null")
        bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise ConfigError(f"{key}={list(value)!r}: {bad[0]!r} is not a {what} (a whole number >= 1)")
        return tuple(sorted(set(value)))

    return parse


parse_seq_lens = whole_numbers("data.naflex.seq_lens", "token count", "[16,36,64]")


@dataclass(frozen=True)
class NaFlexSettings(Settings):
    """Training on NaFlex batches (vit/data/loading/naflex_loader.py): each batch draws one of `seq_lens`, its images
    are resized to fit that many patches (their aspect ratio kept) and cut into patches; the batch holds as many images
    as data.batch_size images of `max_seq_len` tokens would, so a short sequence comes in a larger batch."""

    group: ClassVar[str] = "data.naflex"

    # null: off (square image batches at data.img_size) | the token counts a training batch draws from, e.g.
    # [16,36,64] (CIFAR at 16, 24 and 32 px with 4 px patches)
    seq_lens: tuple[int, ...] | None = knob(None, parse=parse_seq_lens)
    # the tokens of a batch: data.batch_size x max_seq_len (null: the largest of seq_lens)
    max_seq_len: int | None = knob(None, low=1)
    # null: every batch in data.patch_size patches | the patch sides a training batch draws from, uniformly, e.g.
    # [4,8] (FlexiViT's random patch sizes): the batch's images resized for seq_len patches of that side, the
    # model's kernel resampled to it (timm's patch_size_choices)
    patch_sizes: tuple[int, ...] | None = knob(
        None, parse=whole_numbers("data.naflex.patch_sizes", "patch side", "[4,8]")
    )


IMAGENET_AUGMENT = AugmentSettings(crop="rrc", auto_augment="rand-m9-mstd0.5-inc1")  # the 224 px datasets' default


@dataclass(frozen=True)
class DataSettings(Settings):
    """The keys of every dataset, with CIFAR's defaults (torchvision's CIFAR-10 and CIFAR-100)."""

    group: ClassVar[str] = "data"

    name: str | None = knob(None)  # the dataset: a name of DATASETS (vit/data/sources/registry.py)
    root: str | None = knob("data/")  # a folder or an archive; CIFAR: where torchvision downloads it
    img_size: int = knob(32, low=1, text="must be positive")  # the side images are trained and evaluated at
    patch_size: int | None = knob(4, low=1, text="must be positive")  # the patch size suggested for this size
    num_classes: int | None = knob(10, low=1)  # null: the dataset's class count
    batch_size: int = knob(512, low=1, text="must be positive")  # per process
    num_workers: int | None = knob(None, low=0)  # null: min(8, CPU count)
    pin_memory: bool = knob(True)  # the torch loader's batches in page-locked memory, for faster copies to a GPU
    val_split: str | None = knob(None)  # the folder of the validation split; null: val/, else test/
    cache_dir: str | None = knob(None)  # extracted archives, scans, decoded splits; null: beside the data
    download: bool = knob(True)  # CIFAR: download it into data.root when it is not there
    limit_train_samples: int | None = knob(None, low=1)  # class-balanced subsets
    limit_val_samples: int | None = knob(None, low=1)  # the validation split cut the same way
    # Selection without the test set: a count (int) or fraction (0-1) of the training images, class-balanced and
    # the same in every run, removed from training and used as the validation split. null: validate on the test
    # split. Its syntax is checked with the config (vit/data/sources/splits.py: parse_holdout).
    holdout: float | None = knob(None, parse=as_given)
    # Repeated augmentation (DeiT): each image of a 1/k slice of the epoch's permutation k times in a row, each copy
    # augmented on its own; the epoch keeps its length. 1: off, 3: DeiT's setting.
    repeated_aug: int | None = knob(1, low=1)
    # Image folders: every image is decoded once (cached per tree) to find unreadable files before training;
    # false: no scan (huge trees), a bad file then fails in the middle of training
    scan_images: bool = knob(True)
    # error: stop, listing up to 20 bad files and their count | skip: train on the rest, log the count
    on_bad_image: Literal["error", "skip"] = knob("error")
    # auto | torch | resident (auto: resident, the decoded split in the device's memory, when it fits); checked
    # against the loaders' registry (vit/data/loading/build.py) with the config
    loader: str = knob("auto")
    # Evaluation's geometry: the shorter side resized to img_size / crop_pct (floored, as timm does), then the
    # central img_size. null: 0.875 from 128 px up (ImageNet's custom), 1.0 below (a small image whole).
    crop_pct: float | None = knob(None, low=0.0, high=1.0, low_open=True)
    # The filter of every resize (evaluation's, the random-resized crop's, decoding to the run's size). null: bilinear
    interpolation: Literal["bilinear", "bicubic", "nearest"] | None = knob(None)
    # With model.pretrained=timm:<name>, each of crop_pct, interpolation, mean and std left null takes the value
    # timm's pretrained config gives those weights (vit/train/setup.py: use_timm_preprocessing).
    mean: tuple[float, float, float] | None = knob(None)  # null: the dataset's own statistics
    # null: the dataset's own statistics
    std: tuple[float, float, float] | None = knob(None, low=0.0, low_open=True, text="must be > 0 in every channel")
    augment: AugmentSettings = knob(AugmentSettings())
    naflex: NaFlexSettings = knob(NaFlexSettings())


@dataclass(frozen=True)
class Cifar100Settings(DataSettings):
    num_classes: int | None = knob(100, low=1)


@dataclass(frozen=True)
class ImageFolderSettings(DataSettings):
    """Images in class folders (train/ and val/ or test/), a folder or an archive of one."""

    root: str | None = knob(None)  # required: data.root=<folder or archive>
    img_size: int = knob(224, low=1, text="must be positive")
    patch_size: int | None = knob(16, low=1, text="must be positive")
    num_classes: int | None = knob(None, low=1)
    batch_size: int = knob(256, low=1, text="must be positive")
    augment: AugmentSettings = knob(IMAGENET_AUGMENT)
    unlabelled: bool = knob(False)  # every image under data.root, no labels (task=mae)


@dataclass(frozen=True)
class HfSettings(DataSettings):
    """Hugging Face datasets (datasets.load_dataset, or a folder written by save_to_disk)."""

    img_size: int = knob(224, low=1, text="must be positive")
    patch_size: int | None = knob(16, low=1, text="must be positive")
    num_classes: int | None = knob(None, low=1)
    batch_size: int = knob(256, low=1, text="must be positive")
    augment: AugmentSettings = knob(IMAGENET_AUGMENT)
    dataset_name: str | None = knob(None)  # a Hub name, e.g. uoft-cs/cifar10 (or a local folder of data files)
    dataset_config: str | None = knob(None)  # the Hub dataset's config name, when it has several
    # instead of dataset_name: a folder written by save_to_disk (a DatasetDict, or one Dataset plus data.holdout)
    path: str | None = knob(None)
    image_column: str = knob("image")  # the column of images; when `image` is missing, `img` (CIFAR on the Hub)
    label_column: str = knob("label")  # the column of class labels: ClassLabel (its names are the classes), int or str
    train_split: str = knob("train")  # the split trained on


@dataclass(frozen=True)
class SyntheticCounts(Settings):
    group: ClassVar[str] = "data.synthetic"

    num_train: int = knob(2048, low=1)  # training images (the labels and noise drawn from trainer.seed)
    num_val: int = knob(512, low=1)  # validation images


@dataclass(frozen=True)
class SyntheticSettings(DataSettings):
    """Generated images, for tests and smoke runs: no files, no download."""

    root: str | None = knob(None)
    batch_size: int = knob(64, low=1, text="must be positive")
    num_workers: int | None = knob(0, low=0)
    download: bool = knob(False)
    augment: AugmentSettings = knob(AugmentSettings(crop="none", hflip=False, auto_augment=None, label_smoothing=0.0))
    synthetic: SyntheticCounts = knob(SyntheticCounts())


@dataclass(frozen=True)
class WebDatasetSettings(DataSettings):
    """Tar shards (webdataset), streamed: vit/data/loading/stream.py."""

    num_classes: int | None = knob(None, low=1)  # null: the classes in classes.json beside the training shards
    # the training shards: a brace pattern (<dir>/train-{000000..000009}.tar) or a list of patterns and URLs
    urls: str | list | None = knob(None, parse=as_given)
    val_urls: str | list | None = knob(None, parse=as_given)  # null: the other split named beside the training shards
    # the samples an epoch trains on, the shards read in a cycle (null: every sample of the shards once)
    epoch_samples: int | None = knob(None, low=1)
    # the samples held to shuffle the stream within and across shards; 0 or 1: the shards' order as it is
    shuffle_buffer: int | None = knob(1000, low=0, why="0 or 1: no buffer")
