"""Top-5 predictions of a trained model with class names and probabilities, or the images' features.

usage: vit-predict checkpoint=<path> image=<file, folder or a.jpg,b.png> [json=<path> | json=-]
    [top=5 | features=true] [ema=auto|true|false] [amp=auto|bf16|fp16|none] [seq_len=<tokens>]
       vit-predict model=<name> model.pretrained=<timm:name | file> [model.pretrained_file=<file>]
    [model.<key>=...] [preprocess=timm:<name>|data] [data=<config>] [data.<key>=...] image=<...> ...

`checkpoint` is a checkpoint of the trainer (best.pt, last.pt) or an exported ONNX file (best.onnx, with the
best.onnx.json that vit-export writes beside it); an ONNX file runs through onnxruntime with the
preprocessing and class names of its side JSON, without the model code. Prints one line per image;
`json=<path>` also writes them as JSON, `json=-` prints the JSON instead of the lines. A checkpoint's model runs
in the precision `amp` gives it on this CPU (default: its run's trainer.amp; auto: bf16 where the CPU has it
natively and the model is wide enough to gain, else fp32; vit/runtime/device.py); it is said (a warning on
stderr) only where an `amp` given on the command cannot run on this CPU and another precision runs instead.

A classifier the weights did not train (weights without one, an encoder released for pretraining; a head of
another class count than `model.num_classes`) is freshly initialised and would name random classes: predicting
classes with it is refused in one line (exit code 2). `features=true` prints each image's pooled features instead,
the embedding the head reads (forward_head(pre_logits=True): the cls token or the pool, after the final norm), a
line `<image>: <C numbers>` each, or "features" in the JSON; it takes any weights, with or without a trained head.

Weights: {ema_rule} Here: one line on stderr, and "weights" in each JSON record (an ONNX file: the weights its
side JSON says it was exported from).

Images at their own shapes: `seq_len=<n>` keeps each image whole (no crop) and resizes it, its aspect ratio kept, to
at most n patches (each side a whole number of patches), then runs the images as NaFlex batches (vit/naflex.py:
each on its own grid, padding masked). Any ViT with the standard patch embedding takes them (a NaFlex-trained run's,
timm's NaFlexVit models); `seq_len=64` is a 32 px square image in 4 px patches, a 64 x 32 px one at 8 x 4 patches.
An ONNX file exported with `seq_len=<n>` (vit-export) takes its images so, at its own n: `seq_len=` may be left out,
and another n is refused.

Foreign weights, as evaluate and export take them: `model=<name> model.pretrained=timm:<name>` builds timm's
architecture of that name (DINOv2, SigLIP, CLIP, EVA-02 ...), with `model.pretrained_file=<file>` holding its
weights offline, or `model.pretrained=<file>` for a state-dict file; the preprocessing is timm's config of those
weights (a `timm:` source) or the data config's (`preprocess=` chooses), and the class names are the weights' own
where they carry them, else the output indices.

Example:

    vit-predict checkpoint=outputs/<date>/<time>/checkpoints/best.pt image=cifar10/test/cat top=3
    vit-predict model=vit_base model.pretrained=timm:vit_base_patch14_reg4_dinov2.lvd142m \
        model.pretrained_file=dinov2_vitb14_reg4.safetensors image=photos/ features=true json=features.json
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch

from vit.analysis.inputs import image_paths
from vit.cli.args import Key, keys_help, parse_args, run_script
from vit.cli.tool_keys import AMP, DATA, EMA, MODEL, PREPROCESS, SEQ_LEN
from vit.deploy.loaded_model import ema_option, with_ema_rule
from vit.deploy.preprocessing import naflex_patch_size
from vit.errors import UsageError
from vit.models.naflex_tokens import naflex_features
from vit.naflex import pack
from vit.runtime.device import Precision, choose_precision
from vit.settings.trainer import AMP_MODES

log = logging.getLogger("vit.cli.predict")


def cpu_precision(amp: str | None, default: str, model) -> Precision:
    """The precision the model runs in on this CPU: `amp` given on the command, else `default` (the run's
    trainer.amp), by the trainer's rule. Said only where an amp= given on this command cannot run and something
    else runs instead (a warning on stderr); otherwise a debug log line: the output is the predictions alone."""
    precision = choose_precision(amp or default, torch.device("cpu"), model)
    if amp is not None and precision.substituted:
        print("warning: " + precision.describe(), file=sys.stderr)
    else:
        log.debug(precision.describe())
    return precision


def onnx_probabilities(checkpoint: str, spec: list[str], options) -> tuple[list[Path], np.ndarray, list[str], str]:
    """(image paths, (B, classes) probabilities, class names, the weights it was exported from) of an exported ONNX
    file, through onnxruntime with its side JSON's preprocessing."""
    # The file holds one set of weights in one precision, chosen when it was exported (its side JSON names the
    # weights); a choice here could not be honoured.
    if options.get("amp") is not None:
        raise UsageError(f"amp={options['amp']}: an ONNX file runs in the precision it was exported in; leave amp out")
    if ema_option(options.get("ema")) is not None:
        raise UsageError(f"ema={options['ema']}: an ONNX file holds the weights it was exported with; leave ema out")
    from vit.deploy.export import ExportError, require_export_extra
    from vit.deploy.runtime import OnnxClassifier

    try:
        require_export_extra()
    except ExportError as err:
        raise UsageError(str(err).replace("format=onnx", f"checkpoint={checkpoint}")) from None
    paths = [p for part in spec for p in image_paths(part)]
    classifier = OnnxClassifier(checkpoint)
    seq_len = options.get("seq_len")
    if seq_len is not None and str(seq_len) != str(classifier.seq_len):
        what = f"takes NaFlex batches of {classifier.seq_len} tokens" if classifier.seq_len else "takes square images"
        raise UsageError(f"seq_len={seq_len}: {checkpoint} {what} (as exported); leave seq_len out")
    probs = classifier.predict_proba(paths)
    names = classifier.classes or [str(i) for i in range(probs.shape[-1])]
    return paths, probs, names, str(classifier.meta.get("weights") or "not recorded")


