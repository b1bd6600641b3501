"""The transformer classifier every model here shares: an embedding turns the image into tokens, the rest is one path.

ViT and T2T-ViT differ only in their embedding (vit/models/vit.py: a patch embedding; vit/models/t2t.py: the
Tokens-to-Token module). An image's path through `forward`, for ViT-Ti/16 at 224 px (C = 192, N = 14 * 14 = 196):

    image                                  (B, 3, 224, 224)
    embed                                  (B, 196, C)
    prepend the cls token                  (B, 197, C)
    + pos_embed, pos_drop                  (B, 197, C)      one row per prefix token, then one per grid position
    depth x Block                          (B, 197, C)      vit/models/layers.py, attention in attention.py
    norm                                   (B, 197, C)
    pool: the cls token                    (B, C)
    head                                   (B, num_classes)

Each variant changes one step, and lives where its name says (docs/VARIANTS.md has the papers):

    step        variant (setting)                                   where
    tokens      distillation token, registers, no cls token         `prefix_tokens`; `_distilled_head`
    positions   rotary (pos_embed=rope, rope_mixed, rope_dinov3)     vit/models/rotary_positions.py, `rope`
                EVA-02's table and rotary (learned_rope)             the same, beside `pos_embed`
                factorized row and column tables (factorized)       vit/models/pos_embed.py
                NaFlex batches (images at their own shapes)          vit/models/naflex_tokens.py
    attention   qk-norm, EVA-02's biases, locality self-attention    vit/models/attention.py
    MLP         SwiGLU, QuickGELU, a norm inside (mlp, mlp_norm)     vit/models/layers.py
    head        avg, attention pool (map), CCT's sequence pool      `forward_head`; layers.py's `AttentionPool`

Parameter names are timm's (`cls_token`, `dist_token`, `reg_token`, `pos_embed`, `rope.freqs`, `blocks.N.*`,
`norm`, `fc_norm`, `head`, `head_dist`); the embedding sits under the name its model's weights use (`embed_name`:
`patch_embed` or `tokens_to_token`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.init import trunc_normal_

from vit.models.classifier_config import ClassifierConfig, attention_choice, table_kind
from vit.models.layers import AttentionPool, Block, run_blocks, to_2tuple
from vit.models.naflex_tokens import masked_mean, naflex_features
from vit.models.norm import LayerNorm
from vit.models.pos_embed import factorized_table, make_factorized, make_pos_embed, resample_pos_embed
from vit.models.rotary_positions import rotary_positions
from vit.naflex import is_naflex


class TransformerClassifier(nn.Module):
    """Embedding -> prefix tokens -> position table -> Blocks -> norm -> head. Subclasses choose the embedding.

    Args:
        embed: the embedding, (B, C_in, H, W) -> (B, N, embed_dim); it has `img_size`, `grid_size` (rows, columns of its
            tokens), `num_patches` and `input_grid(x)` (the grid of an input of another size, with a dynamic size).
        config: every other setting, `ClassifierConfig` (or a model's config built on it).
    """

    embed_name = "patch_embed"  # the attribute (and state-dict prefix) of the embedding: timm's by default

    def __init__(self, embed: nn.Module, config: ClassifierConfig) -> None:
        super().__init__()
        self.config = config
        embed_dim, pos_embed = config.embed_dim, config.pos_embed
        self.num_classes = config.num_classes
        self.embed_dim = self.num_features = embed_dim
        self.global_pool = config.global_pool
        self.distilled = config.distill_token
        self.num_reg_tokens = config.reg_tokens
        # The tokens before the image's: cls, dist, then the registers.
        self.num_prefix_tokens = int(config.class_token) + int(config.distill_token) + config.reg_tokens
        self.no_embed_class = config.no_embed_class
        self.norm_eps = config.norm_eps
        self.grad_checkpointing = False

        self.add_module(self.embed_name, embed)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if config.distill_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, config.reg_tokens, embed_dim)) if config.reg_tokens else None
        self.pos_embed = None
        # factorized: the row and column tables (1, rows, C) and (1, columns, C), timm's NaFlexVit names; else None
        self.pos_embed_y, self.pos_embed_x = make_factorized(pos_embed, embed.grid_size, embed_dim)
        if table_kind(pos_embed) not in (None, "factorized"):
            # One row per prefix token (none with no_embed_class), then one per token of the embedding's grid.
            prefix_rows = 0 if config.no_embed_class else self.num_prefix_tokens
            table_rows = embed.num_patches + prefix_rows
            kind = table_kind(pos_embed)
            self.pos_embed = make_pos_embed(kind, table_rows, embed_dim, embed.grid_size, prefix_rows)
        # Rotary positions: the tables each block's attention turns q and k by (vit/models/rotary_positions.py),
        # timm's `rope`; None without them. Mixed ones learn their frequencies, `rope.freqs`.
        self.rope = rotary_positions(pos_embed, embed_dim // config.num_heads, config.depth, config.num_heads,
                                     self.num_prefix_tokens, config.rope_temperature, config.rope_ref_grid)  # fmt: skip
        self.pos_drop = nn.Dropout(config.drop_rate)
        self.norm_pre = LayerNorm(embed_dim, eps=config.norm_eps) if config.norm_pre else nn.Identity()
        self.blocks = encoder_blocks(
            depth=config.depth,
            dim=embed_dim,
            num_heads=config.num_heads,
            drop_path_rate=config.drop_path_rate,
            mlp_ratio=config.mlp_ratio,
            qkv_bias=config.qkv_bias,
            qk_scale=config.qk_scale,
            proj_drop=config.drop_rate,
            attn_drop=config.attn_drop_rate,
            init_values=config.init_values,
            norm_eps=config.norm_eps,
            mlp=config.mlp,
            mlp_norm=config.mlp_norm,
            **attention_choice(config),
        )
        use_fc_norm = config.global_pool == "avg" if config.fc_norm is None else config.fc_norm
        self.norm = nn.Identity() if use_fc_norm else LayerNorm(embed_dim, eps=config.norm_eps)
        self.attn_pool = attention_pool(config) if config.global_pool == "map" else None
        # CCT's sequence pooling: one score per token, after the final norm as CCT places it.
        self.seq_pool = nn.Linear(embed_dim, 1) if config.global_pool == "seq" else None
        self.fc_norm = LayerNorm(embed_dim, eps=config.norm_eps) if use_fc_norm else nn.Identity()
        self.head = self._new_head()
        self.head_dist = self._new_head() if config.distill_token else None
        self.init_weights()

    @property
    def embed(self) -> nn.Module:
        return getattr(self, self.embed_name)

    @property
    def img_size(self) -> tuple[int, int]:
        return to_2tuple(self.embed.img_size)

    @property
    def grid_size(self) -> tuple[int, int]:
        """(rows, columns) of the embedding's tokens at `img_size`: the grid the position table is laid out on."""
        return self.embed.grid_size

    def init_weights(self) -> None:
        """timm's default ViT init: trunc-normal(0.02) Linears with zero bias, tiny cls and register tokens."""
        if self.pos_embed is not None and self.pos_embed.requires_grad:
            trunc_normal_(self.pos_embed, std=0.02)
        for table in (self.pos_embed_y, self.pos_embed_x):
            if table is not None:
                nn.init.normal_(table, std=0.02)  # timm's NaFlexVit init of its factorized tables
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                nn.init.normal_(token, std=1e-6)
        if self.dist_token is not None:
            trunc_normal_(self.dist_token, std=0.02)  # timm's VisionTransformerDistilled init
        self.apply(init_linear_trunc_normal)
        if self.attn_pool is not None:
            self.attn_pool.init_weights()

    def no_weight_decay(self) -> set[str]:
        """Parameters that weight decay would only pull towards zero for no benefit: the position table or the
        learned rotary frequencies, and the prefix tokens."""
        names = {"pos_embed", "pos_embed_y", "pos_embed_x", "cls_token", "dist_token", "reg_token", "rope.freqs"}
        names.add("attn_pool.latent")
        return {n for n, _ in self.named_parameters() if n in names}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them (timm's method name).

        Only the (B, N, C) input of every block is kept; a training step costs about one more forward pass
        (docs/BENCHMARKS.md). Active in training with gradients only. An embedding with blocks of its own (the
        T2T module) has a `grad_checkpointing` switch too, and is told the same."""
        self.grad_checkpointing = enable
        if hasattr(self.embed, "grad_checkpointing"):
            self.embed.grad_checkpointing = enable

    def _new_head(self) -> nn.Module:
        return nn.Linear(self.embed_dim, self.num_classes) if self.num_classes > 0 else nn.Identity()

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.head = self._new_head()
        if self.distilled:
            self.head_dist = self._new_head()
        for head in (self.head, self.head_dist):
            if head is not None:
                init_linear_trunc_normal(head)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C_in, H, W) -> all tokens after the last block and norm, (B, P + N, C) with P prefix tokens
        (the cls token first). A NaFlex batch (vit/naflex.py) takes naflex_tokens.py's `naflex_features`."""
        tokens = self.embed(x)  # (B, N, C): the patch tokens; the input's shape is checked there
        grid = self.embed.input_grid(x)  # (rows, columns) of those N tokens
        x = self.with_prefix_and_positions(tokens, grid)  # (B, P + N, C): the cls token, positions added
        x = self.norm_pre(self.pos_drop(x))  # norm_pre: CLIP's LayerNorm before the blocks (else the identity)
        checkpointed = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        ropes = None if self.rope is None else self.rope(grid, x.device)  # one rotary table per block, or none
        x = run_blocks(self.blocks, x, checkpointed, ropes)  # (B, P + N, C)
        return self.norm(x)

    def with_prefix_and_positions(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """The prefix tokens (cls, distillation, registers) in front of the patch tokens (B, N, C), and the position
        table added: over every token, over the patch tokens only (`no_embed_class`), or not at all where rotary
        positions rotate q and k inside the attention instead. (B, P + N, C)."""
        prefix = self.prefix_tokens(tokens.shape[0])
        if not self.has_position_table:
            return torch.cat([*prefix, tokens], dim=1)
        if self.no_embed_class:
            return torch.cat([*prefix, tokens + self.position_table(grid)], dim=1)
        return torch.cat([*prefix, tokens], dim=1) + self.position_table(grid)

    def prefix_tokens(self, batch: int) -> list[torch.Tensor]:
        """The tokens before the image's, each expanded to the batch: (B, 1, C) cls, dist; (B, R, C) registers."""
        return [t.expand(batch, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]

    @property
    def has_position_table(self) -> bool:
        """Whether positions are added to the tokens (a table, or a factorized pair), not only rotated in."""
        return self.pos_embed is not None or self.pos_embed_y is not None

    def position_table(self, grid: tuple[int, int]) -> torch.Tensor:
        """The position table for a token grid of `grid`, (1, P + rows * columns, C) (P = 0 with
        `no_embed_class`): the stored one, or with a dynamic image size (or a NaFlex image) that table resampled
        (`pos_embed_interp`, `pos_embed_ar_preserving`) to the input's grid, as timm's `dynamic_img_size`. A
        factorized pair gives the sum of its rows and columns, each resampled along its axis."""
        ar_preserving = self.config.pos_embed_ar_preserving
        if self.pos_embed_y is not None:
            ar_preserving = ar_preserving and grid != self.grid_size  # the model's own grid: the tables as they are
            return factorized_table(self.pos_embed_y, self.pos_embed_x, grid, ar_preserving)
        if grid == self.grid_size:
            return self.pos_embed
        prefix = 0 if self.no_embed_class else self.num_prefix_tokens
        mode = self.config.pos_embed_interp
        return resample_pos_embed(self.pos_embed, grid, prefix, self.grid_size, mode, ar_preserving)

    def forward_head(
        self, x: torch.Tensor, pre_logits: bool = False, valid: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, P + N, C) -> logits (B, num_classes), or the pooled (B, C) with `pre_logits`. With the distillation
        token: in training mode the pair (cls logits, dist logits), each (B, num_classes); else their average.
        `valid` (B, N): a NaFlex batch's patches, the only tokens the pooling reads (None: all)."""
        if self.dist_token is not None:
            return self._distilled_head(x, pre_logits)
        tokens = x[:, self.num_prefix_tokens :]  # (B, N, C): the image's tokens, no registers
        if self.attn_pool is not None:
            x = self.attn_pool(tokens, valid)  # (B, C): a learned query's read of the image tokens
        elif self.seq_pool is not None:
            scores = self.seq_pool(tokens)  # (B, N, 1)
            if valid is not None:
                scores = scores.masked_fill(~valid.unsqueeze(-1), float("-inf"))  # padding gets no share
            weights = scores.softmax(dim=1)  # (B, N, 1): each token's share, summing to 1
            x = (weights * tokens).sum(dim=1)  # (B, C): their weighted average
        elif self.global_pool == "avg":  # (B, C): mean over the image's tokens, no registers
            x = tokens.mean(dim=1) if valid is None else masked_mean(tokens, valid)
        else:
            x = x[:, 0]  # (B, C): the cls token
        x = self.fc_norm(x)
        return x if pre_logits else self.head(x)

    def _distilled_head(self, x: torch.Tensor, pre_logits: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x, x_dist = x[:, 0], x[:, 1]  # (B, C) each: the cls and the distillation token
        if pre_logits:
            return (x + x_dist) / 2
        logits, logits_dist = self.head(x), self.head_dist(x_dist)  # (B, num_classes) each
        if self.training:  # the trainer's loss reads the two heads apart (vit/train/distill.py)
            return logits, logits_dist
        return (logits + logits_dist) / 2  # evaluation: the heads averaged, as DeiT does

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Images (B, C_in, H, W), or a NaFlex batch (vit/naflex.py) -> logits."""
        if is_naflex(x):
            tokens, valid = naflex_features(self, x)
            return self.forward_head(tokens, valid=valid)
        return self.forward_head(self.forward_features(x))


def attention_pool(config: ClassifierConfig) -> AttentionPool:
    """The attention-pool head (`global_pool="map"`), sized as timm's: the blocks' heads and MLP ratio (4 beside
    SwiGLU blocks), and their GELU (tanh-approximated in SigLIP 2's NaFlex models)."""
    mlp_ratio = config.mlp_ratio if config.mlp != "swiglu" else 4.0
    act = "gelu_tanh" if config.mlp == "gelu_tanh" else "gelu"
    return AttentionPool(config.embed_dim, config.num_heads, mlp_ratio, config.norm_eps, act)


def encoder_blocks(depth: int, dim: int, num_heads: int, drop_path_rate: float, **block_kwargs) -> nn.Sequential:
    """`depth` Blocks whose drop-path rates rise linearly: rate_i = drop_path_rate * i / (depth - 1), so deeper
    blocks are dropped more often (stochastic depth, Huang et al. 2016)."""
    # On the CPU whatever the default device (as timm): a model built under `torch.device("meta")` reads them too.
    rates = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()
    return nn.Sequential(*[Block(dim=dim, num_heads=num_heads, drop_path=rate, **block_kwargs) for rate in rates])


def init_linear_trunc_normal(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
