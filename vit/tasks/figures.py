"""The figures the trainer draws while it runs: the attention grid it logs to TensorBoard and the confusion
matrix of an evaluation, with the attention maps they are made of. vit/analysis and vit/deploy draw the same
figures from here (the trainer imports nothing above itself).

Attention maps come from the (B, heads, N, N) tensors that `capture_attention` records,
N = prefix tokens + gh * gw: the cls-token attention of each head and the attention rollout over all layers.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import torch
import torch.nn.functional as F

from vit.models import capture_attention

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def cls_attention(
    attn: torch.Tensor, grid: tuple[int, int], num_prefix: int = 1, class_token: bool = True
) -> torch.Tensor:
    """How much the cls token attends to each of the image's tokens: (B, heads, N, N) -> (B, heads, gh, gw).
    Without a cls token (`class_token=False`, a model that averages its tokens), the mean over the image's tokens
    as queries. The prefix tokens (cls, dist, registers) are left out of the keys: the map covers the image."""
    batch, heads, _, _ = attn.shape
    queries = attn[:, :, :1] if class_token else attn[:, :, num_prefix:]  # (B, heads, q, N)
    return queries[..., num_prefix:].mean(dim=2).reshape(batch, heads, *grid)


def register_share(attn: torch.Tensor, num_prefix: int, num_reg: int, class_token: bool = True) -> torch.Tensor:
    """The share of the query's attention (the cls token's, or the image tokens' mean) that goes to the register
    tokens, the last `num_reg` of the `num_prefix` prefix tokens: (B, heads, N, N) -> (B,), head-averaged."""
    queries = attn[:, :, :1] if class_token else attn[:, :, num_prefix:]
    return queries[..., num_prefix - num_reg : num_prefix].sum(dim=-1).mean(dim=(1, 2))


def rollout(maps: list[torch.Tensor], residual_weight: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020): (B, N, N) token-to-input attention through all layers.

    Each layer's head-averaged attention is mixed with the identity for the residual connection,
    A' = w I + (1 - w) A, rows renormalised, and the layers multiplied in order.
    """
    result = None
    for attn in maps:
        mean = attn.float().mean(dim=1)  # (B, N, N)
        eye = torch.eye(mean.shape[-1], device=mean.device).expand_as(mean)
        mixed = residual_weight * eye + (1 - residual_weight) * mean
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        result = mixed if result is None else mixed @ result
    if result is None:
        raise ValueError("rollout needs at least one attention map")
    return result


