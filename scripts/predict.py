"""Predict the classes of images with a checkpoint or an exported file: `vit-predict` from a checkout, without
installing (usage: python scripts/predict.py --help; the tool is vit/cli/predict.py)."""

from vit.cli.predict import console

if __name__ == "__main__":
    console()
