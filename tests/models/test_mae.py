"""The masked autoencoder (vit/models/mae.py): masking, the loss on hidden patches, the fixed 2D tables, the
encoder's weights into a classifier, and (with a checkout of the official MAE code) the official numbers."""

import os
from functools import partial

import numpy as np
import pytest
import torch
from torch import nn
from trainer_utils import reference_code

from vit.models import create_model
from vit.models.mae import MAEConfig, MaskedAutoencoder
from vit.models.pos_embed import sincos_2d_table
from vit.weights.read import load_pretrained

SMALL = {
    "img_size": 32,
    "patch_size": 4,
    "embed_dim": 64,
    "depth": 2,
    "num_heads": 4,
    "decoder_embed_dim": 32,
    "decoder_depth": 2,
    "decoder_num_heads": 4,
}


def test_masking_keeps_an_exact_count_differing_per_sample_and_ids_restore_inverts_it():
    torch.manual_seed(0)
    tokens = torch.randn(5, 64, 8)
    kept, mask, ids_restore = MaskedAutoencoder.random_masking(tokens, 0.75)
    assert kept.shape == (5, 16, 8) and torch.equal(mask.sum(dim=1), torch.full((5,), 48.0))
    assert len({tuple(m.tolist()) for m in mask}) == 5  # every sample hides its own patches
    visible = [torch.nonzero(m == 0).flatten() for m in mask]
    for b in range(5):  # the kept tokens are exactly the visible ones (in shuffled order)
        assert sorted(kept[b].sum(-1).tolist()) == sorted(tokens[b, visible[b]].sum(-1).tolist())
    shuffled = torch.cat([kept, torch.zeros(5, 48, 8)], dim=1)  # visible ones first, as the decoder lays them out
    restored = shuffled.gather(1, ids_restore.unsqueeze(-1).expand(-1, -1, 8))
    assert torch.equal(restored[mask == 0], tokens[mask == 0])  # ids_restore puts each kept token back in place


def test_the_loss_reads_the_hidden_patches_only():
    torch.manual_seed(0)
    model = MaskedAutoencoder(MAEConfig(**SMALL, norm_pix_loss=True))
    images = torch.randn(2, 3, 32, 32)
    noise = torch.rand(2, 64)
    loss, pred, mask = model(images, noise=noise)
    assert pred.shape == (2, 64, 48) and mask.shape == (2, 64) and mask.sum() == 2 * 48
    changed = pred.clone()
    changed[mask == 0] += 100.0  # a visible patch's prediction is not part of the loss
    assert model.reconstruction_loss(images, changed, mask).item() == pytest.approx(loss.item())
    changed[mask == 1] += 1.0
    assert model.reconstruction_loss(images, changed, mask).item() != pytest.approx(loss.item())
    assert torch.equal(model.unpatchify(model.patchify(images)), images)


def test_the_2d_table_encodes_the_column_then_the_row():
    table = sincos_2d_table((3, 5), 16, num_prefix=1)[0]  # (1 + 15, 16)
    assert torch.equal(table[0], torch.zeros(16))
    grid = table[1:].reshape(3, 5, 16)
    assert torch.equal(grid[0, :, :8], grid[2, :, :8])  # the first half: the column, the same down a column
    assert torch.equal(grid[:, 0, 8:], grid[:, 4, 8:])  # the second half: the row, the same along a row
    assert grid[0, 1, 0].item() == pytest.approx(np.sin(1.0))  # sin(x · 10000^0) at column 1


