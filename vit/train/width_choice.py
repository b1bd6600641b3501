"""`trainer.width_by_budget`: a budgeted run picks its model's width from how fast this machine trains each width.

The accuracy-against-images map (docs/RESULTS.md) says how much each width learns from a number of epochs: a wider
model learns more per epoch, a narrower one more per second, and the wider one wins once the budget buys it enough
epochs. How many epochs a budget buys depends on the machine (the same 30 minutes hold twice the epochs on a CPU
with AVX512 as on one with AVX2 only), so the choice cannot be written into a recipe as a width: the recipe lists
its widths (`widths`) and the epochs a width needs before it is worth its cost (`min_epochs`, read off the map), and
the run measures the rest:

- each width, narrowest first, is built and trains a few batches of random images at the data's size and batch
  (one untimed step for the allocations, then the median of `TIMED_STEPS` timed: forward, loss, backward and the
  optimizer's step, in the precision trainer.amp gives that width), as the run's steps would. Under
  trainer.amp=auto on a CPU with native bf16 (AVX512-BF16, AMX) each width is timed in fp32 and in bf16
  (interleaved), and trains in the other precision than trainer.amp's rule gives it (vit/runtime/device.py: bf16
  from 32 wide over few tokens) where that one timed at least `PRECISION_MARGIN` faster: whether bf16 pays at a
  width differs between such CPUs, and within the margin three timed batches cannot tell them apart;
- the budget left, over an epoch's time at that speed, is the epochs the width would train (an estimate: under
  progressive resizing an epoch costs the mean of its sizes' token counts against the full size, and evaluations
  are left out; the budget itself plans the steps exactly once the run trains);
- the widest width whose estimate reaches `min_epochs` is picked, the narrowest when none does; a wider width is
  timed only while the narrower ones reach `min_epochs` (it is slower still).

With `long_epochs` set, the run also trains with `long_overrides` (data.*, model.*, optim.*, sched.* keys in Hydra's
grammar) where the picked width's estimate reaches it: what pays only when a run is long, such as an augmentation
that a short run, still under-fitted, pays for in accuracy. The overrides are written into the config with the
width, before the data's loaders and the model are built again, so such a run trains what a run configured with
them trains.

The log says what each width measured and which was picked, and why. The heads keep the configured model's head
width (96 wide with 2 heads makes 144 wide with 3). vit/train/setup.py writes the pick into the config before the
model is built and resets the random state, so a run that picks a width trains what a run configured with that width
trains, and a resumed run keeps the width of the checkpoint it continues.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from vit.runtime.device import Precision, choose_precision, cpu_has_native_bf16
from vit.settings import OptimSettings, TrainerSettings
from vit.train.optimizer import build_optimizer, scaled_lr
from vit.train.progressive import ResizeSchedule, size_cost

log = logging.getLogger("vit.train")

TIMED_STEPS = 3  # timed batches per width, after one untimed
# The other precision than the rule's is taken only where it timed this much faster: a few timed batches are noisy
# (docs/BENCHMARKS.md, "bf16 on the CPU").
PRECISION_MARGIN = 1.05


@dataclass(frozen=True)
class WidthTiming:
    """One width as measured on this machine."""

    width: int
    heads: int
    precision: str  # the precision this width trains in: fp32, bf16, fp16
    batch_s: float  # seconds per training batch, measured
    epochs: float  # the epochs the budget left buys at that speed (estimated)
    other: str | None = None  # the precision also timed and not kept (trainer.amp=auto on a CPU with native bf16)
    other_batch_s: float | None = None
    rule: str = ""  # why the kept precision: the faster by the margin, or the rule's within it

    def describe(self, batch_size: int, epochs: bool = True) -> str:
        speed = batch_size / self.batch_s
        text = f"{self.width} wide ({self.heads} heads, {self.precision}): {speed:,.0f} img/s"
        if self.other is not None:
            text += f" ({self.other}: {batch_size / self.other_batch_s:,.0f} img/s)"
        return f"{text}, {self.epochs:.1f} epochs" if epochs else text

    def timed_precision(self, batch_size: int) -> Precision | None:
        """The precision the width trains in where it was timed against the other, with the speeds as its reason."""
        if self.other is None:
            return None
        speeds = f"{batch_size / self.batch_s:,.0f} img/s, {self.other} {batch_size / self.other_batch_s:,.0f}"
        why = f"{self.precision} at {self.width} wide, timed on this CPU ({speeds}): {self.rule}"
        return Precision(self.precision, f"trainer.amp=auto with trainer.width_by_budget: {why}")


@dataclass(frozen=True)
class WidthChoice:
    """What the run picked and why, as metrics.json records it (`width_by_budget`)."""

    width: int
    why: str
    timed: tuple[WidthTiming, ...] = ()  # empty when no width was timed (a resumed run keeps its checkpoint's width)
    precision: Precision | None = None  # the precision timed the faster at that width, where both were timed
    long: bool | None = None  # whether long_overrides apply; None where long_epochs is null

    def record(self) -> dict:
        return {"width": self.width, "why": self.why, "timed": [dataclasses.asdict(t) for t in self.timed],
                "precision": self.precision.name if self.precision is not None else None,
                "long": self.long}  # fmt: skip


def heads_for(model: DictConfig, width: int) -> int:
    """The heads of `width` at the configured model's head width (model.embed_dim / model.num_heads)."""
    return width // (int(model.embed_dim) // int(model.num_heads))


