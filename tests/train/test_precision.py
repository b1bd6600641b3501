"""trainer.amp: the rule that picks bf16 or fp32 (auto), what an explicit setting the device cannot run natively
does, and that a run really computes in what it says (vit/runtime/device.py). The CPU's capabilities are
simulated, so each case runs on any machine."""

import json
import logging

import pytest
import torch
from torch import nn
from trainer_utils import QUICK, TINY_MODEL, compose_config, make_tree

from vit.data.resources import available_cpus
from vit.errors import ConfigError
from vit.runtime import device as precision_module
from vit.runtime.device import (
    CPU_BF16_FEW_TOKENS,
    CPU_BF16_MIN_WIDTH,
    CPU_BF16_MIN_WIDTH_MANY_TOKENS,
    choose_precision,
)
from vit.train import run
from vit.train.config import validate

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


class Wide(nn.Module):
    """Stands in for an encoder: its width, and the tokens its `patch_embed` cuts an image into."""

    def __init__(self, width: int, tokens: int | None = None) -> None:
        super().__init__()
        self.embed_dim = width
        if tokens is not None:
            self.patch_embed = nn.Identity()
            self.patch_embed.num_patches = tokens


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Set whether the simulated CPU has native bf16 (and never native fp16)."""

    def simulate(native: bool) -> None:
        monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: native)
        monkeypatch.setattr(precision_module, "cpu_has_native_fp16", lambda: False)

    return simulate


def test_auto_on_a_bf16_cpu_is_bf16_only_where_the_models_width_and_tokens_paid(cpu_bf16):
    cpu_bf16(True)
    few, many = CPU_BF16_FEW_TOKENS, CPU_BF16_FEW_TOKENS + 1
    # Over few tokens (a CIFAR ViT/4's 64, a ViT/8's 16): bf16 from CPU_BF16_MIN_WIDTH.
    at_bar = choose_precision("auto", CPU, Wide(CPU_BF16_MIN_WIDTH, tokens=few))
    assert (at_bar.name, at_bar.dtype, at_bar.substituted) == ("bf16", torch.bfloat16, False)
    assert f"is {CPU_BF16_MIN_WIDTH} wide over {few} tokens, at least the {CPU_BF16_MIN_WIDTH} wide" in at_bar.reason
    assert choose_precision("auto", CPU, Wide(CPU_BF16_MIN_WIDTH, tokens=few // 4)).name == "bf16"
    narrow = choose_precision("auto", CPU, Wide(CPU_BF16_MIN_WIDTH - 1, tokens=few))
    assert (narrow.name, narrow.dtype) == ("fp32", None)
    assert f"is {CPU_BF16_MIN_WIDTH - 1} wide over {few} tokens, under the {CPU_BF16_MIN_WIDTH} wide" in narrow.reason
    # Over more tokens the bar is wider: a model at the few-token bar trains fp32 there, and the tokens say why.
    more = choose_precision("auto", CPU, Wide(CPU_BF16_MIN_WIDTH_MANY_TOKENS - 1, tokens=many))
    assert more.name == "fp32" and f"over more than {few} tokens where bf16 pays" in more.reason
    assert choose_precision("auto", CPU, Wide(CPU_BF16_MIN_WIDTH_MANY_TOKENS, tokens=many)).name == "bf16"
    # Tokens unknown: the wider bar.
    unknown = choose_precision("auto", CPU, Wide(CPU_BF16_MIN_WIDTH_MANY_TOKENS - 1))
    assert unknown.name == "fp32" and f"more than {few} tokens or unknown" in unknown.reason
    assert choose_precision("auto", CPU, Wide(CPU_BF16_MIN_WIDTH_MANY_TOKENS)).name == "bf16"
    # Without an embed_dim the widest Linear decides.
    assert choose_precision("auto", CPU, nn.Sequential(nn.Linear(256, 8), nn.Linear(8, 2))).name == "bf16"
    assert choose_precision("auto", CPU, nn.Sequential(nn.Linear(16, 8))).name == "fp32"


def test_auto_is_fp32_on_a_cpu_without_native_bf16(cpu_bf16):
    cpu_bf16(False)
    chosen = choose_precision("auto", CPU, Wide(768))
    assert chosen.name == "fp32" and "no native bf16" in chosen.reason


def test_auto_on_cuda_follows_the_gpus_bf16(monkeypatch):
    monkeypatch.setattr(precision_module, "cuda_has_native_bf16", lambda device: True)
    assert choose_precision("auto", CUDA, Wide(32)).name == "bf16"  # no width bar on a GPU
    monkeypatch.setattr(precision_module, "cuda_has_native_bf16", lambda device: False)
    assert choose_precision("auto", CUDA, Wide(768)).name == "fp32"


def test_an_explicit_setting_the_device_cannot_run_says_what_runs_instead(cpu_bf16, monkeypatch):
    cpu_bf16(True)
    fp16 = choose_precision("fp16", CPU, Wide(192))
    assert (fp16.name, fp16.substituted) == ("bf16", True)
    assert "no native fp16" in fp16.reason and "bf16 runs instead" in fp16.reason
    cpu_bf16(False)
    assert choose_precision("fp16", CPU, Wide(192)).name == "fp32"
    # bf16 without native support still runs as asked (emulated), and says it will be slow.
    emulated = choose_precision("bf16", CPU, Wide(32))
    assert (emulated.name, emulated.substituted) == ("bf16", False) and "emulated" in emulated.reason
    monkeypatch.setattr(precision_module, "cuda_has_native_bf16", lambda device: False)
    on_old_gpu = choose_precision("bf16", CUDA, Wide(192))
    assert (on_old_gpu.name, on_old_gpu.substituted) == ("fp32", True)
    assert choose_precision("fp16", CUDA, Wide(192)).name == "fp16"
    assert choose_precision("none", CPU, Wide(4096)).name == "fp32"


def test_config_refuses_an_unknown_amp_and_threads():
    for overrides, message in ((["trainer.amp=fp8"], "trainer.amp='fp8'"), (["trainer.threads=0"], "trainer.threads")):
        with pytest.raises(ConfigError, match=message):
            validate(compose_config([*QUICK, *overrides]))


def linear_output_dtypes(overrides: list[str], tmp_path, name: str) -> tuple[dict, set]:
    """Train the quick run with `overrides`, recording the dtype of every Linear output in training mode."""
    seen = set()

    def hook(module, args, output):
        if isinstance(module, nn.Linear) and module.training and isinstance(output, torch.Tensor):
            seen.add(output.dtype)

    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        metrics = run(compose_config([*QUICK, "trainer=debug", *overrides]), output_dir=tmp_path / name)
    finally:
        handle.remove()
    return metrics, seen


def test_a_cpu_run_under_auto_trains_in_bf16_when_wide_and_says_so(cpu_bf16, tmp_path, caplog):
    cpu_bf16(True)
    # One epoch of 2 batches: bf16 is emulated, and slow, on a CPU without AVX512-BF16 (where the test runs as well).
    # QUICK's images are 32 px in patches of 4: 64 tokens.
    wide = [f"model.embed_dim={CPU_BF16_MIN_WIDTH}", "model.num_heads=2", "model.depth=1", "trainer.epochs=1"]
    wide += ["trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.attn_maps_every_n_epochs=0"]
    with caplog.at_level(logging.INFO, logger="vit.train"):
        metrics, dtypes = linear_output_dtypes(wide, tmp_path, "wide")
    assert dtypes == {torch.bfloat16}  # every matmul of the training forward pass
    assert metrics["precision"] == "bf16" and "trainer.amp=auto" in metrics["precision_reason"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision:")]
    assert lines == [f"precision: bf16 ({metrics['precision_reason']})"]  # once
    written = json.loads((tmp_path / "wide" / "metrics.json").read_text())
    assert written["precision"] == "bf16"

    narrow = CPU_BF16_MIN_WIDTH // 2
    metrics, dtypes = linear_output_dtypes([f"model.embed_dim={narrow}", *wide[1:]], tmp_path, "narrow")
    assert dtypes == {torch.float32}
    assert metrics["precision"] == "fp32" and f"{narrow} wide over 64 tokens, under the" in metrics["precision_reason"]


def test_an_explicit_fp16_on_a_cpu_without_it_warns_once_and_runs_bf16(cpu_bf16, tmp_path, caplog):
    cpu_bf16(True)
    with caplog.at_level(logging.INFO, logger="vit.train"):
        metrics, dtypes = linear_output_dtypes(["trainer.amp=fp16"], tmp_path, "fp16")
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "precision" in r.getMessage()
    ]
    assert len(warnings) == 1 and "bf16 runs instead" in warnings[0]
    assert dtypes == {torch.bfloat16} and metrics["precision"] == "bf16"


def test_the_cpu_loader_and_threads_are_chosen_logged_and_recorded(tmp_path, caplog):
    tree = make_tree(tmp_path / "data", per_class=6, size=32)
    overrides = [
        *TINY_MODEL,
        "trainer=debug",
        "trainer.attn_maps_every_n_epochs=0",
        "data=imagefolder",
        f"data.root={tree}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.img_size=32",
        "data.patch_size=4",
        "data.batch_size=4",
        "data.loader=auto",
    ]
    with caplog.at_level(logging.INFO):
        metrics = run(compose_config(overrides), output_dir=tmp_path / "auto")
    # Decoded once into memory, on the CPU too: no workers decode again each epoch, every CPU goes to the step.
    assert metrics["loader"] == "resident" and "the device is cpu" in metrics["loader_reason"]
    assert 1 <= metrics["threads"] <= available_cpus() and "of this process" in metrics["threads_reason"]
    messages = [r.getMessage() for r in caplog.records]
    assert f"threads: {metrics['threads']} ({metrics['threads_reason']})" in messages

    with caplog.at_level(logging.INFO):
        metrics = run(
            compose_config([*overrides, "data.loader=torch", "data.num_workers=1", "trainer.threads=auto"]),
            output_dir=tmp_path / "torch",
        )
    # The loader's workers leave the step its threads (measured faster than giving them a core each).
    assert metrics["loader"] == "torch" and 1 <= metrics["threads"] <= available_cpus()  # as many as are free
    assert metrics["loader_workers"] == 1
    metrics = run(compose_config([*overrides, "trainer.threads=1"]), output_dir=tmp_path / "one")
    assert metrics["threads"] == 1 and metrics["threads_reason"].startswith("trainer.threads=1, as given; ")
