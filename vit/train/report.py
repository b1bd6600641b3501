"""What a run tells its user while it trains: per-step and per-epoch lines on the console (a progress bar on a
terminal, plain log lines otherwise), TensorBoard scalars, attention-map images and the hparams table. Only rank 0
reports; the other ranks' reporter writes nothing.

`with Reporter(...) as report:` closes the TensorBoard writer however the run ends; a failure to close it is
reported only when nothing else went wrong (see `TensorBoard.close`)."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.tensorboard import SummaryWriter

from vit.progress import redirect_logging_to_tqdm
from vit.records.files import OutputError, free_space, write_error_reason
from vit.records.sweep_files import SWEEP_FILE
from vit.runtime.compile import eager
from vit.runtime.sharding import reshard

log = logging.getLogger("vit.train")

ATTENTION_IMAGES = 4  # fixed validation images whose attention maps go to TensorBoard


class Reporter:
    def __init__(
        self, log_dir: str, progress: str, *, enabled: bool, attn_every: int, recon_every: int = 0, collective=False
    ) -> None:
        """`enabled`: this rank writes (rank 0). `collective`: every rank runs the figures' forward passes, which a
        sharded model (trainer.strategy=fsdp) needs of all its ranks at once; only rank 0 writes them."""
        self.tb = TensorBoard(log_dir, enabled=enabled)
        self.console = Console(progress, enabled=enabled)
        self.enabled, self.attn_every, self.recon_every = enabled, attn_every, recon_every
        self.collective = collective
        self.fixed_images = None  # (ATTENTION_IMAGES, 3, H, W): the same validation images every epoch

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        self.console.close()
        self.tb.close()

    def start_epoch(self, epoch: int, totals: Callable[[], tuple[int | None, int]], done_before: int = 0) -> None:
        """`totals()`: (the run's epochs, the epoch's batches), asked at every progress update (a budget's plan
        changes them; the epochs are None before its first plan)."""
        self.console.start_epoch(epoch, totals, done_before)

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

    @property
    def figure_every(self) -> int:
        """Every how many epochs (and after the last) the run draws a figure; 0: never (or not this rank)."""
        return (self.attn_every or self.recon_every) if self.enabled or self.collective else 0

    def figures(self, model, bundle, step: int, epoch: int | None = None, epochs: int | None = None) -> bool:
        """The figures due after `epoch` of `epochs` (every `figure_every` epochs and after the last; with epoch None,
        now): the fixed images' per-head attention maps and rollout over the image's tokens (the cls token's
        attention; the image tokens' mean without one), or with task=mae their original, masked and reconstructed
        versions (the same masks every time). Returns whether one was drawn."""
        every = self.figure_every
        if not every or not (epoch is None or figure_due(every, epoch, epochs)) or self.fixed_images is None:
            return False
        with eager():  # blocks compiled in place (compile_scope=blocks) run eagerly for the figure
            if self.attn_every:
                image = attention_image(model, self.fixed_images, bundle.mean, bundle.std)
                self.tb.image("attention/heads_and_rollout", image, step)
            if self.recon_every:
                image = reconstruction_image(model, self.fixed_images, bundle.mean, bundle.std)
                self.tb.image("mae/original_masked_reconstruction", image, step)
        reshard(model)  # a sharded model's blocks, gathered for the figure's pass, freed (vit/runtime/sharding.py)
        return True

    def hparams(self, hparams: dict, metrics: dict) -> None:
        self.tb.hparams(hparams, metrics)


def figure_due(every: int, epoch: int, epochs: int) -> bool:
    """Whether epoch `epoch` (from 0) of `epochs` draws the figures: every `every`-th and the last (0: none). The
    reporter draws by it, and a budget keeps time for the figures by it."""
    return bool(every) and ((epoch + 1) % every == 0 or epoch + 1 == epochs)


def first_images(loader, count: int) -> torch.Tensor | None:
    """The first `count` validation images (B, 3, H, W): the same pictures every epoch and after a resume."""
    try:
        images, _ = next(iter(loader))
    except StopIteration:
        return None
    return images[:count]


def use_progress_bar(setting: str) -> bool:
    if setting == "bar":
        return True
    if setting == "log":
        return False
    return sys.stderr.isatty() and not os.environ.get("CI")


class Console:
    """Per-epoch progress: a tqdm bar (loss, lr, img/s, ETA) on a terminal, a log line every N steps elsewhere.

    What the line counts towards comes from `totals()`, asked at every update: (the run's epochs, the epoch's
    batches). Under trainer.budget both follow the current plan, which a re-plan changes mid-epoch, and the epochs
    are None before the first plan. While the bar is open, log records are written through tqdm (clearing the bar
    and drawing it again below the line), so no line is printed through it."""

    def __init__(self, progress: str, enabled: bool = True) -> None:
        self.enabled = enabled  # off on torchrun ranks other than 0
        self.bar_enabled = enabled and use_progress_bar(progress)
        self._bar = None
        self._redirect = None  # logging_redirect_tqdm while the bar is open

    def start_epoch(self, epoch: int, totals: Callable[[], tuple[int | None, int]], done_before: int = 0) -> None:
        """`done_before`: the epoch's batches trained before a resume; the lines count the epoch's real step (the
        one TensorBoard logs), not the steps since the resume."""
        self.epoch, self.totals, self.done_before = epoch, totals, done_before
        self.start = time.perf_counter()
        if self.bar_enabled:
            from tqdm import tqdm

            epochs, steps = totals()
            self._bar = tqdm(total=steps, initial=done_before, desc=self.desc(epochs), leave=False, dynamic_ncols=True)
            self._redirect = redirect_logging_to_tqdm()

    def desc(self, epochs: int | None) -> str:
        return f"epoch {self.epoch + 1}/{epochs}" if epochs is not None else f"epoch {self.epoch + 1} (planning)"

    def update(self, step_in_epoch: int, done: int, loss: float, lr: float, img_s: float) -> None:
        """`step_in_epoch`: the steps this process has trained in the epoch (after a resume, since the resume)."""
        epochs, steps = self.totals()
        if self._bar is not None:
            if self._bar.total != steps:
                self._bar.total = steps
            self._bar.set_description_str(self.desc(epochs), refresh=False)
            self._bar.n = self.done_before + step_in_epoch
            self._bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", img_s=f"{img_s:,.0f}", refresh=False)
            self._bar.refresh()
            return
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        eta = elapsed / max(step_in_epoch, 1) * max(0, steps - self.done_before - step_in_epoch)
        log.info(
            "%s step %d/%d loss %.4f lr %.2e %.0f img/s eta %.0fs",
            self.desc(epochs),
            self.done_before + step_in_epoch,
            steps,
            loss,
            lr,
            img_s,
            eta,
        )

    def end_epoch(self, summary: str) -> None:
        self.close()
        if self.enabled:
            log.info(summary)

    def close(self) -> None:
        """Close the epoch's bar and give the console's log handlers back (also when the run fails mid-epoch)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None


class TensorBoard:
    """Scalars under train/, val/, val_ema/, time/, sys/; attention-map images; the hparams table.

    TensorBoard's writer appends each event to the file from a background thread; a failed write (full disk,
    folder removed) ends that thread, and the next add_* or flush raises its OSError in the training thread. Here
    that error becomes one OutputError naming the folder, and the thread's own traceback is not printed.
    """

    def __init__(self, log_dir: str, enabled: bool = True) -> None:
        self.log_dir = log_dir
        self.writer = None
        if not enabled:
            return
        self._previous_hook = threading.excepthook
        threading.excepthook = self._quiet_writer_thread
        try:
            self.writer = SummaryWriter(log_dir)  # creates log_dir and writes the file's first event
        except OSError as err:
            self._restore_hook()
            raise self._error(err) from err

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        if self.writer is None:
            return
        try:
            for tag, value in values.items():
                if value is not None and math.isfinite(float(value)):
                    self.writer.add_scalar(tag, float(value), step)
        except OSError as err:
            raise self._error(err) from err

    def image(self, tag: str, image, step: int) -> None:
        if self.writer is None:
            return
        try:
            self.writer.add_image(tag, image, step)
        except OSError as err:
            raise self._error(err) from err

    def hparams(self, hparams: Mapping[str, object], metrics: Mapping[str, float]) -> None:
        """One row of TensorBoard's HPARAMS view: the knobs of this run beside its final metrics."""
        if self.writer is None:
            return
        clean = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in hparams.items()}
        try:
            self.writer.add_hparams(clean, {f"hparam/{k}": float(v) for k, v in metrics.items()}, run_name=".")
        except OSError as err:
            raise self._error(err) from err

    def close(self) -> None:
        """Flush and close the event files. A failure raises OutputError, except while another exception is on its
        way up (the run's own error, or this writer's): that one is the news, and is not replaced."""
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        failure = None
        try:
            writer.flush()  # raises the writer thread's error, if it met one
        except OSError as err:
            failure = err
        for file_writer in (writer.all_writers or {}).values():  # each one, even after a failure: stop its thread
            try:
                file_writer.close()
            except OSError as err:
                failure = failure or err
        writer.file_writer = writer.all_writers = None
        self._restore_hook()
        if failure is not None and sys.exc_info()[1] is None:
            raise self._error(failure) from failure

    def _error(self, err: OSError) -> OutputError:
        folder = Path(self.log_dir)
        return OutputError(
            f"cannot write TensorBoard events in {str(folder)!r}: {write_error_reason(err, folder)} "
            f"({free_space(folder)} free there)"
        )

    def _quiet_writer_thread(self, args) -> None:
        """threading.excepthook while the writer is open: a dead event-writer thread prints nothing (its error comes
        back as an OutputError in the training thread); any other thread's exception goes to the previous hook."""
        if type(args.thread).__module__.startswith("tensorboard.summary.writer"):
            return
        self._previous_hook(args)

    def _restore_hook(self) -> None:
        if threading.excepthook == self._quiet_writer_thread:  # (a bound method: equal, not identical)
            threading.excepthook = self._previous_hook


