"""Real data: a small ViT trained on CPU on a few thousand CIFAR-10 JPEGs beats chance (10%) by far.

Runs when VIT_CIFAR10_ARCHIVE names the CIFAR-10 archive in ImageNet-style folders (`.ci/run` sets it to
../shared/data/cifar10-jpeg.tar.gz when that exists).
"""

import os

import pytest
from trainer_utils import compose_config

from vit.train import run

ARCHIVE = os.environ.get("VIT_CIFAR10_ARCHIVE")


@pytest.mark.skipif(not ARCHIVE, reason="VIT_CIFAR10_ARCHIVE is not set (CI sets it)")
def test_small_vit_learns_real_cifar10_on_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("real")
    overrides = [
        "data=imagefolder",
        f"data.root={ARCHIVE}",
        f"data.cache_dir={tmp_path_factory.getbasetemp() / 'cifar-cache'}",
        "data.img_size=32",
        "data.patch_size=4",
        "data.batch_size=128",
        "data.num_workers=2",
        "data.loader=gpu",  # decoded once into a tensor; batches augmented as tensors (here on the CPU)
        "data.limit_train_samples=5000",
        "data.limit_val_samples=1000",
        "data.augment.crop=pad",
        "data.augment.auto_augment=null",
        "data.augment.label_smoothing=0.0",
        "model.embed_dim=96",
        "model.depth=4",
        "model.num_heads=3",
        "model.mlp_ratio=2",
        "model.drop_path_rate=0.0",
        "optim.lr=2e-3",
        "sched.warmup_epochs=1",
        "trainer.epochs=8",
        "trainer.device=cpu",
        "trainer.ema=false",
        "trainer.log_every_n_steps=20",
    ]
    metrics = run(compose_config(overrides), output_dir=out / "run")
    assert metrics["final"]["val_top1"] >= 30.0, metrics["history"]
