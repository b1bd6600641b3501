"""Masked autoencoder (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners") around our ViT.

Pretraining without labels: most patches are hidden, the encoder sees only the others, and a small decoder
predicts the pixels of the hidden ones. For ViT-B/16 at 224 px (N = 196 patches, mask ratio 0.75, 49 kept):

    image                                         (B, 3, 224, 224)
    patch_embed, + pos_embed (no cls row)         (B, 196, C)
    random_masking: keep 49 per sample            (B, 49, C)       each sample its own random subset
    prepend cls (+ its pos row)                   (B, 50, C)
    encoder blocks, norm                          (B, 50, C)
    decoder_embed                                 (B, 50, C_d)
    + mask tokens, unshuffled to the patch order  (B, 197, C_d)     cls first, then every patch in place
    + decoder_pos_embed, decoder blocks, norm     (B, 197, C_d)
    decoder_pred, drop cls                        (B, 196, p·p·3)  one patch's pixels per token
    loss: mean squared error on the hidden patches only (targets normalised per patch with norm_pix_loss)

The class is a `VisionTransformer` without a head, so the encoder's parameters keep a ViT's names (`cls_token`,
`pos_embed`, `patch_embed.*`, `blocks.*`, `norm.*`) and the decoder's are those of the official code's
`MaskedAutoencoderViT` (`mask_token`, `decoder_embed`, `decoder_pos_embed`, `decoder_blocks.*`, `decoder_norm`,
`decoder_pred`): a state dict of the official code loads strictly, and the encoder part of ours loads into a ViT
classifier for fine-tuning. Both position tables are the fixed 2D sin-cos table (`pos_embed="sincos2d"`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from einops import rearrange
from torch import nn

from vit.models.layers import Block
from vit.models.norm import LayerNorm
from vit.models.pos_embed import sincos_2d_table
from vit.models.registry import model_arguments, model_entry
from vit.models.vit import VisionTransformer, ViTConfig
from vit.naflex import patchify


@dataclass(frozen=True)
class MAEConfig(ViTConfig):
    """The masked autoencoder's settings: its ViT encoder's (`ViTConfig`; the position table defaults to the fixed
    "sincos2d", there is no head) and the decoder's and the masking's."""

    pos_embed: str = "sincos2d"
    num_classes: int = field(default=0, init=False)  # no head: the decoder is the output
    # The decoder's width, blocks and heads (512, 8, 16 in the paper's ViT-B/L/H models); its MLP ratio is the
    # encoder's, as in the official code.
    decoder_embed_dim: int = 512
    decoder_depth: int = 8
    decoder_num_heads: int = 16
    mask_ratio: float = 0.75  # the share of patches hidden from the encoder
    # Targets normalised per patch (mean 0, variance 1 over its p·p·3 values), the paper's better setting.
    norm_pix_loss: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        unsupported = {k: getattr(self, k) for k in ("distill_token", "reg_tokens", "dynamic_img_size", "norm_pre")}
        if any(unsupported.values()) or self.class_token is False:
            raise ValueError(f"the masked autoencoder keeps the cls token and nothing else: {unsupported} unsupported")
        if not 0.0 < self.mask_ratio < 1.0:
            raise ValueError(f"mask_ratio={self.mask_ratio} must be in (0, 1)")
        embed_dim, heads = self.decoder_embed_dim, self.decoder_num_heads
        if embed_dim <= 0 or heads <= 0 or embed_dim % heads:
            raise ValueError(f"decoder_num_heads={heads} must be a positive divisor of decoder_embed_dim={embed_dim}")
        if self.decoder_depth <= 0:
            raise ValueError(f"decoder_depth={self.decoder_depth} must be positive")
        if self.patch_embed != "standard":
            raise ValueError(f"patch_embed={self.patch_embed!r}: the masked autoencoder hides p x p patches")


class MaskedAutoencoder(VisionTransformer):
    """MAE: the ViT encoder plus the decoder and the masked-pixel loss, every setting in `config` (`MAEConfig`)."""

    def __init__(self, config: MAEConfig) -> None:
        super().__init__(config)
        self.mask_ratio = config.mask_ratio
        self.norm_pix_loss = config.norm_pix_loss
        width = config.decoder_embed_dim  # C_d
        patch_dim = self.patch_embed.patch_size[0] * self.patch_embed.patch_size[1] * self.patch_embed.in_chans
        mlp_ratio = self.blocks[0].mlp.fc1.out_features / self.embed_dim

        self.decoder_embed = nn.Linear(self.embed_dim, width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))
        table = sincos_2d_table(self.grid_size, width, num_prefix=1)  # (1, 1 + N, C_d)
        self.decoder_pos_embed = nn.Parameter(table, requires_grad=False)
        self.decoder_blocks = nn.ModuleList(
            Block(width, config.decoder_num_heads, mlp_ratio=mlp_ratio, qkv_bias=True)
            for _ in range(config.decoder_depth)
        )
        self.decoder_norm = LayerNorm(width, eps=1e-6)
        self.decoder_pred = nn.Linear(width, patch_dim)
        self.init_weights()

    def init_weights(self) -> None:
        """The official init: Xavier-uniform Linears (and the patch projection, as a Linear), zero biases,
        normal(0.02) cls and mask tokens. Called by the encoder's constructor before the decoder exists, and
        again once it does."""
        if not hasattr(self, "decoder_pred"):
            return
        weight = self.patch_embed.proj.weight.data
        nn.init.xavier_uniform_(weight.view(weight.shape[0], -1))
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, N, p·p·C), each patch flattened as (row, column, channel), patches row-major."""
        return patchify(images, self.patch_embed.patch_size)[0]

    def unpatchify(self, patches: torch.Tensor) -> torch.Tensor:
        """(B, N, p·p·C) -> (B, C, H, W), the inverse of `patchify` on the model's grid."""
        ph, pw = self.patch_embed.patch_size
        rows, cols = self.grid_size
        return rearrange(patches, "b (h w) (p q c) -> b c (h p) (w q)", h=rows, w=cols, p=ph, q=pw)

    @staticmethod
    def random_masking(
        tokens: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keep a random int(N · (1 - mask_ratio)) of each sample's N tokens, by sorting per-sample noise.

        tokens (B, N, C) -> kept (B, N_keep, C), mask (B, N) with 1 where hidden, ids_restore (B, N): the position
        of each token in the shuffled order, so gathering by it undoes the shuffle. `noise` (B, N) in [0, 1):
        given, the same masking as any other code that sorts it (torch.rand(B, N) when not given).
        """
        batch, num, width = tokens.shape
        keep = int(num * (1 - mask_ratio))
        if noise is None:
            noise = torch.rand(batch, num, device=tokens.device)
        ids_shuffle = noise.argsort(dim=1)  # (B, N): smallest noise first, those are kept
        ids_restore = ids_shuffle.argsort(dim=1)  # (B, N): the inverse permutation
        ids_keep = ids_shuffle[:, :keep]  # (B, N_keep)
        kept = tokens.gather(1, ids_keep.unsqueeze(-1).expand(-1, -1, width))  # (B, N_keep, C)
        mask = torch.ones(batch, num, device=tokens.device)
        mask[:, :keep] = 0  # in shuffled order: the first `keep` are visible
        return kept, mask.gather(1, ids_restore), ids_restore  # mask back in the patches' order

    def forward_encoder(
        self, images: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, C, H, W) -> latent (B, 1 + N_keep, C) of the cls token and the visible patches, mask, ids_restore."""
        tokens = self.patch_embed(images) + self.pos_embed[:, 1:]  # (B, N, C): the patches' rows of the table
        tokens, mask, ids_restore = self.random_masking(tokens, mask_ratio, noise)
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(tokens.shape[0], -1, -1)  # (B, 1, C)
        x = torch.cat([cls, tokens], dim=1)  # (B, 1 + N_keep, C)
        for block in self.blocks:
            x = block(x)
        return self.norm(x), mask, ids_restore

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        """latent (B, 1 + N_keep, C) -> predicted pixels (B, N, p·p·C) for every patch."""
        x = self.decoder_embed(latent)  # (B, 1 + N_keep, C_d)
        batch, num = ids_restore.shape
        hidden = self.mask_token.expand(batch, num - (x.shape[1] - 1), -1)  # (B, N - N_keep, C_d)
        patches = torch.cat([x[:, 1:], hidden], dim=1)  # (B, N, C_d) in shuffled order
        patches = patches.gather(1, ids_restore.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # the patches' order
        x = torch.cat([x[:, :1], patches], dim=1) + self.decoder_pos_embed  # (B, 1 + N, C_d)
        for block in self.decoder_blocks:
            x = block(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]  # (B, N, p·p·C): the cls token dropped

    def reconstruction_loss(self, images: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean squared error per patch, averaged over the hidden patches only (mask 1)."""
        target = self.patchify(images)  # (B, N, p·p·C)
        if self.norm_pix_loss:
            mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1e-6) ** 0.5
        per_patch = (pred - target).pow(2).mean(dim=-1)  # (B, N)
        return (per_patch * mask).sum() / mask.sum()

    def forward(
        self, images: torch.Tensor, mask_ratio: float | None = None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, pred (B, N, p·p·C), mask (B, N)) as the official code returns them."""
        ratio = self.mask_ratio if mask_ratio is None else mask_ratio
        latent, mask, ids_restore = self.forward_encoder(images, ratio, noise)
        pred = self.forward_decoder(latent, ids_restore)
        return self.reconstruction_loss(images, pred, mask), pred, mask


def create_mae(name: str, decoder: dict, **encoder_overrides) -> MaskedAutoencoder:
    """A masked autoencoder whose encoder is the registered ViT `name` with `encoder_overrides` (as
    `create_model(name, ...)` would build it), and `decoder` its decoder and masking settings
    (`decoder_embed_dim`, `decoder_depth`, `decoder_num_heads`, `mask_ratio`, `norm_pix_loss`)."""
    if not issubclass(model_entry(name).model, VisionTransformer):
        raise ValueError(f"name={name!r} is not a ViT: the masked autoencoder hides patches of a plain ViT encoder")
    encoder = model_arguments(name, **encoder_overrides)
    encoder.pop("num_classes", None)  # no head: the decoder is the output
    return MaskedAutoencoder(MAEConfig(**decoder, **encoder))
