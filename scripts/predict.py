"""Top-5 predictions of a trained model: `python scripts/predict.py checkpoint=<path> image=<file or dir>`
[json=<path>] [top=5] [ema=false]. Prints a table; `json=` also writes them as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from vit.analysis.inputs import load_images, load_model, parse_args, run_script


def main(argv: list[str]) -> int:
    args = parse_args(
        argv, {"checkpoint": None, "image": None, "json": None, "top": "5", "ema": "false"}, ("checkpoint", "image")
    )
    model, config, classes = load_model(args["checkpoint"], use_ema=args["ema"].lower() == "true")
    names = sorted(classes, key=classes.get) if classes else [str(i) for i in range(model.num_classes)]
    paths, images = load_images(args["image"], config)
    with torch.no_grad():
        probs = model(images).softmax(dim=-1)
    top = probs.topk(min(int(args["top"]), probs.shape[-1]), dim=-1)
    results = []
    for path, values, indices in zip(paths, top.values, top.indices, strict=True):
        preds = [
            {"class": names[i], "index": int(i), "prob": round(float(p), 4)}
            for p, i in zip(values, indices, strict=True)
        ]
        results.append({"image": str(path), "top": preds})
        print(path.name + ": " + ", ".join(f"{p['class']} {100 * p['prob']:.1f}%" for p in preds))
    if args["json"]:
        Path(args["json"]).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