def test_the_encoder_fine_tunes_in_a_classifier_without_the_decoder(tmp_path):
    torch.manual_seed(0)
    mae = MaskedAutoencoder(MAEConfig(**SMALL))
    path = tmp_path / "mae.pth"
    torch.save({"model": mae.state_dict()}, path)  # the official release files' layout
    encoder = {k: v for k, v in SMALL.items() if not k.startswith("decoder")}
    classifier = create_model("vit_tiny", **encoder, num_classes=10)
    load_pretrained(classifier, str(path))
    torch.testing.assert_close(classifier.blocks[1].attn.qkv.weight, mae.blocks[1].attn.qkv.weight)
    torch.testing.assert_close(classifier.pos_embed, mae.pos_embed)  # the fixed table, now a learned start


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"mask_ratio": 1.0}, "mask_ratio=1.0 must be in (0, 1)"),
        ({"decoder_num_heads": 5}, "decoder_num_heads=5 must be a positive divisor of decoder_embed_dim=32"),
        ({"reg_tokens": 4}, "keeps the cls token and nothing else"),
        ({"patch_embed": "conv"}, "hides p x p patches"),
    ],
)
def test_settings_it_cannot_take_are_named(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        MaskedAutoencoder(MAEConfig(**{**SMALL, **kwargs}))


OFFICIAL = os.environ.get("VIT_MAE_OFFICIAL")


@pytest.mark.skipif(not OFFICIAL, reason="VIT_MAE_OFFICIAL (a checkout of facebookresearch/mae) is not set")
@pytest.mark.parametrize("norm_pix_loss", [False, True])
def test_same_numbers_as_the_official_code(norm_pix_loss, monkeypatch):
    """The official MaskedAutoencoderViT with its own weights and the same masking noise: our loss, reconstruction,
    mask and gradients. Shims for today's libraries: its util/pos_embed.py uses np.float (gone from NumPy), and
    its Block(..., qk_scale=None) call is refused by timm >= 0.9, so the argument is dropped."""
    import timm.models.vision_transformer as timm_vit

    monkeypatch.setattr(np, "float", float, raising=False)
    with reference_code(OFFICIAL):
        import models_mae

        monkeypatch.setattr(models_mae, "Block", lambda *a, qk_scale=None, **k: timm_vit.Block(*a, **k))
        torch.manual_seed(0)
        theirs = models_mae.MaskedAutoencoderViT(
            **SMALL, mlp_ratio=4.0, norm_layer=partial(nn.LayerNorm, eps=1e-6), norm_pix_loss=norm_pix_loss
        )
    ours = MaskedAutoencoder(MAEConfig(**SMALL, norm_pix_loss=norm_pix_loss))
    state = theirs.state_dict()
    torch.testing.assert_close(ours.pos_embed, state["pos_embed"], atol=1e-6, rtol=0)  # the same fixed tables
    torch.testing.assert_close(ours.decoder_pos_embed, state["decoder_pos_embed"], atol=1e-6, rtol=0)
    ours.load_state_dict(state, strict=True)
    images = torch.randn(3, 3, 32, 32)
    outputs = []
    for model in (theirs, ours):
        torch.manual_seed(5)  # the same masking noise: both draw torch.rand(B, N) once
        outputs.append(model(images))
        outputs[-1][0].backward()
    (loss_t, pred_t, mask_t), (loss_o, pred_o, mask_o) = outputs
    assert torch.equal(mask_t, mask_o)
    torch.testing.assert_close(loss_o, loss_t, atol=1e-6, rtol=0)
    torch.testing.assert_close(pred_o, pred_t, atol=1e-5, rtol=0)
    their_params = dict(theirs.named_parameters())
    for name, param in ours.named_parameters():
        if param.requires_grad:
            g_ref = their_params[name].grad
            bound = 1e-5 * max(1.0, g_ref.abs().max().item())
            assert (param.grad - g_ref).abs().max().item() <= bound, name


def test_the_encoder_fine_tunes_with_average_pooling_as_the_paper_does(tmp_path):
    """MAE's fine-tuning pools the image tokens and normalises after the pooling: the encoder's `norm` is left out
    and the classifier's own `fc_norm` starts fresh (ones and zeros)."""
    torch.manual_seed(0)
    mae = MaskedAutoencoder(MAEConfig(**SMALL))
    with torch.no_grad():
        mae.norm.weight.add_(0.5)
    encoder = {k: v for k, v in SMALL.items() if not k.startswith("decoder")}
    classifier = create_model("vit_tiny", **encoder, num_classes=10, global_pool="avg")
    load_pretrained(classifier, mae.state_dict())
    assert torch.equal(classifier.fc_norm.weight, torch.ones(64)) and isinstance(classifier.norm, nn.Identity)
    torch.testing.assert_close(classifier.blocks[0].mlp.fc1.weight, mae.blocks[0].mlp.fc1.weight)
