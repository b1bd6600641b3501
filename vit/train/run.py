"""`run(cfg)`: one training run from a composed config, start (or resume) to `metrics.json`.

Order of events: validate the config and build the model (no data touched yet) -> data -> optimizer,
schedule, EMA, AMP, compile -> resume -> for each epoch: train, evaluate (raw and EMA), log, checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from timm.utils import ModelEmaV3

from vit.data import build_data
from vit.models import complexity
from vit.train.checkpoint import (
    CheckpointError,
    atomic_save,
    find_resume_checkpoint,
    load_checkpoint,
    rng_state,
    set_rng_state,
)
from vit.train.config import ConfigError, build_model_from_config, resolve_device, validate
from vit.train.logger import Console, TensorBoard
from vit.train.loop import StepContext, evaluate, train_one_epoch
from vit.train.optim import build_optimizer, build_scheduler, scaled_lr

log = logging.getLogger("vit.train")

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    """Every epoch draws its randomness from (seed, epoch) alone, so a resumed run repeats exactly what an
    uninterrupted one would have done."""
    return seed * 100_003 + epoch


def set_loader_epoch(loader, sampler, seed: int, epoch: int) -> None:
    if hasattr(loader, "set_epoch"):  # the GPU-resident loader
        loader.set_epoch(epoch)
    if sampler is not None:
        sampler.set_epoch(epoch)
    generator = getattr(loader, "generator", None)
    if generator is not None:  # torch DataLoader: its shuffle order and worker seeds come from here
        generator.manual_seed(epoch_seed(seed, epoch))


def hydra_output_dir() -> Path | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):
        return None


def run(cfg: DictConfig, output_dir: str | Path | None = None) -> dict:
    """Train as `cfg` says; write checkpoints, TensorBoard events and metrics.json into the run directory."""
    wall_start = time.perf_counter()
    validate(cfg)
    run_dir = Path(output_dir) if output_dir is not None else hydra_output_dir()
    if run_dir is None:
        raise ConfigError("no run directory: call run(cfg, output_dir=...) or start through train.py")
    run_dir.mkdir(parents=True, exist_ok=True)
    tcfg = cfg.trainer
    device = resolve_device(tcfg.device)
    seed = int(tcfg.seed)
    seed_everything(seed)
    if tcfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
        torch.backends.cudnn.benchmark = False
    elif device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # The model first: a bad model setting fails here, before any data is read.
    num_classes_cfg = cfg.model.get("num_classes")
    model = build_model_from_config(cfg.model, num_classes=num_classes_cfg or 1000)
    bundle = build_data(cfg.data, device=device, seed=seed)
    if num_classes_cfg is None and getattr(model, "num_classes", None) != bundle.num_classes:
        model = build_model_from_config(cfg.model, num_classes=bundle.num_classes)
    model = model.to(device)
    cost = complexity(model)
    log.info("%s: %.2f M params, %.3f GMACs per image", cfg.model.name, cost.params / 1e6, cost.macs / 1e9)

    accum = int(tcfg.accum_steps)
    global_batch = int(cfg.data.batch_size) * accum
    lr = scaled_lr(cfg.optim, global_batch)
    optimizer = build_optimizer(model, cfg.optim, lr, device)
    train_batches = len(bundle.train_loader)
    if tcfg.limit_train_batches:
        train_batches = min(train_batches, int(tcfg.limit_train_batches))
    steps_per_epoch = max(1, math.ceil(train_batches / accum))
    epochs = int(tcfg.epochs)
    scheduler = build_scheduler(optimizer, cfg.sched, epochs, steps_per_epoch)
    amp_dtype = AMP_DTYPES[tcfg.amp] if device.type == "cuda" else None
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    # EMA warmup (timm): the decay ramps up over the first steps, so short runs get a useful average too.
    ema = (
        ModelEmaV3(model, decay=float(tcfg.ema_decay), use_warmup=bool(tcfg.get("ema_warmup", True)))
        if tcfg.ema
        else None
    )
    use_compile = device.type == "cuda" if str(tcfg.compile) == "auto" else bool(tcfg.compile)
    forward = torch.compile(model, mode=tcfg.compile_mode) if use_compile else model

    resolved = OmegaConf.to_container(cfg, resolve=True)
    start_epoch, best_top1, history = 0, -1.0, []
    ctx = StepContext(
        model=forward,
        raw_model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=bundle.train_criterion,
        device=device,
        amp_dtype=amp_dtype,
        scaler=scaler,
        mixup_fn=bundle.mixup_fn,
        ema=ema,
        grad_clip=float(tcfg.grad_clip) if tcfg.grad_clip else None,
        accum_steps=accum,
        log_every=int(tcfg.log_every_n_steps),
        max_bad_steps=int(tcfg.max_bad_steps),
    )

    resume_path = None
    if tcfg.resume == "auto":
        match = {"model": resolved["model"], "data": resolved["data"]}
        # Other runs are searched only in Hydra's default layout, outputs/<date>/<time>: a run folder chosen by
        # hand (hydra.run.dir=...) resumes from its own checkpoints only.
        runs_root = run_dir.parent.parent if run_dir.parent.parent.name == "outputs" else None
        resume_path = find_resume_checkpoint(run_dir, runs_root, match)
        if resume_path is None:
            log.info("trainer.resume=auto: no checkpoint of this run found, starting fresh")
    elif tcfg.resume:
        resume_path = Path(str(tcfg.resume))
    if resume_path is not None:
        state = load_checkpoint(resume_path)
        restore(state, model, optimizer, scheduler, scaler, ema, resume_path)
        start_epoch, ctx.step = int(state["epoch"]), int(state["step"])
        best_top1 = float(state.get("best_top1", -1.0))
        history = list(state.get("history", []))
        log.info("resumed from %s at epoch %d (step %d)", resume_path, start_epoch, ctx.step)

    tb = TensorBoard(str(run_dir / "tb"))
    console = Console(str(tcfg.progress))
    ckpt_dir = run_dir / "checkpoints"
    fixed_images = first_val_images(bundle, 4)
    train_stats: dict = {}
    val, val_ema = {}, None
    stop_after = int(tcfg.stop_after_epoch) if tcfg.stop_after_epoch else None
    stop = StopSignal()
    ctx.stop_requested = stop.requested
    previous_handlers = stop.install()
    try:
        for epoch in range(start_epoch, epochs):
            seed_everything(epoch_seed(seed, epoch))
            set_loader_epoch(bundle.train_loader, bundle.train_sampler, seed, epoch)
            console.start_epoch(epoch, epochs, train_batches)

            def on_log(step_in_epoch: int, values: dict, epoch=epoch) -> None:
                tb.scalars(values, ctx.step)
                console.update(
                    step_in_epoch, ctx.step, values["train/loss"], values["train/lr"], values["train/img_per_s"]
                )

            train_stats = train_one_epoch(
                ctx, bundle.train_loader, limit_batches=tcfg.limit_train_batches, on_log=on_log
            )
            if stop.signum is not None:
                # The epoch is unfinished: its partial progress is dropped and last.pt stays the checkpoint of
                # the last finished epoch, so a resumed run redoes this epoch exactly as it would have run.
                print(
                    f"stopped by {signal.Signals(stop.signum).name} during epoch {epoch + 1} at step {ctx.step}; "
                    f"checkpoint of epoch {epoch} kept in {ckpt_dir}. Resume with the same command plus "
                    "trainer.resume=auto",
                    flush=True,
                )
                break
            limit_val = tcfg.limit_val_batches
            val = evaluate(model, bundle.val_loader, device, amp_dtype, limit_val)
            val_ema = evaluate(ema.module, bundle.val_loader, device, amp_dtype, limit_val) if ema else None
            record = {
                "epoch": epoch + 1,
                "step": ctx.step,
                "train_loss": train_stats["loss"],
                "train_img_per_s": train_stats["img_per_s"],
                "epoch_seconds": train_stats["seconds"],
                "val_top1": val["top1"],
                "val_top5": val["top5"],
                "val_loss": val["loss"],
            }
            if val_ema:
                record.update(val_ema_top1=val_ema["top1"], val_ema_top5=val_ema["top5"], val_ema_loss=val_ema["loss"])
            history.append(record)
            scalars = {
                "val/top1": val["top1"],
                "val/top5": val["top5"],
                "val/loss": val["loss"],
                "time/epoch_s": train_stats["seconds"],
                "train/epoch_img_per_s": train_stats["img_per_s"],
                "train/epoch_loss": train_stats["loss"],
            }
            if val_ema:
                scalars.update({f"val_ema/{k}": val_ema[k] for k in ("top1", "top5", "loss")})
            if device.type == "cuda":
                scalars["sys/gpu_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            if ctx.skipped_steps:
                scalars["train/skipped_steps"] = ctx.skipped_steps
            tb.scalars(scalars, ctx.step)
            every = int(tcfg.attn_maps_every_n_epochs or 0)
            if every and fixed_images is not None and ((epoch + 1) % every == 0 or epoch + 1 == epochs):
                log_attention_maps(tb, model, fixed_images, bundle, ctx.step)
            console.end_epoch(
                f"epoch {epoch + 1}/{epochs}: train loss {train_stats['loss']:.4f}, "
                f"{train_stats['img_per_s']:,.0f} img/s, {train_stats['seconds']:.1f}s; "
                f"val top-1 {val['top1']:.2f}%" + (f" (EMA {val_ema['top1']:.2f}%)" if val_ema else "")
            )
            is_best = val["top1"] > best_top1
            best_top1 = max(best_top1, val["top1"])
            if tcfg.save_checkpoints:
                state = checkpoint_state(
                    model, optimizer, scheduler, scaler, ema, epoch + 1, ctx.step, best_top1, bundle, resolved, history
                )
                atomic_save(state, ckpt_dir / "last.pt")
                if is_best:
                    atomic_save(state, ckpt_dir / "best.pt")
            if stop_after is not None and epoch + 1 >= stop_after and epoch + 1 < epochs:
                log.info("trainer.stop_after_epoch=%d reached; continue with trainer.resume=auto", stop_after)
                break
    except BaseException:
        tb.close()
        raise
    finally:
        stop.restore(previous_handlers)
    best = max(history, key=lambda r: r["val_top1"]) if history else {}
    metrics = {
        "model": cfg.model.name,
        "params": cost.params,
        "macs": cost.macs,
        "epochs_done": len(history),
        "final": history[-1] if history else {},
        "best": {"val_top1": best.get("val_top1"), "epoch": best.get("epoch")},
        "train_img_per_s": float(np.mean([r["train_img_per_s"] for r in history])) if history else None,
        "wall_time_s": time.perf_counter() - wall_start,
        "loader": bundle.loader_kind,
        "compiled": use_compile,
        "device": str(device),
        "history": history,
        "stopped_by_signal": signal.Signals(stop.signum).name if stop.signum is not None else None,
    }
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    final = history[-1] if history else {}
    tb.hparams(
        flat_hparams(resolved),
        {"val_top1": final.get("val_top1", 0.0), "best_val_top1": best.get("val_top1", 0.0)},
    )
    tb.close()
    return metrics


class StopSignal:
    """SIGTERM/SIGINT: the first asks the loop to stop after the current step; a second one exits at once."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise SystemExit(128 + signum)
        self.signum = signum
        print(
            f"{signal.Signals(signum).name} received: stopping after this step (send it again to exit now)", flush=True
        )

    def install(self) -> dict:
        previous = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread (e.g. a notebook worker): no handlers, no graceful stop
                pass
        return previous

    @staticmethod
    def restore(previous: dict) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def restore(state, model, optimizer, scheduler, scaler, ema, path) -> None:
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit the configured model: {err}") from err
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    if ema is not None and state.get("ema"):
        ema.module.load_state_dict(state["ema"])
    if state.get("rng"):
        set_rng_state(state["rng"])


