"""Top-5 predictions of a trained model with class names and probabilities.

    python scripts/predict.py checkpoint=<path> image=<file or dir> [json=<path> | json=-] [top=5] [ema=false]

Prints one line per image; `json=<path>` also writes them as JSON, `json=-` prints the JSON instead of the lines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from vit.analysis.inputs import UsageError, load_images, load_model, parse_args, run_script


def main(argv: list[str]) -> int:
    args = parse_args(
        argv, {"checkpoint": None, "image": None, "json": None, "top": "5", "ema": "false"}, ("checkpoint", "image")
    )
    if not args["top"].isdigit() or int(args["top"]) < 1:
        raise UsageError(f"top={args['top']!r} must be a positive integer")
    model, config, classes = load_model(args["checkpoint"], use_ema=args["ema"].lower() == "true")
    names = sorted(classes, key=classes.get) if classes else [str(i) for i in range(model.num_classes)]
    paths, images = load_images(args["image"], config)  # (B, 3, H, W), the validation transform
    with torch.no_grad():
        probs = torch.cat([model(chunk).softmax(dim=-1) for chunk in images.split(64)])  # (B, classes)
    top = probs.topk(min(int(args["top"]), probs.shape[-1]), dim=-1)  # values, indices: (B, k)
    results = []
    for path, values, indices in zip(paths, top.values, top.indices, strict=True):
        preds = [
            {"class": names[i], "index": int(i), "prob": round(float(p), 4)}
            for p, i in zip(values, indices, strict=True)
        ]
        results.append({"image": str(path), "top": preds})
        if args["json"] != "-":
            print(path.name + ": " + ", ".join(f"{p['class']} {100 * p['prob']:.1f}%" for p in preds))
    if args["json"] == "-":
        print(json.dumps(results, indent=2))
    elif args["json"]:
        Path(args["json"]).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
