"""Evaluate a checkpoint of ours, or a model name with foreign weights, on a dataset (see vit/cli/evaluate.py):

    python scripts/evaluate.py checkpoint=<best.pt> [data.root=...] [ema=auto|true|false] [flip=true] [confusion=cm.png]
    python scripts/evaluate.py model=<name> model.pretrained=<timm:name | file> data=imagefolder data.root=<folder>
        [preprocess=data|timm:<name>] [class_map=imagenet|<file>] [json=<path>]

`--help` prints every option.
"""

import sys

from vit.cli.evaluate import cli

if __name__ == "__main__":
    sys.exit(cli())
