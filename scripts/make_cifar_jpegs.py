"""Write torchvision's CIFAR-10 as JPEG class folders: `vit-cifar-jpegs` from a checkout, without installing (usage:
python scripts/make_cifar_jpegs.py --help; the tool is vit/cli/cifar_jpegs.py)."""

from vit.cli.cifar_jpegs import console

if __name__ == "__main__":
    console()