def set_width(cfg: DictConfig, width: int) -> None:
    """Write `width` and its heads into the run's config (model.embed_dim, model.num_heads)."""
    heads = heads_for(cfg.model, width)
    cfg.model.embed_dim, cfg.model.num_heads = width, heads


def long_choice(setting, picked: WidthTiming) -> bool | None:
    """Whether the run trains with `long_overrides`: the picked width's estimated epochs reach `long_epochs`;
    None where long_epochs is null. One line says which, and why."""
    if setting.long_epochs is None:
        return None
    long = picked.epochs >= setting.long_epochs
    overrides = " ".join(setting.long_overrides)
    log.info("trainer.width_by_budget: %d wide buys %.1f epochs, %s long_epochs=%g: %s", picked.width, picked.epochs,
             "at least" if long else "under", setting.long_epochs,
             f"also {overrides}" if long else f"without {overrides}")  # fmt: skip
    return long


def epoch_cost(resize: ResizeSchedule | None) -> float:
    """An epoch's mean cost against a full-size epoch under progressive resizing (`size_cost` of each epoch's
    size); 1 without."""
    if resize is None:
        return 1.0
    sizes = resize.sizes(100)  # the schedule is in fractions of the run: 100 epochs sample it finely
    return sum(size_cost(size, resize.full_size) for size in sizes) / len(sizes)


def batch_seconds(model, task, criterion, optimizer, precision, device, images, targets) -> float:
    """Seconds one training batch takes `model` here: forward and loss under `precision`, backward, the optimizer's
    step."""
    start = time.perf_counter()
    with precision.autocast(device):
        loss = task.loss(model, images, targets, criterion)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def precisions_to_time(trainer: TrainerSettings, device) -> tuple[str, ...]:
    """The precisions each width is timed in: fp32 and bf16 under trainer.amp=auto on a CPU with native bf16;
    none (the rule of trainer.amp) elsewhere."""
    if trainer.amp == "auto" and device.type == "cpu" and cpu_has_native_bf16():
        return ("fp32", "bf16")
    return ()


def time_width(
    cfg: DictConfig, trainer: TrainerSettings, width: int, task, bundle, device
) -> tuple[dict[str, float], str]:
    """(seconds per training batch of the configured model at `width` by precision, the precision trainer.amp's
    rule gives it): the rule's precision timed, or each of `precisions_to_time`, on random images of the data's
    batch and size."""
    trial = copy.deepcopy(cfg)
    set_width(trial, width)
    # The run's random state is left as it was: a run whose width is the configured one trains as without the timing.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = task.build_model(trial, num_classes=bundle.num_classes, announce=False).to(device)
        ruled = choose_precision(trainer.amp, device, model)
        precisions = [Precision(name, "timed") for name in precisions_to_time(trainer, device)] or [ruled]
        optim = OptimSettings.of(cfg.optim)
        optimizer = build_optimizer(model, optim, scaled_lr(optim, global_batch=cfg.data.batch_size), device)
        size, batch = int(cfg.data.img_size), int(cfg.data.batch_size)
        images = torch.randn(batch, int(cfg.model.get("in_chans") or 3), size, size, device=device)  # (B, 3, H, W)
        targets = torch.randint(0, bundle.num_classes, (batch,), device=device)  # (B,)
        model.train()
        step = lambda precision: batch_seconds(model, task, bundle.train_criterion, optimizer, precision, device,  # noqa: E731
                                               images, targets)  # fmt: skip
        for precision in precisions:  # untimed: allocations, first-call costs, each precision's kernels
            step(precision)
        # Interleaved (fp32, bf16, fp32, ...), so both meet the same moments of the machine; the median of each.
        times = [[step(precision) for precision in precisions] for _ in range(TIMED_STEPS)]
    return {p.name: statistics.median(row[i] for row in times) for i, p in enumerate(precisions)}, ruled.name


