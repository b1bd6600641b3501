"""Average the weights of a run's kept checkpoints: `vit-average` from a checkout, without installing (usage: python
scripts/average_checkpoints.py --help; the tool is vit/cli/average.py)."""

from vit.cli.average import console

if __name__ == "__main__":
    console()