@contextlib.contextmanager
def head_said_here():
    """vit/weights/fit.py's own line about a classifier it initialised ("classifier: ... head initialised") left out
    while the weights are read: this tool says it itself, in its refusal to name classes with that head (one line)
    or not at all with features=true, which does not use the head."""
    fit_log = logging.getLogger("vit.weights.fit")

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("classifier:")

    fit_log.addFilter(keep)
    try:
        yield
    finally:
        fit_log.removeFilter(keep)


def model_outputs(options, spec: list[str], features: bool) -> tuple[list[Path], np.ndarray, list[str], str]:
    """(image paths, (B, classes) probabilities or with `features` the pooled (B, C) features, class names, the
    weights read) of a checkpoint of ours or foreign weights (model= with model.pretrained=), built, chosen
    (EMA_RULE) and preprocessed as vit-eval and vit-export build them (vit/deploy/loaded_model.py's `resolve`). The
    model runs in the precision `amp` (default: its run's trainer.amp, auto for foreign weights) gives it on this CPU,
    by the trainer's rule. Classes from a classifier the weights did not train are refused in one line, before any
    image is read."""
    from vit.data.images import read_rgb
    from vit.deploy.loaded_model import WeightsError, resolve

    amp = options.get("amp")
    if amp is not None and amp not in AMP_MODES:
        raise UsageError(f"amp={amp!r} must be one of {AMP_MODES}")
    with head_said_here():
        weights, pre, _ = resolve(options)
    if weights.untrained_head and not features:
        # A fresh head's softmax names classes with confident-looking but random probabilities: no answer at all.
        key = "checkpoint" if options.get("checkpoint") else "model.pretrained"
        raise WeightsError(
            f"{key}={weights.source}: {weights.untrained_head}: give weights whose classifier was trained "
            "(fine-tune on your classes first), or add features=true for the pooled image features"
        )
    model = weights.model
    patch = naflex_patch_size(model, options.get("seq_len"))
    transform = pre.transform() if patch is None else pre.naflex_transform(int(options["seq_len"]), patch)
    names = weights.classes or [str(i) for i in range(int(model.num_classes))]
    paths = [p for part in spec for p in image_paths(part)]
    images = [transform(read_rgb(path)) for path in paths]  # (3, H, W) each; with seq_len, each its own H, W
    trained_with = (weights.config.get("trainer") or {}).get("amp") if weights.config is not None else None
    precision = cpu_precision(amp, trained_with or "auto", model)

    def answer(chunk: list[torch.Tensor]) -> torch.Tensor:
        batch = torch.stack(chunk) if patch is None else pack(chunk, (patch, patch))  # (B, 3, H, W) or NaFlex
        if not features:
            return model(batch).float().softmax(dim=-1)  # (B, classes)
        # the embedding the head would read: (B, C), before the classifier
        if patch is None:
            return model.forward_head(model.forward_features(batch), pre_logits=True).float()
        tokens, valid = naflex_features(model, batch)
        return model.forward_head(tokens, pre_logits=True, valid=valid).float()

    with torch.no_grad(), precision.autocast(torch.device("cpu")):
        chunks = [answer(images[i : i + 64]) for i in range(0, len(images), 64)]
    return paths, torch.cat(chunks).numpy(), names, f"{weights.which} ({weights.source})"


