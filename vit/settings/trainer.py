"""`trainer.*`: how a run trains (vit/train). configs/trainer/default.yaml starts from these defaults and changes
none; configs/trainer/debug.yaml runs a few fast batches. Read once into `TrainerSettings`: the phases read
`run.trainer.epochs`, never `int(cfg.trainer.epochs)`."""

from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass
from typing import ClassVar, Literal

from vit.errors import ConfigError
from vit.settings.data import whole_numbers
from vit.settings.schema import Settings, as_given, knob

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
SMALLER_UNIT = {"d": "h", "h": "m", "m": "s"}  # what a bare number after a unit most likely meant: 1h30 -> 1h30m
# trainer.budget's grammar: a bare number is seconds; else one or more parts `<number><unit>`, spaces allowed between
# a number and its unit and between parts ('10 m', '1h 30m'), never inside a number ('1 0m' is refused, not 10m).
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})\s*([smhd])")
_DURATION = re.compile(rf"\s*(?:{_NUMBER}\s*[smhd]\s*)+")
# Parts and then a number without a unit: `1h30` is 1h30m to most readers, 1h30s to some, so it is refused with the
# reading named instead of being guessed.
_UNIT_MISSING = re.compile(rf"\s*((?:{_NUMBER}\s*[smhd]\s*)+)({_NUMBER})\s*")