# The columns a reader of TensorBoard's HPARAMS view always wants, whatever was swept.
HPARAM_KEYS = (
    "model.name",
    "model.embed_dim",
    "model.depth",
    "model.num_heads",
    "model.qk_scale",
    "model.qkv_bias",
    "optim.name",
    "optim.lr",
    "data.batch_size",
    "trainer.epochs",
    "trainer.seed",
)


def job_overrides() -> list[str]:
    """The overrides of this Hydra job: a run's command line; in a sweep the values of the keys it sweeps, as its
    start recorded them (vit/cli/sweeps.py: describe_sweep), not the constants every job shares. None for a run()
    outside Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
    except (ImportError, ValueError):
        return []
    given = list(hydra_cfg.overrides.task)
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return given
    try:
        swept = set(json.loads((Path(str(hydra_cfg.sweep.dir)) / SWEEP_FILE).read_text())["swept"])
    except (OSError, ValueError, KeyError, TypeError):  # a single run, or a sweeper that does not say
        return given
    parsed = OverridesParser.create().parse_overrides(given)
    return [text for text, override in zip(given, parsed, strict=True) if override.get_key_element() in swept]


def run_hparams(config: Mapping, given: list[str], precision: str) -> dict:
    """One run's row in TensorBoard's HPARAMS view: HPARAM_KEYS, the precision it trained in, and the keys its
    command line set (`given`: Hydra's overrides of this job, a sweep's values among them; a group choice as its
    option's name), so a sweep's knobs are columns and its constants are not (every key of the config was 60 and
    more columns). The full config stays in the run folder (.hydra/config.yaml, metrics.json)."""

    def value(key: str):
        node = config
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    from hydra.core.override_parser.overrides_parser import OverridesParser

    out: dict = {key: value(key) for key in HPARAM_KEYS}
    out["precision"] = precision
    for override in OverridesParser.create().parse_overrides(given):  # Hydra's own grammar: +key, ~key, group
        key = override.key_or_group
        if key.startswith("hydra.") or key in out or override.is_delete():
            continue
        found = value(key)
        out[key] = str(override.value()) if isinstance(found, Mapping) or found is None else found  # a group
    return {k: "null" if v is None else v for k, v in out.items() if not isinstance(v, (list, tuple, Mapping))}


def reconstruction_image(
    model: torch.nn.Module, images: torch.Tensor, mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor:
    """task=mae: one row per image of original | masked | reconstruction, as a (3, height, width) uint8 tensor
    for `add_image` (vit/tasks/figures.py's `reconstruction_views`, the same masks every epoch)."""
    from torchvision.utils import make_grid

    from vit.tasks.figures import reconstruction_views

    original, masked, recon = reconstruction_views(model, images, mean, std)
    rows = torch.stack([original, masked, recon], dim=1).flatten(0, 1)  # (3B, 3, H, W): image by image
    grid = make_grid(rows, nrow=3, padding=2, pad_value=1.0)  # (3, height, width) in [0, 1]
    return (grid * 255).round().to(torch.uint8)


def attention_image(
    model: torch.nn.Module, images: torch.Tensor, mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor:
    """The figure of scripts/visualize_attention.py (per-head cls maps and rollout) for `images` (B, 3, H, W),
    normalised as the loader gives them, rendered to a (3, height, width) uint8 tensor for `add_image`."""
    from vit.tasks.figures import attention_grid_figure, attention_views, register_note

    device = next(model.parameters()).device
    views = attention_views(model, images.to(device))
    mean_t = torch.tensor(mean).view(1, 3, 1, 1)
    std_t = torch.tensor(std).view(1, 3, 1, 1)
    pictures = (images.cpu().float() * std_t + mean_t).clamp(0, 1)  # undo the normalisation for display
    buffer = io.BytesIO()
    note = register_note(views, getattr(model, "num_reg_tokens", 0))
    attention_grid_figure(
        pictures, views["heads"], views["rollout"], buffer, token_maps=views.get("token_stage"), note=note
    )
    picture = np.array(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))  # (height, width, 3)
    return torch.from_numpy(picture).permute(2, 0, 1)