KEYS = {
    "checkpoint": Key("a checkpoint of this trainer, or an ONNX file vit-export wrote", kind="path"),
    "image": Key("the images: files or folders", several=True),
    "json": Key("also write the predictions as JSON to this file; - prints the JSON instead of the lines"),
    "top": Key("classes a line (default: 5)", kind="int", low=1),
    "features": Key("print each image's pooled features instead of classes", kind="flag"),
    "ema": EMA,
    "amp": AMP,
    "seq_len": SEQ_LEN,
    # with model.pretrained=: as vit-eval takes them
    "model": MODEL,
    "preprocess": PREPROCESS,
    "data": DATA,
}
TOP = 5  # classes a line, unless top= says


def main(argv: list[str]) -> int:
    args = parse_args(argv, KEYS, ("image",), model_keys=True, data_keys=True)
    features = args.flag("features")
    if features and args["top"] is not None:
        raise UsageError(f"top={args['top']} ranks classes, and features=true prints features: leave one out")
    top = TOP if args["top"] is None else int(args["top"])
    ema_option(args["ema"])  # a bad value named before any file is read
    checkpoint = args.get("checkpoint")
    if args.source is None:
        if not checkpoint:
            raise UsageError("checkpoint=<...> is required (or model=<name> model.pretrained=<timm:name | file>)")
        if args["model"] or args.model_edits or args.data or args["preprocess"] or args["data"]:
            raise UsageError("model=, model.<key>=, data and preprocess= go with model.pretrained=, not checkpoint=")
    if args.source is None and checkpoint.endswith(".onnx"):
        if features:
            raise UsageError(
                f"features=true: {checkpoint} computes the logits only; give the checkpoint it was exported from"
            )
        paths, outputs, names, which = onnx_probabilities(checkpoint, args["image"], args)
    else:
        paths, outputs, names, which = model_outputs(args, args["image"], features)
    # Which weights answered (EMA_RULE), once on stderr: stdout holds the predictions alone.
    print(f"weights: {which}", file=sys.stderr)
    results = (feature_records if features else class_records)(paths, outputs, names, which, top, args["json"])
    if args["json"] == "-":
        print(json.dumps(results, indent=2))
    elif args["json"]:
        Path(args["json"]).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def class_records(paths, probs: np.ndarray, names: list[str], which: str, top: int, json_out: str | None) -> list:
    """The `top` classes of each image as JSON records, each printed as a line unless json=- (JSON only)."""
    k = min(top, probs.shape[-1])
    order = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # (B, k), most probable first
    results = []
    for path, row, indices in zip(paths, probs, order, strict=True):
        preds = [{"class": names[i], "index": int(i), "prob": round(float(row[i]), 4)} for i in indices]
        results.append({"image": str(path), "weights": which, "top": preds})
        if json_out != "-":
            # the path as found (cat/0000.jpg and ship/0000.jpg are different images)
            print(f"{path}: " + ", ".join(f"{p['class']} {100 * p['prob']:.1f}%" for p in preds))
    return results


def feature_records(paths, features: np.ndarray, names, which: str, top, json_out: str | None) -> list:
    """Each image's pooled features (C numbers) as JSON records, each printed as a line `<path>: <C numbers>`
    unless json=- (JSON only)."""
    results = []
    for path, row in zip(paths, features, strict=True):
        results.append({"image": str(path), "weights": which, "features": [round(float(v), 6) for v in row]})
        if json_out != "-":
            print(f"{path}: " + " ".join(f"{float(v):.6g}" for v in row))
    return results


def console() -> None:
    """`vit-predict`."""
    sys.exit(run_script(main, usage=with_ema_rule(__doc__), keys=keys_help(KEYS, model_keys=True, data_keys=True)))
