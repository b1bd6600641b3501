"""Masked-autoencoder pretraining (task=mae; vit/models/mae.py, docs/MAE.md): no labels are read, the model is the
masked autoencoder around the configured encoder, the loss and the score are the reconstruction's."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import nn

from vit.errors import require
from vit.runtime.distributed import Distributed
from vit.settings import MaeSettings
from vit.tasks.base import Task


class MaskedAutoencoder(Task):
    name = "mae"
    score = "val_loss"  # no top-1 without labels
    classifier = False
    reconstructs = True

    def check(self, cfg) -> None:
        """The mae.* settings, and every setting that acts on labels, a head or whole-image attention, refused by
        name rather than ignored."""
        mae = cfg.get("mae")
        require(mae is not None, "task=mae needs the mae.* settings: select it with task=mae (configs/task/mae.yaml)")
        mae = MaeSettings.of(mae)  # every key's type and range: vit/settings/mae.py
        require(
            mae.decoder_embed_dim % mae.decoder_num_heads == 0,
            f"mae.decoder_num_heads={mae.decoder_num_heads} must divide mae.decoder_embed_dim={mae.decoder_embed_dim}",
        )
        model, augment = cfg.model, cfg.data.get("augment") or {}
        name = str(model.get("name"))
        require(
            not name.startswith("t2t"),
            f"task=mae: model.name={name!r} is a T2T-ViT, whose soft split has no patches to hide; use a ViT config",
        )
        pos = model.get("pos_embed")
        require(
            pos in ("sincos2d", "learned", "sinusoidal"),
            f"task=mae: model.pos_embed={pos!r} is not supported: the masked encoder adds a position table to the "
            "patches it keeps (sincos2d, learned or sinusoidal)",
        )
        require(
            model.get("global_pool", "token") == "token",
            f"task=mae: model.global_pool={model.get('global_pool')!r}: the pretrained encoder ends in its norm and "
            "has no head; choose the pooling when fine-tuning",
        )
        for key in ("mixup_alpha", "cutmix_alpha", "label_smoothing"):
            value = augment.get(key) or 0.0
            require(float(value) == 0.0, f"task=mae reads no labels: data.augment.{key}={value} must be 0")
        dcfg = cfg.get("distill") or {}
        require(
            dcfg.get("type", "none") == "none",
            f"task=mae has no classifier to distil: distill.type={dcfg.get('type')}",
        )
        require(
            not cfg.trainer.get("eval_flip"), "task=mae evaluates the reconstruction: trainer.eval_flip=true is unused"
        )
        shift = cfg.trainer.get("eval_shift") or 0
        require(shift == 0, f"task=mae evaluates the reconstruction: trainer.eval_shift={shift} is unused")
        attn_every = cfg.trainer.get("attn_maps_every_n_epochs") or 0
        require(
            int(attn_every) == 0,
            f"task=mae: trainer.attn_maps_every_n_epochs={attn_every} must be 0 (the masked encoder has no "
            "whole-image attention to draw; trainer.recon_images_every_n_epochs draws its reconstructions)",
        )
        resize = cfg.trainer.get("progressive_resize") or {}
        require(
            resize.get("min_size") is None,
            "task=mae: trainer.progressive_resize is not supported (the decoder's table is built for one size)",
        )

    def build_model(self, cfg: Mapping, num_classes: int | None, **kwargs) -> nn.Module:
        """The masked autoencoder around the encoder cfg.model describes; no head, so no class count."""
        from vit.tasks.build import build_mae_from_config

        return build_mae_from_config(cfg["model"], cfg["mae"])

    def loss(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor, criterion: Callable):
        return model(images)[0]  # (loss, pred, mask): the loss on the hidden patches; no label is read

    def evaluate(
        self,
        model: nn.Module,
        loader: Iterable,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        limit_batches: int | None,
        dist: Distributed,
        flip: bool,
        shift: int = 0,
    ) -> dict:
        """The reconstruction loss on fixed masks (the same hidden patches every evaluation)."""
        from vit.tasks.evaluation import evaluate_reconstruction

        return evaluate_reconstruction(model, loader, device, amp_dtype, limit_batches, dist=dist)