def parse_budget(value, key: str = "trainer.budget") -> float | None:
    """`trainer.budget` (or the duration knob `key`) in seconds: null -> None; a number of seconds; or a duration
    such as `90s`, `30m`, `2h`, `1h30m`, `'1h 30m'` (units s, m, h, d, any case; spaces between a number and its
    unit and between parts). Raises ConfigError naming the value otherwise, with the duration meant where a trailing
    number lacks its unit."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "null", "none")):
        return None
    bad = ConfigError(
        f"{key}={value!r} is not a duration: give seconds (e.g. 1800) or numbers with a unit s, m, h or d "
        "(e.g. 90s, 30m, 2h, 1h30m, '1h 30m')"
    )
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            if not _DURATION.fullmatch(text):
                missing = _UNIT_MISSING.fullmatch(text)
                if missing is None:
                    raise bad from None
                parts, number = missing.groups()
                unit = SMALLER_UNIT.get(parts.rstrip()[-1])
                meant = f"; write {parts}{number}{unit} if that is what you mean" if unit else ""
                raise ConfigError(
                    f"{key}={value!r} is ambiguous: {number} after {parts.strip()} has no unit{meant} "
                    "(units s, m, h, d; a number alone is seconds)"
                ) from None
            seconds = sum(float(number) * UNITS[unit] for number, unit in _PART.findall(text))
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{key}={value!r} must be a positive duration")
    return seconds


def parse_sweep_budget(value) -> float | None:
    return parse_budget(value, "trainer.sweep_budget")


def duration(seconds: float) -> str:
    """A budget as the user would write it (parse_budget's inverse): 30m, 2h, 90s, 1h30m."""
    if seconds >= 60 and seconds % 60 == 0:
        hours, minutes = divmod(int(seconds) // 60, 60)
        return (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return f"{seconds:g}s"


def parse_threads(value) -> int | str:
    """`trainer.threads`: auto (on a CPU the CPUs of this process that other processes leave free, re-decided as the
    load changes; vit/train/thread_fit.py) or a count."""
    ok = value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
    if not ok:
        raise ConfigError(f"trainer.threads={value!r} must be auto or a whole number >= 1")
    return value


LOG_EVERY = 50  # trainer.log_every_n_steps=auto: at most this many batches between log lines
LOG_POINTS = 20  # ... and at least this many logged points over a run that has fewer batches than that allows


def parse_log_every(value) -> int | str:
    """`trainer.log_every_n_steps`: auto (every LOG_EVERY batches, or often enough for LOG_POINTS points in a
    shorter run: a 10-step run logged one point) or a count of batches."""
    ok = value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
    if not ok:
        raise ConfigError(f"trainer.log_every_n_steps={value!r} must be auto or a whole number >= 1")
    return value


def log_interval(setting: int | str, epochs: int, batches_per_epoch: int) -> int:
    """The batches between two log lines for trainer.log_every_n_steps=`setting` over `epochs` of
    `batches_per_epoch` batches (a budget's run: its trainer.epochs bound)."""
    if setting != "auto":
        return int(setting)
    return max(1, min(LOG_EVERY, epochs * batches_per_epoch // LOG_POINTS))


def parse_compile(value) -> bool | str:
    """`trainer.compile`: auto (on for CUDA) | true | false."""
    if value not in (True, False, "auto") or isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError(f"trainer.compile={value!r} must be true, false or auto")
    return value


def parse_resume(value) -> str | None:
    """`trainer.resume`: null | auto | a checkpoint's path (whether it exists is checked with the run's files)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"trainer.resume={value!r} must be null, auto or a path to a checkpoint")
    return str(value)  # a file named 2024 is a path too


# trainer.amp's choices, also those of the tools' amp= (vit-eval, vit-predict).
AmpMode = Literal["auto", "bf16", "fp16", "none"]
AMP_MODES: tuple[str, ...] = typing.get_args(AmpMode)
MallocMode = Literal["auto", "reuse", "system"]  # trainer.malloc (vit/runtime/host_memory.py)


@dataclass(frozen=True)
class ProgressiveResize(Settings):
    """Progressive resizing: the first epochs train on smaller images (fewer tokens), growing linearly to
    data.img_size; evaluation is always at full size. ViT models only (their position table is resampled)."""

    group: ClassVar[str] = "trainer.progressive_resize"

    # null: off | the first epochs' image size, a multiple of the patch size (e.g. 16 or 24 for CIFAR); its range,
    # [1, data.img_size], is checked with the data's size (vit/train/config.py)
    min_size: int | None = knob(None)
    start: float = knob(0.0, low=0.0, high=1.0)  # fraction of trainer.epochs at which the size starts to grow
    end: float = knob(0.5, low=0.0, high=1.0)  # fraction of trainer.epochs at which it reaches data.img_size


parse_widths = whole_numbers("trainer.width_by_budget.widths", "width", "[96,144]")


def parse_long_overrides(value) -> tuple[str, ...]:
    """trainer.width_by_budget.long_overrides: a list of texts (each one override, checked with the config), or
    null for none."""
    value = as_given(value)
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"trainer.width_by_budget.long_overrides={value!r} must be a list of overrides, e.g. "
            "'[data.augment.auto_augment=autoaug]'"
        )
    return tuple(value)


@dataclass(frozen=True)
class WidthByBudget(Settings):
    """With trainer.budget, the model's width picked from how fast this machine trains each of `widths`: the
    widest whose estimated epochs in the budget reach `min_epochs`, else the narrowest (vit/train/width_choice.py).
    The heads keep the configured model's head width."""

    group: ClassVar[str] = "trainer.width_by_budget"

    # null: off (the model as configured) | model.embed_dim values to pick from, e.g. [96, 144], each a multiple of
    # the configured model's head width (model.embed_dim / model.num_heads)
    widths: tuple[int, ...] | None = knob(None, parse=parse_widths)
    # the epochs the budget must buy a width (estimated from its timed steps) for it to be picked over a narrower one
    min_epochs: float = knob(16.0, low=0.0)
    # null: off | the epochs the budget must buy the picked width for the run to train with `long_overrides` too:
    # what pays only in a long run (a stronger augmentation, where a short run is under-fitted)
    long_epochs: float | None = knob(None, low=0.0)
    # overrides of data.*, model.*, optim.* or sched.* keys in Hydra's grammar, e.g.
    # ["data.augment.auto_augment=autoaug", "model.drop_path_rate=0.1"]; checked with the config as if given
    long_overrides: tuple[str, ...] = knob((), parse=parse_long_overrides)


@dataclass(frozen=True)
class TrainerSettings(Settings):
    group: ClassVar[str] = "trainer"

    epochs: int = knob(100, low=1, text="must be positive")  # with trainer.budget: the upper bound
    # null | a wall-clock budget for the whole run, process start to the end of the final test: 90s, 30m, 2h, 1h30m,
    # '1h 30m' or seconds (parse_budget's grammar); the run measures its speed, plans as many steps as fit (the lr
    # decay ends on the last) and re-plans when the speed drifts (vit/train/budget.py). Read as seconds.
    budget: float | None = knob(None, parse=parse_budget)
    # null | one budget for a whole sweep (train.py -m), in parse_budget's grammar: its first job fits whole epochs
    # to its share and every other job trains those epochs, so the jobs compare equal training
    # (vit/train/sweep_budget.py). Outside a sweep: this run's trainer.budget.
    sweep_budget: float | None = knob(None, parse=parse_sweep_budget)
    device: Literal["auto", "cpu", "cuda"] = knob("auto")  # auto: the GPU where there is one, else the CPU
    # how a torchrun launch shares the work: ddp (every rank holds the whole model, gradients averaged) | fsdp (FSDP2:
    # each encoder block and the root sharded over the ranks, parameters, gradients and optimizer state alike;
    # checkpoints are sharded folders, vit/train/sharded.py). fsdp without torchrun runs as world size 1.
    strategy: Literal["ddp", "fsdp"] = knob("ddp")
    # fsdp: free each block's gathered parameters after its forward and gather them again for the backward (ZeRO-3,
    # the least memory) | false: keep them to the backward (ZeRO-2: one all-gather a step fewer, more memory)
    reshard_after_forward: bool = knob(True)
    # auto: bf16 where the device has it natively and it pays, else fp32 (vit/runtime/device.py; an explicit
    # bf16/fp16 the device cannot run natively: one warning line, what runs instead)
    amp: AmpMode = knob("auto")
    # torch's CPU threads: auto (the CPUs other processes leave free, re-read while running) | <n>
    threads: int | str = knob("auto", parse=parse_threads)
    # reuse: glibc's malloc keeps the blocks a step frees for the next step, no page faults (vit/runtime/host_memory.py)
    # | system: its defaults | auto: reuse on a CPU, unless the environment chose an allocator (LD_PRELOAD, MALLOC_*_)
    malloc: MallocMode = knob("auto")
    compile: bool | str = knob("auto", parse=parse_compile)  # auto (on for CUDA) | true | false
    compile_mode: str = knob("default")  # torch.compile mode: default | reduce-overhead | max-autotune
    # model: the whole model in one graph | blocks: each encoder block compiled on its own (regional compilation:
    # the graph is built once and reused by every block, so compiling takes a fraction of the time)
    compile_scope: Literal["model", "blocks"] = knob("model")
    # the seed of the initial weights, the data order and the augmentation
    seed: int = knob(0, low=0, high=2**32, high_open=True, text="must be in [0, 2**32)")
    deterministic: bool = knob(False)  # deterministic kernels only (torch.use_deterministic_algorithms): slower
    resume: str | None = knob(None, parse=parse_resume)  # null | auto | <path to a checkpoint>
    stop_after_epoch: int | None = knob(None, low=1)  # stop (with a checkpoint) after this epoch
    grad_clip: float | None = knob(1.0, low=0.0, low_open=True)  # max gradient norm, null: off
    accum_steps: int = knob(1, low=1)  # gradient accumulation
    ema: bool = knob(True)  # keep an exponential moving average of the weights, evaluated beside them
    ema_decay: float = knob(0.9998, low=0.0, high=1.0, low_open=True, high_open=True)  # the EMA's decay per step
    ema_warmup: bool = knob(True)  # the decay ramps up over the first steps (timm's EMA warmup)
    limit_train_batches: int | None = knob(None, low=1)  # train this many batches an epoch (a quick check)
    limit_val_batches: int | None = knob(None, low=1)  # evaluate this many batches
    # auto: every 50 batches, or often enough for 20 points in a shorter run | <n> batches
    log_every_n_steps: int | str = knob("auto", parse=parse_log_every)
    attn_maps_every_n_epochs: int = knob(10, low=0)  # attention-map images in TensorBoard, 0: off
    # task=mae: original / masked / reconstruction of fixed validation images, 0: off
    recon_images_every_n_epochs: int = knob(10, low=0)
    progress: Literal["auto", "bar", "log"] = knob("auto")  # auto: a bar on a TTY, log lines otherwise
    save_checkpoints: bool = knob(True)  # write checkpoints/last.pt and best.pt after every epoch
    # null | N: also keep the last N epochs' checkpoints, checkpoints/epoch_NNNN.pt (vit-average averages them)
    keep_last: int | None = knob(None, low=1)
    # recompute each encoder block in the backward pass: less activation memory, about one more forward
    grad_checkpointing: bool = knob(False)
    max_bad_steps: int = knob(5, low=1)  # stop after this many consecutive non-finite losses
    val_every_n_epochs: int = knob(1, low=1)  # evaluate after every n-th epoch (and always after the last)
    eval_flip: bool = knob(False)  # test-time augmentation: the mean of each image's and its mirror's probabilities
    # test-time shifted crops: N > 0 also weighs in the image moved N pixels down-right and up-left (zero-filled, as
    # the training pad-crop fills), half the weight on the image as it is and a quarter on each shift
    eval_shift: int = knob(0, low=0)
    progressive_resize: ProgressiveResize = knob(ProgressiveResize())
    width_by_budget: WidthByBudget = knob(WidthByBudget())

    def use_compile(self, device_type: str) -> bool:
        """trainer.compile=auto compiles on CUDA only (on a CPU the compile time outweighs the gain)."""
        return device_type == "cuda" if self.compile == "auto" else bool(self.compile)

    def pauses_after(self, epoch: int) -> bool:
        """trainer.stop_after_epoch: stop (with the checkpoints written) after epoch `epoch` (from 0), before the
        last one."""
        stop = self.stop_after_epoch
        return stop is not None and stop <= epoch + 1 < self.epochs

    def evaluates_after(self, epoch: int) -> bool:
        """trainer.val_every_n_epochs: evaluate after every n-th epoch, and after the last epoch of this process."""
        last_here = epoch + 1 == self.epochs or self.pauses_after(epoch)
        return last_here or (epoch + 1) % self.val_every_n_epochs == 0
