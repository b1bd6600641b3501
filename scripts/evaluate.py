"""Evaluate a checkpoint: `python scripts/evaluate.py checkpoint=<path> [data.root=...] [confusion=cm.png]`."""

import sys

from vit.train.evaluate import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
