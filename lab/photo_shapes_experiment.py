"""Images at their own shapes against square crops, on real photographs cut into crops of mixed shapes
(docs/VARIANTS.md, "Native aspect against square crops on photographs").

The folder: every photograph in `photos` is a class (its file stem), cut into crops of random shapes, their aspect
ratio log-uniform in [1/3, 3] and their shorter side from 24 to 96 px (smaller where the strip is): `train_per_class`
crops from the left 70% of the photograph's width, `test_per_class` from the right 30%, so no pixel is in both.
Then the same ViT/8 is trained for the same epochs in two ways, each with several seeds:
    native   each crop at its own shape, its aspect ratio kept, in at most 64 patches (data.naflex.seq_lens=[64],
             through the torch loader)
    square   the usual path: each crop through the random-resized crop to a 64 x 64 px square (64 patches)
with the same augmentation (random-resized crop, flip), a 10% holdout of the training crops for the per-epoch
curve, and the test crops read once at the end. Each final model is then evaluated on the test crops both ways:
whole at their own shapes (`vit-eval seq_len=64`) and square (vit-eval's resize and centre crop).

usage: python lab/photo_shapes_experiment.py photos=<folder of photographs> work=<folder> [seeds=0,1]
    [train_per_class=200] [test_per_class=60] [epochs=30] [batch_size=64] [plot_only=false]

Example (the 10 photographs scikit-image ships in skimage/data/, taken from its wheel without installing it):

    pip download scikit-image --no-deps -d /tmp/sk && unzip -j /tmp/sk/scikit_image-*.whl \\
        'skimage/data/'{astronaut,brick,camera,chelsea,coffee,coins,grass,gravel,moon,rocket}.* -d /tmp/photos
    python lab/photo_shapes_experiment.py photos=/tmp/photos work=/tmp/photo_shapes

`<work>/results.json` is the measurement record: the provenance (command, commit, machine, versions) beside every
run's metrics, both evaluations of each final model, and the summary.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from experiments import CPU_TRAINER, run_or_load, train
from PIL import Image
from records import script_command

from vit.cli.args import parse_args, run_script
from vit.errors import UsageError

PHOTO_SUFFIXES = (".png", ".jpg", ".jpeg")
TRAIN_SHARE = 0.7  # the left part of each photograph's width that training crops come from
MODEL = ["model=vit_tiny", "model.embed_dim=96", "model.depth=6", "model.num_heads=3", "model.mlp_ratio=2.0"]
MODEL += ["model.drop_path_rate=0.0", "model.patch_size=8"]
DATA = ["data=imagefolder", "data.img_size=64", "data.patch_size=8", "data.loader=torch", "data.num_workers=1"]
DATA += ["data.holdout=0.1", "data.augment.crop=rrc", "data.augment.hflip=true"]
DATA += ["data.augment.auto_augment=null", "data.augment.label_smoothing=0.1"]
METHODS = {"native": ["data.naflex.seq_lens=[64]"], "square": []}
DEFAULTS = {"photos": None, "work": None, "seeds": "0,1", "train_per_class": "200", "test_per_class": "60"}
DEFAULTS |= {"epochs": "30", "batch_size": "64", "plot_only": "false"}


def parse_settings(argv: list[str]) -> SimpleNamespace:
    args = parse_args(argv, DEFAULTS, ("photos", "work"), lists=("seeds",))
    photos = Path(args["photos"])
    if not photos.is_dir():
        raise UsageError(f"photos={photos} is not a folder")
    return SimpleNamespace(
        photos=photos,
        work=Path(args["work"]),
        seeds=args.whole_numbers("seeds"),
        train_per_class=args.integer("train_per_class"),
        test_per_class=args.integer("test_per_class"),
        epochs=args.integer("epochs"),
        batch_size=args.integer("batch_size"),
        plot_only=args.flag("plot_only"),
    )


def random_box(rng: random.Random, left: int, right: int, height: int) -> tuple[int, int, int, int]:
    """A crop box (left, top, right, bottom) inside columns [left, right) of a photograph `height` tall: aspect
    ratio log-uniform in [1/3, 3], shorter side 24-96 px, scaled down (the ratio kept) to fit the strip."""
    ratio = math.exp(rng.uniform(math.log(1 / 3), math.log(3)))  # width / height
    short = rng.uniform(24, 96)
    width, tall = (short * ratio, short) if ratio >= 1 else (short, short / ratio)
    shrink = min(1.0, (right - left) / width, height / tall)
    width, tall = max(1, int(width * shrink)), max(1, int(tall * shrink))
    x, y = rng.randint(left, right - width), rng.randint(0, height - tall)
    return x, y, x + width, y + tall


def make_folder(args) -> Path:
    """<work>/folder/{train,test}/<photograph>/<i>.jpg: the crops of the module docstring, from seed 0."""
    root = args.work / "folder"
    if root.is_dir():
        return root
    photos = sorted(p for p in args.photos.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)
    if len(photos) < 2:
        raise UsageError(f"photos={args.photos} holds {len(photos)} photographs (.png, .jpg): at least 2 classes")
    rng = random.Random(0)
    for photo in photos:
        image = Image.open(photo).convert("RGB")
        split_at = int(image.width * TRAIN_SHARE)
        for split, count, (left, right) in (("train", args.train_per_class, (0, split_at)),
                                              ("test", args.test_per_class, (split_at, image.width))):  # fmt: skip
            folder = root / split / photo.stem
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                image.crop(random_box(rng, left, right, image.height)).save(folder / f"{i}.jpg", quality=90)
    return root


def evaluate(run_dir: Path, own_shapes: bool) -> dict:
    """The final model of a run on the test crops: whole at their own shapes (seq_len=64) or square."""
    out = run_dir / f"eval_{'own_shapes' if own_shapes else 'square'}.json"
    if not out.is_file():
        vit_eval = Path(sys.executable).with_name("vit-eval")  # the installed command, beside this Python
        command = [str(vit_eval), f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}"]
        command += ["data.holdout=null", "amp=none", "device=cpu", f"json={out}"]
        command += ["seq_len=64"] if own_shapes else []
        subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def run_all(args) -> dict:
    root = make_folder(args)
    runs, evaluations = {}, {}
    for method, extra in METHODS.items():
        for seed in args.seeds:
            name = f"{method}-{seed}"
            overrides = [*MODEL, *DATA, *CPU_TRAINER, *extra, f"data.root={root}", f"trainer.epochs={args.epochs}"]
            overrides += [f"trainer.seed={seed}", f"data.batch_size={args.batch_size}", "optim.lr=1e-3"]
            overrides += ["sched.warmup_epochs=2"]
            runs[name] = train(name, overrides, args.work)
            run_dir = args.work / "runs" / name
            evaluations[name] = {
                view: {k: evaluate(run_dir, view == "own_shapes")[k] for k in ("top1", "loss", "count")}
                for view in ("own_shapes", "square")
            }
    classes = sorted(p.name for p in (root / "train").iterdir())
    return {"runs": runs, "evaluations": evaluations, "classes": classes}


def summary(results: dict) -> dict:
    """Test top-1 of each training (native, square) under each evaluation: per seed, mean and spread."""
    table = {}
    for method in METHODS:
        for view in ("own_shapes", "square"):
            tops = [e[view]["top1"] for name, e in sorted(results["evaluations"].items()) if name.startswith(method)]
            spread = statistics.stdev(tops) if len(tops) > 1 else 0.0
            table[f"{method}/{view}"] = {"test_top1": tops, "mean": statistics.mean(tops), "std": spread}
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_settings(sys.argv[1:] if argv is None else argv)
    command = script_command(__file__, argv)
    results = run_or_load(args, run_all, summary, measurement="photo_shapes", command=command)
    for key, row in results["summary"].items():
        print(f"{key:>20}: {row['mean']:.2f}% +- {row['std']:.2f} ({', '.join(f'{t:.2f}' for t in row['test_top1'])})")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