def upsample(heat: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(B, k, gh, gw) -> (B, k, H, W), each map scaled to [0, 1]."""
    heat = F.interpolate(heat.float(), size=size, mode="bilinear", align_corners=False)
    low = heat.amin(dim=(-2, -1), keepdim=True)
    high = heat.amax(dim=(-2, -1), keepdim=True)
    return (heat - low) / (high - low).clamp_min(1e-12)


@torch.no_grad()
def attention_views(model, images: torch.Tensor, layer: int = -1) -> dict[str, torch.Tensor]:
    """Everything the attention figure shows, each as (B, k, H, W) maps in [0, 1] over the image:
    "heads" (cls attention of every head of `layer`), "rollout" (all layers), and for T2T-ViTs with transformer
    tokens "token_stage" (the attention each token receives in the first T2T stage). The maps cover the image's
    tokens; with register tokens, "register_share" (B,) is the share of `layer`'s attention they take instead."""
    was_training = model.training
    model.eval()
    with capture_attention(model) as maps:
        model(images)
    model.train(was_training)
    maps = [m.float().cpu() for m in maps]
    encoder = [m for m in maps if m.shape[-1] == maps[-1].shape[-1]]  # T2T models also record token stages
    if not -len(encoder) <= layer < len(encoder):
        raise IndexError(f"layer={layer} is out of range: the model has {len(encoder)} attention layers")
    grid = model.grid_size if hasattr(model, "grid_size") else model.patch_embed.grid_size
    size = tuple(images.shape[-2:])
    prefix = getattr(model, "num_prefix_tokens", 1)
    has_cls = getattr(model, "cls_token", True) is not None
    flow = rollout(encoder)  # (B, N, N)
    flow = flow[:, :1] if has_cls else flow[:, prefix:]  # the cls token's row, or the image tokens' rows
    views = {
        "heads": upsample(cls_attention(encoder[layer], grid, prefix, has_cls), size),
        "rollout": upsample(flow[..., prefix:].mean(dim=1).reshape(-1, 1, *grid), size),
    }
    registers = getattr(model, "num_reg_tokens", 0)
    if registers:
        views["register_share"] = register_share(encoder[layer], prefix, registers, has_cls)
    if len(maps) > len(encoder):
        received = maps[0].mean(dim=(1, 2))  # (B, N0): mean over heads and queries
        side = int(round(received.shape[-1] ** 0.5))
        views["token_stage"] = upsample(received.reshape(-1, 1, side, side), size)
    return views


def save(fig, path):
    """Write `fig` to a path, or into a binary buffer (for TensorBoard), and close it."""
    if hasattr(path, "write"):
        fig.savefig(path, format="png")
        plt.close(fig)
        return path
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def attention_grid_figure(
    images, head_maps, rollout_maps, path: Path, titles=None, token_maps=None, note: str | None = None
) -> Path:
    """Rows: images. Columns: input | cls attention of each head of the chosen layer | rollout over all layers
    [| first T2T token-attention stage]. images (B, 3, H, W) in [0, 1]; maps (B, k, H, W) in [0, 1]. `note`: a
    line under the figure (what the maps leave out, e.g. the register tokens)."""
    batch, heads = head_maps.shape[:2]
    extra = 1 if token_maps is not None else 0
    cols = 2 + heads + extra
    fig, axes = plt.subplots(batch, cols, figsize=(1.6 * cols, 1.7 * batch), dpi=100, squeeze=False)
    for b in range(batch):
        picture = images[b].permute(1, 2, 0).numpy()
        panels = [("input", None)] + [(f"head {h + 1}", head_maps[b, h]) for h in range(heads)]
        panels.append(("rollout", rollout_maps[b, 0]))
        if token_maps is not None:
            panels.append(("T2T stage 1", token_maps[b, 0]))
        for c, (name, heat) in enumerate(panels):
            ax = axes[b, c]
            ax.imshow(picture)
            if heat is not None:
                ax.imshow(heat.numpy(), cmap="inferno", alpha=0.6)
            ax.set_axis_off()
            if b == 0:
                ax.set_title(name, fontsize=8)
        if titles:
            axes[b, 0].set_title(titles[b], fontsize=7)
    fig.tight_layout()
    if note:
        fig.subplots_adjust(bottom=0.1)
        fig.text(0.5, 0.01, note, ha="center", fontsize=7)
    return save(fig, path)


def register_note(views: dict[str, torch.Tensor], num_reg: int) -> str | None:
    """One line for a figure of a model with registers: that they are hidden from the maps, and their share."""
    if not num_reg:
        return None
    share = views["register_share"].mean().item()
    return f"{num_reg} register tokens, hidden from the maps: they take {100 * share:.0f}% of this layer's attention"


def confusion_matrix_figure(matrix: np.ndarray, class_names: list[str], path: Path) -> Path:
    """Row-normalised confusion matrix (rows: true class, columns: predicted), with counts in the cells."""
    matrix = np.asarray(matrix)
    rates = matrix / np.clip(matrix.sum(axis=1, keepdims=True), 1, None)
    size = max(4.0, 0.45 * len(class_names) + 2)
    fig, ax = plt.subplots(figsize=(size, size * 0.9), dpi=100)
    image = ax.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(class_names)), class_names, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(class_names)), class_names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if len(class_names) <= 20:
        for i in range(len(class_names)):
            for j in range(len(class_names)):
                colour = "white" if rates[i, j] > 0.5 else "black"
                ax.text(j, i, int(matrix[i, j]), ha="center", va="center", fontsize=7, color=colour)
    fig.colorbar(image, ax=ax, fraction=0.046)
    ax.set_title(f"top-1 {100 * np.trace(matrix) / max(matrix.sum(), 1):.2f}%")
    fig.tight_layout()
    return save(fig, path)


@torch.no_grad()
def reconstruction_views(
    model: torch.nn.Module, images: torch.Tensor, mean, std, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A masked autoencoder (vit/models/mae.py) on `images` (B, 3, H, W), normalised as the loader gives them:
    (original, masked, reconstruction), each (B, 3, H, W) in [0, 1] for display. The masked view greys out the
    hidden patches; the reconstruction shows the predicted pixels of the hidden patches beside the visible ones,
    as the paper's figures do. With `norm_pix_loss` the predictions are per-patch normalised, so each is mapped
    back with its true patch's mean and spread (the figure shows the shapes the model predicts, not their
    absolute brightness). The masking noise comes from `seed`: the same patches every time."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    images = images.to(device).float()
    noise = torch.rand(images.shape[0], model.patch_embed.num_patches, generator=torch.Generator().manual_seed(seed))
    _, pred, mask = model(images, noise=noise.to(device))  # (B, N, p*p*3), (B, N)
    pred = pred.float()
    if model.norm_pix_loss:
        target = model.patchify(images)  # (B, N, p*p*3)
        mean_p, var_p = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        pred = pred * (var_p + 1e-6) ** 0.5 + mean_p
    hidden = model.unpatchify(mask.unsqueeze(-1).expand_as(pred))  # (B, 3, H, W): 1 where hidden
    recon = model.unpatchify(pred)
    mean_t = torch.tensor(mean, device=device).view(1, 3, 1, 1)
    std_t = torch.tensor(std, device=device).view(1, 3, 1, 1)

    def to_pixels(x: torch.Tensor) -> torch.Tensor:
        return (x * std_t + mean_t).clamp(0, 1).cpu()

    model.train(was_training)
    original = to_pixels(images)
    masked = original * (1 - hidden.cpu()) + 0.5 * hidden.cpu()
    pasted = to_pixels(images * (1 - hidden) + recon * hidden)
    return original, masked, pasted
