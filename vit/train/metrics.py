"""What a run records: one history entry per epoch, the per-epoch TensorBoard scalars, the test split's final
evaluation (with data.holdout) and metrics.json."""

from __future__ import annotations

import numpy as np
import torch

from vit.settings import RunSettings
from vit.tasks.build import architecture


def epoch_record(epoch: int, step: int, train: dict, val: dict | None, val_ema: dict | None, elapsed_s: float) -> dict:
    """One entry of the run's history (metrics.json, checkpoints): epoch counted from 1; `elapsed_s` is the run's
    wall time at the end of this epoch's evaluation (from the process start, over resumes). An epoch without an
    evaluation (trainer.val_every_n_epochs) has val_top1/val_top5/val_loss null."""
    record = {
        "epoch": epoch + 1,
        "step": step,
        "elapsed_s": elapsed_s,
        "train_loss": train["loss"],
        "train_img_per_s": train["img_per_s"],
        "train_images": train.get("images"),
        "epoch_seconds": train["seconds"],
        "val_top1": val["top1"] if val else None,
        "val_top5": val["top5"] if val else None,
        "val_loss": val["loss"] if val else None,
    }
    if val_ema:
        record.update(val_ema_top1=val_ema["top1"], val_ema_top5=val_ema["top5"], val_ema_loss=val_ema["loss"])
    return record


def epoch_scalars(
    train: dict, val: dict | None, val_ema: dict | None, device: torch.device, skipped_steps: int
) -> dict:
    """The once-per-epoch TensorBoard scalars (the per-step ones come from the loop's reporter)."""
    scalars = {
        "time/epoch_s": train["seconds"],
        "train/epoch_img_per_s": train["img_per_s"],
        "train/epoch_loss": train["loss"],
    }
    for prefix, result in (("val", val), ("val_ema", val_ema)):  # task=mae: the loss only, no top-1
        if result:
            scalars.update({f"{prefix}/{k}": result[k] for k in ("top1", "top5", "loss") if result[k] is not None})
    if device.type == "cuda":
        scalars["sys/gpu_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if skipped_steps:
        scalars["train/skipped_steps"] = skipped_steps
    return scalars


def epoch_line(
    epoch: int, epochs: int, train: dict, val: dict | None, val_ema: dict | None, img_size, val_name: str
) -> str:
    return (
        f"epoch {epoch + 1}/{epochs}: train loss {train['loss']:.4f}, {train['img_per_s']:,.0f} img/s"
        + (f" at {img_size} px" if img_size is not None else "")
        + f", {train['seconds']:.1f}s"
        + (f"; {val_name} {shown(val)}" if val else "")
        + (f" (EMA {shown(val_ema, short=True)})" if val_ema else "")
    )


def shown(result: dict, short: bool = False) -> str:
    """An evaluation for the console: top-1, or (task=mae) the reconstruction loss."""
    if result["top1"] is not None:
        return f"{result['top1']:.2f}%" if short else f"top-1 {result['top1']:.2f}%"
    return f"{result['loss']:.4f}" if short else f"reconstruction loss {result['loss']:.4f}"


def val_score(result: dict) -> float:
    """Higher is better: top-1, or (task=mae) minus the reconstruction loss. Chooses best.pt."""
    return float(result["top1"]) if result["top1"] is not None else -float(result["loss"])


def chosen_evaluation(val: dict | None, val_ema: dict | None) -> dict | None:
    """The evaluation best.pt is chosen by: the EMA weights' where the run keeps an EMA, as the tools after training
    read a checkpoint's EMA weights by default (vit/deploy/loaded_model.py's EMA_RULE) and timm chooses its best
    checkpoint; else the raw weights'."""
    return val_ema if val_ema is not None else val


def chosen_result(record: dict) -> dict:
    """A history entry's evaluation that best.pt is chosen by, as `chosen_evaluation` picks it."""
    prefix = "val_ema" if record.get("val_ema_loss") is not None else "val"
    return {"top1": record.get(f"{prefix}_top1"), "loss": record[f"{prefix}_loss"]}


def final_test(run) -> dict:
    """Top-1/top-5/loss of the final weights (and the EMA's) on the test split that data.holdout set aside."""
    bundle = run.bundle
    result = run.evaluate(bundle.test_loader)
    test = {"split": bundle.test_name, "top1": result["top1"], "top5": result["top5"], "loss": result["loss"]}
    if run.step_parts.ema is not None:
        ema_result = run.evaluate(bundle.test_loader, ema=True)
        test.update(ema_top1=ema_result["top1"], ema_top5=ema_result["top5"], ema_loss=ema_result["loss"])
    return test


def trained_images(history: list[dict]) -> int | None:
    """The images trained over the run's epochs (all ranks'); None when an epoch's record predates the count (a run
    resumed from an older checkpoint): a partial sum would read as a smaller run."""
    counts = [record.get("train_images") for record in history]
    return None if None in counts else int(sum(counts))


def run_metrics(run) -> dict:
    """metrics.json: the model built (its name, `timm:<name>` for one built from a timm name, and its
    architecture, from the config the checkpoints record), final and best epoch, mean throughput, model size, how
    it ran (loader, precision, compile, threads) with the reasons, and the whole history."""
    cfg, cost, bundle, settings, history = run.cfg, run.setup.cost, run.bundle, run.step_parts, run.progress.history
    evaluated = [r for r in history if r.get("val_loss") is not None]
    best = max(evaluated, key=lambda r: val_score(chosen_result(r))) if evaluated else {}
    built = run.setup.resolved["model"]  # the model built, not the model config composed (vit/train/setup.py)
    return {
        "model": built["name"],
        "architecture": architecture(built),
        "params": cost.params,
        "macs": cost.macs,
        "num_classes": bundle.num_classes,
        "epochs_done": len(history),
        "steps_trained": history[-1]["step"] if history else 0,  # optimizer steps, over resumes
        "images_trained": trained_images(history),
        "final": history[-1] if history else {},
        "best": {
            "val_top1": best.get("val_top1"),
            "val_loss": best.get("val_loss"),
            "val_ema_top1": best.get("val_ema_top1"),
            "val_ema_loss": best.get("val_ema_loss"),
            "epoch": best.get("epoch"),
            "chosen_by": ("val_ema" if best.get("val_ema_loss") is not None else "val") if best else None,
        },
        "task": RunSettings.of(cfg).task,
        "train_img_per_s": float(np.mean([r["train_img_per_s"] for r in history])) if history else None,
        "loader": bundle.loader_kind,
        "loader_reason": bundle.loader_reason,
        "loader_workers": bundle.train_workers,
        "precision": settings.precision.name,
        "precision_reason": settings.precision.reason,
        "compiled": settings.compiled,
        "device": str(settings.device),
        "threads": run.setup.threads,
        "threads_reason": run.setup.threads_reason,
        "host_memory": run.setup.host_memory,
        "width_by_budget": run.setup.width_choice,
        "history": history,
        "val_split": bundle.val_name,
    }
