"""Which number format a model computes in: `trainer.amp` = auto | bf16 | fp16 | none, decided by one rule for
training, the evaluations during training, `vit-eval`, `vit-predict` and `lab/benchmark.py`.

`auto` (the default) takes bf16 autocast where the device runs it natively and it pays, fp32 everywhere else:
- CUDA: bf16 when the GPU has native bf16 (Ampere and later), else fp32.
- CPU: bf16 when torch reports native bf16 matmuls (AVX512-BF16 or AMX) and the model's shape is one where it
  trained faster: at least `CPU_BF16_MIN_WIDTH` wide over at most `CPU_BF16_FEW_TOKENS` patch tokens, or at least
  `CPU_BF16_MIN_WIDTH_MANY_TOKENS` wide over more. Elsewhere the casts around every matmul cost about what the
  smaller matmuls save, or more. The bars are where bf16 measured faster (docs/BENCHMARKS.md, "bf16 on the
  CPU").
- Anything else: fp32.

A budgeted run that picks its width (trainer.width_by_budget, vit/train/width_choice.py) times fp32 against bf16
on such a CPU instead, and keeps the other precision than this rule's where it ran at least 5% faster.

An explicit setting the device cannot run natively is never dropped in silence: one warning line says what runs
instead (`Precision.substituted`), and the run goes on. bf16 on a CPU without native bf16 still runs (oneDNN or
torch's reference kernels), only slower, so it runs as asked, with that said; fp16 on a CPU runs only where the CPU
has AMX-FP16, else bf16 where native, else fp32.

The choice and its reason are logged once and recorded in metrics.json (`precision`, `precision_reason`)."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from vit.errors import ConfigError

log = logging.getLogger("vit.train")

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
# Where bf16 trained faster than fp32 on a CPU with native bf16 (docs/BENCHMARKS.md, "bf16 on the CPU"): over few
# tokens from the narrowest width measured; over more, from the width every CPU measured gained at.
CPU_BF16_MIN_WIDTH = 32
CPU_BF16_FEW_TOKENS = 64
CPU_BF16_MIN_WIDTH_MANY_TOKENS = 192


@dataclass(frozen=True)
class Precision:
    """What runs: `name` "bf16" | "fp16" | "fp32", why in words, and whether it differs from what was asked."""

    name: str
    reason: str
    substituted: bool = False  # an explicit trainer.amp the device cannot run natively: something else runs

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype, None for fp32 (no autocast)."""
        return DTYPES[self.name]

    def autocast(self, device: torch.device):
        """The context a forward pass runs in."""
        return autocast_to(device, self.dtype)

    def describe(self) -> str:
        return f"precision: {self.name} ({self.reason})"


def autocast_to(device: torch.device, dtype: torch.dtype | None):
    """Autocast to `dtype` on `device`'s type; no autocast (fp32) for None."""
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def cpu_has_native_bf16() -> bool:
    """torch's own check of this CPU: AVX512-BF16 or AMX tiles (the instructions oneDNN's bf16 kernels use)."""
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in checks)


def cpu_has_native_fp16() -> bool:
    return bool(getattr(torch.cpu, "_is_amx_fp16_supported", lambda: False)())


def cuda_has_native_bf16(device: torch.device) -> bool:
    if not torch.cuda.is_available():
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8  # Ampere: the first with bf16 tensor cores (older GPUs only emulate it)


def model_width(model: nn.Module | None) -> int | None:
    """The encoder's width (`embed_dim`), else the widest Linear input; None when there is no model to look at."""
    if model is None:
        return None
    width = getattr(model, "embed_dim", None)
    if isinstance(width, int):
        return width
    widths = [m.in_features for m in model.modules() if isinstance(m, nn.Linear)]
    return max(widths) if widths else None


def model_tokens(model: nn.Module | None) -> int | None:
    """The tokens the encoder sees at the model's own image size (its embedding's `num_patches`: `patch_embed` of a
    ViT, `tokens_to_token` of a T2T-ViT), or None."""
    embed = getattr(model, str(getattr(model, "embed_name", "patch_embed")), None)
    tokens = getattr(embed, "num_patches", None)
    return tokens if isinstance(tokens, int) else None


def choose_precision(setting: str, device: torch.device, model: nn.Module | None = None) -> Precision:
    """The precision `setting` (trainer.amp) gives `model` on `device`, with the reason in words."""
    setting = str(setting)
    device = torch.device(device)
    if setting == "none":
        return Precision("fp32", "trainer.amp=none")
    if setting == "auto":
        return _auto(device, model)
    if device.type == "cuda":
        if setting == "bf16" and not cuda_has_native_bf16(device):
            return Precision("fp32", "trainer.amp=bf16 but this GPU has no native bf16: fp32 runs instead", True)
        return Precision(setting, f"trainer.amp={setting}")
    if device.type != "cpu":
        return Precision("fp32", f"trainer.amp={setting} is not supported on {device.type}: fp32 runs instead", True)
    if setting == "bf16":
        if cpu_has_native_bf16():
            return Precision("bf16", "trainer.amp=bf16")
        return Precision("bf16", "trainer.amp=bf16 on a CPU without native bf16: emulated, likely slower than fp32")
    if cpu_has_native_fp16():
        return Precision("fp16", "trainer.amp=fp16 (this CPU has AMX-FP16)")
    instead = "bf16" if cpu_has_native_bf16() else "fp32"
    return Precision(
        instead, f"trainer.amp=fp16 but this CPU has no native fp16 (AMX-FP16): {instead} runs instead", True
    )


def _auto(device: torch.device, model: nn.Module | None) -> Precision:
    if device.type == "cuda":
        if cuda_has_native_bf16(device):
            return Precision("bf16", "trainer.amp=auto: this GPU has native bf16")
        return Precision("fp32", "trainer.amp=auto: this GPU has no native bf16")
    if device.type != "cpu":
        return Precision("fp32", f"trainer.amp=auto: no autocast rule for {device.type}")
    if not cpu_has_native_bf16():
        return Precision("fp32", "trainer.amp=auto: this CPU has no native bf16 (AVX512-BF16 or AMX)")
    width, tokens = model_width(model), model_tokens(model)
    few = tokens is not None and tokens <= CPU_BF16_FEW_TOKENS
    bar = CPU_BF16_MIN_WIDTH if few else CPU_BF16_MIN_WIDTH_MANY_TOKENS
    over = f"{'at most' if few else 'more than'} {CPU_BF16_FEW_TOKENS} tokens" + ("" if tokens else " or unknown")
    seen = f"{width} wide" + (f" over {tokens} tokens" if tokens is not None else "")
    where = f"the {bar} wide over {over} where bf16 pays on a CPU"
    if width is None or width < bar:
        return Precision("fp32", f"trainer.amp=auto: this CPU has native bf16, but the model is {seen}, under {where}")
    return Precision("bf16", f"trainer.amp=auto: this CPU has native bf16 and the model is {seen}, at least {where}")


def announce(precision: Precision) -> None:
    """Log the choice once: a warning where an explicit setting could not run as asked, else an info line."""
    (log.warning if precision.substituted else log.info)(precision.describe())


def resolve_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available; use trainer.device=auto or cpu")
    return torch.device(setting)
