"""End-to-end throughput: what the data path costs on top of the training step, measured inside the trainer.

One real training run (`vit.train.run`, which the caller passes in; the user's own config) whose train loader
alternates, epoch by epoch, between the real data path and a *static* epoch that replays the first batch of the
previous real epoch (already augmented, already on the device) as many times as the loader has batches:

    epoch 0   real      (compilation, warm-up: not counted)
    epoch 1   static
    epoch 2   real  --+  pair 1: overhead = static img/s / real img/s - 1
    epoch 3   static--+
    epoch 4   real  --+  pair 2
    ...

Everything else is the trainer's step as the user runs it (compile, AMP, optimizer, EMA, Mixup/CutMix, the
host syncs every `log_every_n_steps`), so the difference is the data path: loading, augmentation, copies.
Interleaving the two kinds of epoch, as the model benchmark interleaves its rounds, keeps clock and thermal
drift out of the ratio; the result is the median of the per-pair ratios with their spread.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from step_timing import percentile


class AlternatingStaticLoader:
    """Wraps a train loader: even passes are the loader itself, odd passes replay the previous pass's first batch
    `len(loader)` times, kept on `device` (so not even the host-to-device copy is left in a static epoch).
    Anything else (`set_epoch`, `generator`, `skip_batches`, ...) is the wrapped loader's."""

    def __init__(self, loader: Iterable, device: torch.device | str = "cpu") -> None:
        self.loader = loader
        self.device = torch.device(device)
        self.passes = 0
        self.first_batch = None

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["loader"], name)

    def __iter__(self) -> Iterator:
        real = self.passes % 2 == 0
        self.passes += 1
        if real:
            for i, batch in enumerate(self.loader):
                if i == 0:
                    self.first_batch = tuple(t.to(self.device) for t in batch)
                yield batch
        else:
            if self.first_batch is None:
                raise RuntimeError("a static epoch needs a real epoch before it that yielded a batch")
            for _ in range(len(self.loader)):
                yield self.first_batch


@dataclass
class EndToEnd:
    epochs: int
    batch: int
    loader: str
    compiled: bool
    device: str
    real_img_per_s: list[float]  # the counted real epochs (2, 4, ...)
    static_img_per_s: list[float]  # the static epoch after each of them (3, 5, ...)
    overhead: float  # median over pairs of static / real - 1: the data path's cost relative to the step alone
    overhead_p10: float
    overhead_p90: float
    wall_time_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def pair_overheads(history: list[dict]) -> tuple[list[float], list[float]]:
    """(real img/s, static img/s) of the pairs (epoch 2k, epoch 2k + 1), k >= 1, from a run's history."""
    rates = [record["train_img_per_s"] for record in history]
    pairs = [(rates[i], rates[i + 1]) for i in range(2, len(rates) - 1, 2)]
    return [real for real, _ in pairs], [static for _, static in pairs]


def end_to_end(cfg, output_dir: Path, train: Callable[..., dict]) -> EndToEnd:
    """Train `cfg` (a composed trainer config; `trainer.epochs` >= 4) with alternating real and static epochs.
    `train` is the trainer's `vit.train.run`, given by the caller: the analysis layer does not import the trainer."""
    from vit.runtime.device import resolve_device

    device = resolve_device(cfg.trainer.device)
    epochs = int(cfg.trainer.epochs)
    if epochs < 4:
        raise ValueError(f"trainer.epochs={epochs}: the end-to-end benchmark needs >= 4 epochs (one counted pair)")
    metrics = train(
        cfg, output_dir=output_dir, train_loader_wrapper=lambda loader: AlternatingStaticLoader(loader, device)
    )
    real, static = pair_overheads(metrics["history"])
    ratios = [s / r - 1.0 for r, s in zip(real, static, strict=True)]
    return EndToEnd(
        epochs=epochs,
        batch=cfg.data.batch_size,
        loader=metrics["loader"],
        compiled=bool(metrics["compiled"]),
        device=metrics["device"],
        real_img_per_s=real,
        static_img_per_s=static,
        overhead=statistics.median(ratios),
        overhead_p10=percentile(ratios, 0.1),
        overhead_p90=percentile(ratios, 0.9),
        wall_time_s=metrics["wall_time_s"],
    )


def e2e_markdown(result: EndToEnd, label: str) -> str:
    header = "| run | loader | compile | batch | real img/s (median) | step-only img/s (median) | data-path cost |"
    real, static = statistics.median(result.real_img_per_s), statistics.median(result.static_img_per_s)
    cost = f"{100 * result.overhead:+.1f}% ({100 * result.overhead_p10:+.1f} to {100 * result.overhead_p90:+.1f})"
    row = (
        f"| {label} | {result.loader} | {'on' if result.compiled else 'off'} | {result.batch} | {real:,.0f} | "
        f"{static:,.0f} | {cost} |"
    )
    return "\n".join([header, "|---|---|---|---|---|---|---|", row])
