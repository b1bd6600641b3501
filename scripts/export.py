"""Export a trained model to ONNX, TorchScript or a torch.export program: `vit-export` from a checkout, without
installing (usage: python scripts/export.py --help; the tool is vit/cli/export.py)."""

from vit.cli.export import console

if __name__ == "__main__":
    console()