def checkpoint_state(model, optimizer, scheduler, scaler, ema, epoch, step, best_top1, bundle, config, history):
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "ema": ema.module.state_dict() if ema is not None else None,
        "rng": rng_state(),
        "epoch": epoch,
        "step": step,
        "best_top1": best_top1,
        "class_to_idx": dict(bundle.class_to_idx),
        "config": config,
        "history": history,
    }


def first_val_images(bundle, count: int):
    try:
        images, _ = next(iter(bundle.val_loader))
    except StopIteration:
        return None
    return images[:count]


def log_attention_maps(tb: TensorBoard, model, images: torch.Tensor, bundle, step: int) -> None:
    """The figure of scripts/visualize_attention.py for fixed validation images, as a TensorBoard image."""
    import io

    import numpy as np
    from PIL import Image

    from vit.analysis.attention_maps import attention_views
    from vit.analysis.figures import attention_grid_figure

    device = next(model.parameters()).device
    views = attention_views(model, images.to(device))
    mean = torch.tensor(bundle.mean).view(1, 3, 1, 1)
    std = torch.tensor(bundle.std).view(1, 3, 1, 1)
    pictures = (images.cpu().float() * std + mean).clamp(0, 1)
    buffer = io.BytesIO()
    attention_grid_figure(pictures, views["heads"], views["rollout"], buffer, token_maps=views.get("token_stage"))
    picture = np.array(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
    tb.image("attention/heads_and_rollout", torch.from_numpy(picture).permute(2, 0, 1), step)


def flat_hparams(config: dict, prefix: str = "") -> dict:
    """Nested config -> {"model.num_heads": 3, ...} for TensorBoard's HPARAMS view (model/optim/sched/data)."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            if prefix or key in ("model", "optim", "sched", "data"):
                out.update(flat_hparams(value, f"{name}."))
        elif not isinstance(value, list):
            out[name] = "null" if value is None else value
    if not prefix:
        trainer = config.get("trainer", {})
        out.update({f"trainer.{k}": trainer.get(k) for k in ("epochs", "seed", "amp") if k in trainer})
    return out
