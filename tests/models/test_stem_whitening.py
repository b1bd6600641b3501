"""Patch whitening of the convolutional stem's first convolution (`model.stem_whitening`, `ConvStemEmbed.whiten`).

The expected values come from numpy: patches cut out by slicing, their second moments, `numpy.linalg.eigh`."""

import logging

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from trainer_utils import compose_config

from vit.errors import ConfigError
from vit.models.patch_embed import ConvStemEmbed
from vit.runtime.distributed import Distributed
from vit.tasks.build import build_model_from_config
from vit.train.setup import whiten_stem


def correlated_images(count: int, size: int = 12, seed: int = 0) -> torch.Tensor:
    """(count, 3, size, size): smooth, channel-correlated images, so the patch moments are far from the identity."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(count, 1, size + 2, size + 2, generator=g)
    smooth = (noise[..., :-2, :-2] + noise[..., 1:-1, 1:-1] + noise[..., 2:, 2:]) / 3  # (count, 1, size, size)
    channel_mix = torch.tensor([1.0, 0.8, 0.6]).view(1, 3, 1, 1)
    return smooth * channel_mix + 0.3 * torch.randn(count, 3, size, size, generator=g)


def patches_by_slicing(images: torch.Tensor, k: int = 3) -> np.ndarray:
    """Every k x k patch (stride 1), flattened in (channel, row, column) order: (M, 3 k^2)."""
    x = images.double().numpy()
    h, w = x.shape[-2:]
    rows = [x[:, :, i : i + k, j : j + k].reshape(len(x), -1) for i in range(h - k + 1) for j in range(w - k + 1)]
    return np.concatenate(rows)


def test_whitened_filters_decorrelate_the_patches_and_come_in_signed_pairs():
    embed = ConvStemEmbed(img_size=32, patch_size=4, embed_dim=144)  # first convolution: 3 -> 72 channels, 3 x 3
    before = embed.stem[0].conv.weight.detach().clone()
    images = correlated_images(40)
    assert embed.whiten(images, eps=0.0, chunk=7) == 54  # 27 filters and their negatives
    weight = embed.stem[0].conv.weight.detach().double().reshape(72, 27).numpy()
    patches = patches_by_slicing(images)
    responses = patches @ weight[:27].T  # (M, 27)
    np.testing.assert_allclose(responses.T @ responses / len(patches), np.eye(27), atol=1e-4)
    np.testing.assert_array_equal(weight[27:54], -weight[:27])
    torch.testing.assert_close(embed.stem[0].conv.weight[54:], before[54:])  # the rest keep their random start


def test_fewer_channels_than_directions_keep_the_largest_and_eps_damps_the_small():
    embed = ConvStemEmbed(img_size=32, patch_size=4, embed_dim=32)  # first convolution: 3 -> 16 channels
    images = correlated_images(40, seed=1)
    assert embed.whiten(images, eps=5e-4) == 16
    patches = patches_by_slicing(images)
    eigenvalues, eigenvectors = np.linalg.eigh(patches.T @ patches / len(patches))  # ascending
    top = eigenvectors[:, ::-1][:, :8]  # the 8 largest directions, (27, 8)
    filters = embed.stem[0].conv.weight.detach().double().reshape(16, 27).numpy()[:8]
    np.testing.assert_allclose(filters @ top @ top.T, filters, atol=1e-6)  # they span the top 8 directions
    variances = ((patches @ filters.T) ** 2).mean(0)  # lambda / (lambda + eps), largest first
    expected = eigenvalues[::-1][:8] / (eigenvalues[::-1][:8] + 5e-4)
    np.testing.assert_allclose(variances, expected, rtol=1e-5)


def test_the_trainer_whitens_from_its_first_training_images_unless_weights_come_from_elsewhere(caplog):
    cfg = compose_config(["model.patch_embed=conv", "model.stem_whitening=true", "model.embed_dim=48"])
    model = build_model_from_config(OmegaConf.merge(cfg.model, {"depth": 1, "num_heads": 3}), num_classes=10)
    loader = [(correlated_images(30, size=32, seed=s), torch.zeros(30, dtype=torch.long)) for s in range(4)]
    reference = ConvStemEmbed(img_size=32, patch_size=4, embed_dim=48)
    reference.whiten(torch.cat([images for images, _ in loader])[:100])
    untouched = model.patch_embed.stem[0].conv.weight.detach().clone()
    with caplog.at_level(logging.INFO, logger="vit.train"):
        whiten_stem(model, loader, Distributed(), "model.pretrained", images=100)
    torch.testing.assert_close(model.patch_embed.stem[0].conv.weight, untouched)
    assert "model.stem_whitening: not applied, the weights come from model.pretrained" in caplog.text
    with caplog.at_level(logging.INFO, logger="vit.train"):
        whiten_stem(model, loader, Distributed(), None, images=100)
    torch.testing.assert_close(model.patch_embed.stem[0].conv.weight[:24], reference.stem[0].conv.weight[:24])
    assert "whitening of 100 training images' 3x3 patches (24 of its 24 channels)" in caplog.text
    images, labels = loader[0]
    torch.nn.functional.cross_entropy(model(images), labels).backward()  # the whitened filters train on
    assert model.patch_embed.stem[0].conv.weight.grad[:24].abs().amin(dim=(1, 2, 3)).gt(0).all()


def test_whitening_is_a_choice_of_the_conv_stem_only():
    with pytest.raises(ConfigError, match=r"^model\.stem_whitening=true is for patch_embed=conv, not 'standard'$"):
        build_model_from_config(compose_config(["model.stem_whitening=true"]).model)
    with pytest.raises(ConfigError, match=r"^model\.stem_whitening='maybe' must be true or false$"):
        build_model_from_config(compose_config(["model.patch_embed=conv", "model.stem_whitening=maybe"]).model)