def width_timing(
    width: int, heads: int, timed: tuple[dict[str, float], str], epochs_at: Callable[[float], float]
) -> WidthTiming:
    """The width's timing from `time_width`'s (seconds by precision, the rule's precision): where two precisions
    were timed, the other than the rule's is kept if it ran `PRECISION_MARGIN` faster, else the rule's, and the
    one not kept is named; `epochs_at(batch_s)`: the epochs the budget buys at that speed."""
    seconds, ruled = timed
    other = next((name for name in seconds if name != ruled), None)
    if other is None:
        return WidthTiming(width, heads, ruled, seconds[ruled], epochs_at(seconds[ruled]))
    faster = seconds[other] * PRECISION_MARGIN <= seconds[ruled]
    kept, dropped = (other, ruled) if faster else (ruled, other)
    margin = f"{PRECISION_MARGIN - 1:.0%}"
    rule = f"at least {margin} faster" if faster else f"the rule's ({other} not {margin} faster)"
    return WidthTiming(width, heads, kept, seconds[kept], epochs_at(seconds[kept]), dropped, seconds[dropped], rule)


def pick_width(
    cfg: DictConfig, trainer: TrainerSettings, task, bundle, device, batches: int, resize, budget_left: Callable
) -> WidthChoice:
    """Time the widths narrowest first and return the one to train (see the module's docstring); `batches`:
    training batches per epoch and process; `budget_left()`: the budget's seconds left now."""
    setting = trainer.width_by_budget
    cost = epoch_cost(resize)
    timed: list[WidthTiming] = []
    for width in setting.widths:
        measured = time_width(cfg, trainer, width, task, bundle, device)
        # the budget left after the timing so far
        timing = width_timing(
            width, heads_for(cfg.model, width), measured, lambda s: budget_left() / (batches * s * cost)
        )
        timed.append(timing)
        if timing.epochs < setting.min_epochs:
            break
    reaching = [t for t in timed if t.epochs >= setting.min_epochs]
    picked = reaching[-1] if reaching else timed[0]
    batch = int(cfg.data.batch_size)
    log.info(
        "trainer.width_by_budget: %s (timed on %d batches of %d random images each)",
        "; ".join(t.describe(batch) for t in timed),
        TIMED_STEPS,
        batch,
    )
    why = (
        f"the widest whose epochs reach min_epochs={setting.min_epochs:g}"
        if reaching
        else f"none reaches min_epochs={setting.min_epochs:g}, so the narrowest"
    )
    untimed = [w for w in setting.widths if w > timed[-1].width]
    if untimed:
        why += f"; {', '.join(map(str, untimed))} wide not timed (slower still)"
    log.info("trainer.width_by_budget: %d wide picked (model.embed_dim=%d model.num_heads=%d): %s",
             picked.width, picked.width, picked.heads, why)  # fmt: skip
    return WidthChoice(picked.width, why, tuple(timed), picked.timed_precision(batch), long_choice(setting, picked))


def time_resumed_width(
    cfg: DictConfig, trainer: TrainerSettings, kept: WidthChoice, task, bundle, device
) -> WidthChoice:
    """A resumed run's width (`kept`, its checkpoint's) with its precision timed on this machine, where both are
    timed (`precisions_to_time`): the run may continue on another CPU than it started on."""
    if not precisions_to_time(trainer, device):
        return kept
    measured = time_width(cfg, trainer, kept.width, task, bundle, device)
    timing = width_timing(kept.width, heads_for(cfg.model, kept.width), measured, lambda s: float("nan"))
    batch = int(cfg.data.batch_size)
    log.info("trainer.width_by_budget: %s", timing.describe(batch, epochs=False))  # a resumed run's: no estimate
    return dataclasses.replace(kept, timed=(timing,), precision=timing.timed_precision(batch))
