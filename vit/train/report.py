"""What a run tells its user while it trains: per-step and per-epoch lines on the console, TensorBoard scalars,
attention-map images and the hparams table. Only rank 0 reports; the other ranks' reporter writes nothing.

`with Reporter(...) as report:` closes the TensorBoard writer however the run ends; a failure to close it is
reported only when nothing else went wrong (see `TensorBoard.close`)."""

from __future__ import annotations

import torch

from vit.train.compile import eager
from vit.train.logger import Console, TensorBoard, attention_image, reconstruction_image

ATTENTION_IMAGES = 4  # fixed validation images whose attention maps go to TensorBoard


class Reporter:
    def __init__(self, log_dir: str, progress: str, *, enabled: bool, attn_every: int, recon_every: int = 0) -> None:
        self.tb = TensorBoard(log_dir, enabled=enabled)
        self.console = Console(progress, enabled=enabled)
        self.enabled, self.attn_every, self.recon_every = enabled, attn_every, recon_every
        self.fixed_images = None  # (ATTENTION_IMAGES, 3, H, W): the same validation images every epoch

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        self.tb.close()

    def start_epoch(self, epoch: int, epochs: int, batches: int) -> None:
        self.console.start_epoch(epoch, epochs, batches)

    def log_step(self, step_in_epoch: int, step: int, values: dict) -> None:
        """Every `log_every_n_steps` steps, with the values already on the host."""
        self.tb.scalars(values, step)
        self.console.update(step_in_epoch, step, values["train/loss"], values["train/lr"], values["train/img_per_s"])

    def scalars(self, values: dict, step: int) -> None:
        self.tb.scalars(values, step)

    def line(self, text: str) -> None:
        """One console line (closing the epoch's progress bar, if one is open)."""
        self.console.end_epoch(text)

    def keep_images(self, val_loader) -> None:
        """Take the attention figure's images: the first validation batch's first ones (as every rank did before
        the first epoch, so no rank's data order depends on whether it reports)."""
        self.fixed_images = first_images(val_loader, ATTENTION_IMAGES)

    def attention_maps(self, model, bundle, epoch: int, epochs: int, step: int) -> None:
        """Every `attn_maps_every_n_epochs` epochs and after the last: the fixed images' per-head attention maps
        and rollout over the image's tokens (the cls token's attention; the image tokens' mean without one)."""
        due = self.attn_every and ((epoch + 1) % self.attn_every == 0 or epoch + 1 == epochs)
        if not (self.enabled and due):
            return
        if self.fixed_images is None:
            return
        with eager():  # blocks compiled in place (compile_scope=blocks) run eagerly for the figure
            image = attention_image(model, self.fixed_images, bundle.mean, bundle.std)
        self.tb.image("attention/heads_and_rollout", image, step)

    def reconstructions(self, model, bundle, epoch: int, epochs: int, step: int) -> None:
        """task=mae, every `recon_images_every_n_epochs` epochs and after the last: original, masked and
        reconstructed versions of the fixed validation images (the same masks every time)."""
        due = self.recon_every and ((epoch + 1) % self.recon_every == 0 or epoch + 1 == epochs)
        if not (self.enabled and due) or self.fixed_images is None:
            return
        with eager():
            image = reconstruction_image(model, self.fixed_images, bundle.mean, bundle.std)
        self.tb.image("mae/original_masked_reconstruction", image, step)

    def hparams(self, hparams: dict, metrics: dict) -> None:
        self.tb.hparams(hparams, metrics)


def first_images(loader, count: int) -> torch.Tensor | None:
    """The first `count` validation images (B, 3, H, W): the same pictures every epoch and after a resume."""
    try:
        images, _ = next(iter(loader))
    except StopIteration:
        return None
    return images[:count]
