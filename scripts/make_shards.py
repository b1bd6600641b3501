"""Write an image-folder tree or archive as tar shards for data=webdataset: `vit-shards` from a checkout, without
installing (usage: python scripts/make_shards.py --help; the tool is vit/cli/shards.py)."""

from vit.cli.shards import console

if __name__ == "__main__":
    console()
