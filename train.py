"""Train a ViT or T2T-ViT: `python train.py model=vit_tiny data=cifar10 trainer.epochs=100`.

Configs live in configs/ (see README.md); everything here is in vit/train/run.py.
"""

from vit.cli.train import console

if __name__ == "__main__":
    console()
