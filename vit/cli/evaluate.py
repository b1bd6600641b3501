"""Evaluate any weights on a dataset: a checkpoint of this trainer, or a model name with foreign weights.

usage: vit-eval checkpoint=<path> [data.<key>=...] [ema=auto|true|false] [flip=true] [shift=<pixels>]
           [confusion=<png>] [json=<path>] [amp=auto|bf16|fp16|none] [seq_len=<tokens>]
       vit-eval model=<name> model.pretrained=<timm:name | file> [model.<key>=...]
           [data=<config>] [data.<key>=...] [preprocess=data|timm:<name>] [class_map=imagenet|<file>]

Examples:

    vit-eval checkpoint=outputs/.../checkpoints/best.pt [data.root=...] [ema=false] [flip=true]
    vit-eval model=vit_small model.pretrained=timm:vit_small_patch16_224.augreg_in1k \\
        data=imagefolder data.root=/data/imagenet [class_map=imagenet]
    vit-eval model=t2t_vit_14 model.pretrained=81.5_T2T_ViT_14.pth.tar model.qk_scale=0.05103 \\
        data=imagefolder data.root=/data/imagenet

A checkpoint of ours is evaluated on its own data config (data.<key>=value overrides any key; a run trained with
data.holdout on its holdout unless data.holdout=null). Foreign weights take `data=<config>` (default imagefolder)
with data.<key> overrides, and the model is the registry's `model` with `model.<key>=value` overrides, the class
count of the weights and the image size of the preprocessing. The split is the data config's validation split:
`data.val_split=<folder>` for image folders (default val/, validation/ or test/), CIFAR's test split, or with
`data.holdout=<n>` a class-balanced slice of the training images; `data.limit_val_samples=<n>` a balanced subset,
only when given on this command (a limit in a checkpoint's training config is named in one line and not applied).

Weights: {ema_rule}

Test-time augmentation (as trainer.eval_flip and trainer.eval_shift): `flip=true` averages each image's class
probabilities with its mirror's; `shift=<n>` weighs in the image moved n pixels down-right and up-left (1/4 each,
the image itself 1/2), each view with its mirror under flip=true. Each view is one more forward pass.

Images at their own shapes: `seq_len=<n>` evaluates each image whole (no crop), resized with its aspect ratio kept
to at most n patches (each side a whole number of patches), the batches NaFlex batches (vit/naflex.py: each image on
its own grid, padding masked); any ViT with the standard patch embedding (a data.naflex run's, timm's NaFlexVit
models). `seq_len=64` is a 32 px square image in 4 px patches, `seq_len=144` the same at 48 px.

Preprocessing: `preprocess=timm:<name>` is timm's pretrained config of those weights (resize ratio, interpolation,
mean/std), `preprocess=data` the data config's validation transform; by default a `timm:` source uses timm's
config, everything else the data config's. The JSON names the one used.

Classes: when the weights know more classes than the data has (ImageNet weights on a folder of some of its
synsets), each data class is looked up among the weights' by name and only those logits compete (top-1, top-5
and the loss are over the data's classes). The names come from the checkpoint (ours), from `class_map=<file>`
(the weights' class names, one a line, in output order) or `class_map=imagenet` (the 1000 ImageNet-1k synsets,
chosen by default for 1000-class weights on folders named like synsets). Equal counts and no names: in order.

Precision: `amp=` (default: the run's own trainer.amp, or auto for foreign weights), decided for this device by
the trainer's rule (vit/runtime/device.py: auto is bf16 where the device has it natively and the model is wide
enough to gain, else fp32); the JSON's "precision" names what ran.

Output: JSON on stdout (top1, top5, loss, per-class top-1, images/s of the evaluation loop with decoding, the
split, the weights read ("weights": ema or raw), the preprocessing and the class mapping; `json=<path>` also writes
it) and a one-line summary on stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from vit.cli.args import Key, keys_help, parse_args, run_script
from vit.cli.tool_keys import AMP, DATA, EMA, FLIP, MODEL, PREPROCESS, SEQ_LEN, SHIFT, THREADS
from vit.deploy.loaded_model import resolve, with_ema_rule
from vit.errors import ConfigError, UsageError
from vit.progress import progress

KEYS = {
    "checkpoint": Key("a checkpoint of this trainer (best.pt, last.pt, averaged.pt, a sharded folder)", kind="path"),
    "model": MODEL,
    "data": DATA,
    "ema": EMA,
    "flip": FLIP,
    "shift": SHIFT,
    "seq_len": SEQ_LEN,
    "class_map": Key("the weights' class names: imagenet, or a file of one name a line"),
    "preprocess": PREPROCESS,
    "batch_size": Key("images a batch (default: the data config's, else 256)", kind="int", low=1),
    "device": Key("auto, cpu, cuda or cuda:<i>", "auto"),
    "threads": THREADS,
    "limit_batches": Key("evaluate only the first n batches (drawn across every class)", kind="int", low=1),
    "confusion": Key("write the confusion matrix as this PNG", kind="path"),
    "json": Key("also write the JSON result to this file", kind="path"),
    "amp": AMP,
}
SYNSET = re.compile(r"^n\d{8}$")


class SelectLogits(nn.Module):
    """A classifier whose logits are cut down to `indices` (one per data class, in the data's order)."""

    def __init__(self, model: nn.Module, indices: list[int]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("indices", torch.tensor(indices, dtype=torch.long), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).index_select(-1, self.indices)


def imagenet_synsets() -> list[str]:
    from timm.data import ImageNetInfo

    return list(ImageNetInfo().label_names())


def weight_class_names(option: str | None, known: list[str] | None, outputs: int, data_classes: list[str]):
    """(the weights' class names in output order or None, how they were found)."""
    if option == "imagenet":
        return imagenet_synsets(), "class_map=imagenet (ImageNet-1k synsets)"
    if option:
        path = Path(option)
        if not path.is_file():
            raise UsageError(f"class_map={option}: no such file (the weights' class names, one a line, or imagenet)")
        names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        return names, f"class_map={option}"
    if known:
        return known, "the checkpoint's class names"
    if outputs == 1000 and data_classes and all(SYNSET.match(c) for c in data_classes):
        return imagenet_synsets(), "ImageNet-1k synsets (1000-class weights, folders named like synsets)"
    return None, "in order (the weights carry no class names)"


def class_indices(names: list[str] | None, outputs: int, data_classes: list[str], how: str) -> list[int] | None:
    """For each data class, the weights' output index; None when it is the identity."""
    if names is None:
        if outputs != len(data_classes):
            raise UsageError(
                f"the weights have {outputs} classes and the data {len(data_classes)}, and the weights carry no class "
                "names: give class_map=<file with the weights' class names, one a line> (or class_map=imagenet)"
            )
        return None
    if len(names) != outputs:
        raise UsageError(f"{how} lists {len(names)} classes but the weights have {outputs}")
    position = {name: i for i, name in enumerate(names)}
    missing = [c for c in data_classes if c not in position]
    if missing:
        raise UsageError(
            f"{len(missing)} of the data's {len(data_classes)} classes are not among the weights' ({how}), "
            f"e.g. {missing[0]!r}"
        )
    indices = [position[c] for c in data_classes]
    return None if indices == list(range(outputs)) else indices


def for_this_machine(data_cfg, given) -> None:
    """A checkpoint's data config, as this evaluation runs it: this machine's worker count, and every image of
    the split (the run's data.limit_val_samples served its per-epoch evaluations; said in one line), unless this
    command sets them."""
    if not any(edit.key == "num_workers" for edit in given):
        data_cfg.num_workers = None
    carried_limit = data_cfg.get("limit_val_samples")
    if carried_limit is not None and not any(edit.key == "limit_val_samples" for edit in given):
        data_cfg.limit_val_samples = None
        print(
            f"data.limit_val_samples={carried_limit} of the checkpoint's training config is not applied: every "
            "image of the split is evaluated (data.limit_val_samples=<n> on this command limits it)",
            file=sys.stderr,
        )


def evaluation_loader(
    split, pre, data_cfg, batch_size: int, device: torch.device, naflex: tuple[int, int] | None = None
) -> DataLoader:
    """The split through the preprocessing, its batches drawn across every class (so limit_batches sees them all),
    with this machine's workers (at most 8) unless the data config names a count. `naflex` (seq_len, patch size):
    each image whole at its own shape, at most seq_len patches, the batches NaFlex batches (vit/naflex.py)."""
    from vit.data.loading.naflex_loader import PackImages
    from vit.data.loading.torch_loader import ShardSampler, Transformed, class_balanced_order

    workers = data_cfg.get("num_workers")
    workers = min(8, os.cpu_count() or 1) if workers is None else int(workers)
    transform = pre.transform() if naflex is None else pre.naflex_transform(*naflex)
    dataset = Transformed(split, transform)
    sampler = ShardSampler(len(dataset), order=class_balanced_order(dataset))
    collate = None if naflex is None else PackImages(naflex[1])
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, pin_memory=device.type == "cuda",
        collate_fn=collate,
    )  # fmt: skip


def own_shapes(options, model: nn.Module, flip: bool, shift: int) -> tuple[int, int] | None:
    """seq_len=<n>: (n, the model's patch size), the images evaluated whole at their own shapes as NaFlex batches;
    None without it. Test-time views are of square image tensors: refused beside it, in one line."""
    from vit.deploy.preprocessing import naflex_patch_size

    patch = naflex_patch_size(model, options.get("seq_len"))
    if patch is None:
        return None
    if flip or shift:
        raise UsageError(f"seq_len={options.get('seq_len')} evaluates each image once, at its own shape: leave out "
                         "flip and shift (their views are of square images)")  # fmt: skip
    return int(options.get("seq_len")), patch


def eval_threads(setting: str, device: torch.device) -> tuple[int, str]:
    """threads=: the trainer's rule (vit/train/thread_fit.py), set for this process: (the count, why). The summary
    line names the count, the JSON both."""
    from vit.settings.trainer import parse_threads
    from vit.train.thread_fit import choose_threads

    try:
        parsed = parse_threads(int(setting) if setting.isdigit() else setting)
    except ConfigError as err:
        raise UsageError(str(err).replace("trainer.threads", "threads")) from None
    threads, why = choose_threads(parsed, device)
    torch.set_num_threads(threads)
    return threads, why.replace("trainer.threads", "threads")


def evaluate_weights(argv: list[str]) -> dict:
    from vit.data.sources.registry import build_splits
    from vit.runtime.device import announce, choose_precision, resolve_device
    from vit.tasks.evaluation import evaluate

    options = parse_args(argv, KEYS, model_keys=True, data_keys=True)
    weights, pre, data_cfg = resolve(options)
    if weights.untrained_head:  # the figures below are then a random classifier's: said, not hidden in chance
        print(f"warning: {weights.source}: {weights.untrained_head}: this evaluates a random classifier",
              file=sys.stderr)  # fmt: skip
    if weights.config is not None:
        for_this_machine(data_cfg, options.data)
    batch_size = options.integer("batch_size", int(data_cfg.get("batch_size") or 256))
    device = resolve_device(options.get("device", "auto"))
    threads = eval_threads(options.get("threads", "auto"), device)
    flip = options.flag("flip")
    shift = options.integer("shift", 0, minimum=0)
    naflex = own_shapes(options, weights.model, flip, shift)

    splits = build_splits(data_cfg)
    data_classes = sorted(splits.class_to_idx, key=splits.class_to_idx.get)
    outputs = int(weights.model.num_classes)
    names, how = weight_class_names(options.get("class_map"), weights.classes, outputs, data_classes)
    indices = class_indices(names, outputs, data_classes, how)
    model = weights.model if indices is None else SelectLogits(weights.model, indices)
    model.to(device)

    loader = evaluation_loader(splits.val, pre, data_cfg, batch_size, device, naflex)
    trained_with = (weights.config.get("trainer") or {}).get("amp") if weights.config is not None else None
    precision = choose_precision(options.get("amp") or trained_with or "auto", device, weights.model)
    announce(precision)
    amp = precision.dtype
    start = time.perf_counter()
    limit = options.integer("limit_batches")
    batches = len(loader) if limit is None else min(limit, len(loader))
    what = f"evaluating {weights.name} on {splits.val_name}"
    shown = progress(loader, batches, what, unit="batches")
    result = evaluate(model, shown, device, amp, limit, num_classes=len(data_classes), flip=flip, shift=shift)
    seconds = time.perf_counter() - start
    confusion = result.pop("confusion")
    per_class = (confusion.diag().float() / confusion.sum(1).clamp_min(1).float() * 100).tolist()
    seen = (confusion.sum(1) > 0).tolist()  # a class with no image evaluated has no accuracy, not 0%
    result["per_class_top1"] = {
        name: round(acc, 2) for name, acc, has in zip(data_classes, per_class, seen, strict=True) if has
    }
    result["images_per_s"] = round(result["count"] / seconds, 1)
    result["precision"] = precision.name
    result["threads"], result["threads_reason"] = threads
    result["precision_reason"] = precision.reason
    result["seconds"] = round(seconds, 2)
    result.update(split=splits.val_name, data=str(data_cfg.get("name")), model=weights.name, source=weights.source)
    result["weights"] = weights.which or "the source's"
    result.update(flip=flip, shift=shift, seq_len=naflex[0] if naflex else None)
    result["preprocessing"] = pre.to_dict()
    result["classes"] = {
        "data": len(data_classes),
        "weights": outputs,
        "mapping": "identity" if indices is None else f"by name, {how}",
    }
    if weights.config is not None:
        result["checkpoint"] = weights.source
    if options.get("confusion"):
        from vit.tasks.figures import confusion_matrix_figure

        confusion_matrix_figure(confusion.numpy(), data_classes, Path(options.get("confusion")))
        result["confusion_png"] = options.get("confusion")
    return result


def summary_line(result: dict) -> str:
    pre = result["preprocessing"]
    views = (", flip" if result["flip"] else "") + (f", shift {result['shift']}" if result.get("shift") else "")
    views += f", each image at its own shape in at most {result['seq_len']} patches" if result.get("seq_len") else ""
    return (
        f"{result['model']} ({result['source']}, weights: {result['weights']}) on {result['data']} "
        f"{result['split']}, {result['count']:,} images: "
        f"top-1 {result['top1']:.2f}%, top-5 {result['top5']:.2f}%, loss {result['loss']:.4f}, "
        f"{result['images_per_s']:,.0f} img/s in {result['precision']} on {result['threads']} "
        f"thread{'s' * (result['threads'] != 1)}{views}; "
        f"preprocessing: {pre['origin']} "
        f"(resize {pre['resize']} {pre['interpolation']}, crop {pre['img_size']})"
    )


def main(argv: list[str]) -> int:
    out = parse_args(argv, KEYS, model_keys=True, data_keys=True).get("json")
    if out and not Path(out).resolve().parent.is_dir():
        raise UsageError(f"json={out}: the folder {str(Path(out).resolve().parent)!r} does not exist")
    result = evaluate_weights(argv)
    text = json.dumps(result, indent=2)
    if out:
        try:
            Path(out).write_text(text + "\n")
        except OSError as err:
            raise UsageError(f"json={out}: cannot write it: {err.strerror or err}") from err
    print(text)
    print(summary_line(result), file=sys.stderr)
    return 0


def cli(argv: list[str] | None = None) -> int:
    """`vit-eval ...`: exit code 0, or 2 with one line for a bad setting."""
    return run_script(main, argv, usage=with_ema_rule(__doc__), keys=keys_help(KEYS, model_keys=True, data_keys=True))


def console() -> None:
    """`vit-eval`."""
    sys.exit(cli())
