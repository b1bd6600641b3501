"""Checkpoints: written atomically (temporary file, fsync, rename), read with `weights_only=True`. The run
directory's other files (metrics.json) are written the same way, and a run directory that cannot hold them is
named before anything is read.

A checkpoint is a dict of tensors and plain containers:
    model, optimizer, scheduler, scaler, ema: state dicts (ema/scaler may be None)
    rng: torch/CUDA/numpy/python generator states
    epoch (finished epochs), step (optimizer steps), best_score (vit/train/checkpointer.py's Progress),
    class_to_idx, config (resolved, plain),
    history (one dict of metrics per finished epoch)
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from vit.errors import UserError
from vit.models.weights_file import WeightsFileError, first_line, read_weights_file


class CheckpointError(UserError):
    """A checkpoint that cannot be read or does not fit the run: one message naming file and mismatch."""

    kind = "checkpoint"


class OutputError(UserError):
    """The run directory, or a file of it (metrics.json, TensorBoard events), cannot be written: one message naming
    the path and the reason."""

    kind = "output"


def atomic_save(obj: Any, path: str | Path) -> None:
    """Write `obj` to `path` so that a crash at any moment leaves either the old file or the new one.

    The bytes go to a temporary file in the same folder, are flushed to disk, and replace `path` in one
    rename; the folder is synced so the rename itself survives a power cut.
    """
    atomic_write(path, lambda handle: torch.save(obj, handle), "checkpoint", CheckpointError)


def atomic_write_text(text: str, path: str | Path) -> None:
    """`atomic_save` for a text file (metrics.json): a failed write raises OutputError and keeps the old file."""
    atomic_write(path, lambda handle: handle.write(text.encode()), "file", OutputError)


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any], what: str, error: type[ValueError]) -> None:
    """Call `write(handle)` on a temporary file beside `path`, fsync it, rename it over `path`, sync the folder.

    Any failure (a full disk, a read-only or unwritable folder, a file where the folder should be) removes the
    temporary file and raises `error` naming `what`, the path, the reason and the free space there.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        free = free_space(path.parent)  # before the partial file goes: what the write met
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder itself is what failed
        if isinstance(err, (OSError, RuntimeError)):
            # torch.save reports a full disk as a RuntimeError of its zip writer, hence the free space in the message.
            kept = "the previous file is intact" if path.is_file() else "there was no earlier file"
            raise error(
                f"cannot write {what} {str(path)!r}: {write_error_reason(err, path.parent)} ({free} free there); {kept}"
            ) from err
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_error_reason(err: BaseException, folder: Path) -> str:
    """Why writing into `folder` failed, in one line: which path is a file where a folder should be, if one is,
    else the OS's words ("No space left on device", "Permission denied")."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{str(blocker)!r} is a file, not a folder"
    return err.strerror if isinstance(err, OSError) and err.strerror else first_line(err)


PROBE_BYTES = 64 * 1024  # what a run directory must take at once: .hydra/'s config copies, the first events


def check_run_dir(path: str | Path, *, create: bool, setting: str = "") -> None:
    """Make sure `path` can be the run directory: it (or, with `create=False`, the nearest folder that exists on
    its way, where it would be created) takes a file of PROBE_BYTES, which is then removed. Raises OutputError
    naming the path, the setting it came from, the reason and the free space: a file in the way, no write
    permission, a read-only or full disk."""
    path = Path(path)
    folder = path
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        folder = next(p for p in (path, *path.parents) if p.exists())
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.TemporaryFile(dir=folder) as probe:  # no name in the folder, gone when closed
            probe.write(bytes(PROBE_BYTES))
            probe.flush()
    except OSError as err:
        reason = write_error_reason(err, path)
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            reason = f"{reason}: cannot create files in {str(folder)!r}"
        source = f" ({setting})" if setting else ""
        raise OutputError(
            f"cannot use the run directory {str(path)!r}{source}: {reason} ({free_space(path)} free there)"
        ) from err


def free_space(folder: Path) -> str:
    """The free space of the disk holding `folder` (or its nearest existing parent), for error messages."""
    for candidate in (folder, *folder.parents):
        if candidate.is_dir():
            try:
                return f"{shutil.disk_usage(candidate).free / 2**20:,.1f} MiB"
            except OSError:
                break
    return "unknown"


def load_checkpoint(path: str | Path) -> dict:
    try:
        state = read_weights_file(path, "checkpoint")
    except WeightsFileError as err:
        raise CheckpointError(str(err)) from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint {str(path)!r} holds no 'model' state dict")
    return state


def no_ema_message(state: dict, source: str | Path) -> str:
    """Why a checkpoint of this trainer has no EMA weights to evaluate with `ema=true`, in one line."""
    averaged = state.get("averaged_from")
    if averaged:  # scripts/average_checkpoints.py: the average (of EMA or raw weights) is the model's weights
        return (
            f"checkpoint {str(source)!r} holds no separate EMA weights: it is the average of the "
            f"{averaged.get('weights', 'raw')} weights of {len(averaged.get('files', []))} checkpoints "
            "(scripts/average_checkpoints.py), and those are its model weights; leave ema=true out"
        )
    trained = ((state.get("config") or {}).get("trainer") or {}).get("ema")
    why = "trained with trainer.ema=false" if not trained else "the file holds none"
    return f"checkpoint {str(source)!r} has no EMA weights ({why})"


def training_state(
    *, model, optimizer, scheduler, scaler, ema, epoch: int, step: int, best_score: float, class_to_idx, config, history
) -> dict:
    """Everything a resumed run needs to continue exactly where this one is (the layout in the module doc)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "ema": ema.module.state_dict() if ema is not None else None,
        "rng": rng_state(),
        "epoch": epoch,
        "step": step,
        "best_score": best_score,
        "class_to_idx": dict(class_to_idx),
        "config": config,
        "history": list(history),
    }


def restore_training_state(
    state: dict, *, model, optimizer, scheduler, scaler, ema, path, class_to_idx: Mapping[str, int] | None = None
) -> None:
    """Load a `training_state` dict into freshly built objects; a model that does not fit names the file and
    the first differing keys and shapes (another model, another class count), and a checkpoint trained on other
    classes than the data's `class_to_idx` (other names, or the same names in another order) names the first
    index where they part. Every check comes before any weight is loaded."""
    from vit.models.pretrained import describe_mismatch

    weights = state["model"]
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"checkpoint {str(path)!r}: its 'model' entry is not a state dict of tensors")
    missing = [key for key in ("optimizer", "scheduler") if not state.get(key)]
    if missing:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds no {' or '.join(missing)} state: a resume needs a last.pt or best.pt "
            "written by this trainer (a file of weights alone cannot continue a training)"
        )
    saved_config = state.get("config") or {}
    problem = describe_mismatch(weights, model)
    if problem is not None:
        saved = saved_config.get("model", {}).get("name", "another model")
        raise CheckpointError(
            f"checkpoint {str(path)!r} ({saved}) does not fit the configured {type(model).__name__}: {problem}"
        )
    saved_classes = state.get("class_to_idx")
    if saved_classes and class_to_idx:  # older checkpoints, and data without class names, have no map to compare
        difference = class_difference(saved_classes, class_to_idx, path)
        if difference is not None:
            same = set(saved_classes) == set(class_to_idx)
            trained_on = f"the same {len(saved_classes)} classes in another order" if same else "other classes"
            raise CheckpointError(
                f"checkpoint {str(path)!r} was trained on {trained_on} than the data's: {difference}; a resume needs "
                "the data it was trained on"
            )
    saved_optim = (saved_config.get("optim") or {}).get("name")
    if saved_optim and str(saved_optim).lower() != type(optimizer).__name__.lower():
        # The other optimizer's state (momentum buffers for AdamW's moments) would fail at the first step.
        raise CheckpointError(
            f"checkpoint {str(path)!r} was trained with optim.name={saved_optim}, this run uses "
            f"{type(optimizer).__name__}: resume with optim={saved_optim}"
        )
    model.load_state_dict(weights)
    try:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: its optimizer or schedule state does not fit this run: {first_line(err)}"
        ) from err
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    if ema is not None and state.get("ema"):
        ema.module.load_state_dict(state["ema"])
    if state.get("rng"):
        set_rng_state(state["rng"])


def class_difference(saved: Mapping, data: Mapping[str, int], path) -> str | None:
    """The first index at which the checkpoint's class map and the data's name different classes ("index 3 is
    'cat' in the checkpoint but 'dog' in the data"), or None where they agree."""
    try:
        saved_names = {int(index): name for name, index in saved.items()}
    except (AttributeError, TypeError, ValueError):
        raise CheckpointError(
            f"checkpoint {str(path)!r}: its class_to_idx is not a map of class names to indices"
        ) from None
    data_names = {index: name for name, index in data.items()}
    for index in sorted(saved_names.keys() | data_names.keys()):
        ours, theirs = saved_names.get(index), data_names.get(index)
        if ours != theirs:
            return (
                f"index {index} is {'unused' if ours is None else repr(ours)} in the checkpoint but "
                f"{'unused' if theirs is None else repr(theirs)} in the data"
            )
    return None


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(gauss)))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def find_resume_checkpoint(run_dir: Path, runs_root: Path | None, config_match: dict | None) -> Path | None:
    """`trainer.resume=auto`: this run's last.pt, else the newest last.pt under `runs_root` whose saved
    model and data config equal this run's (so rerunning the same command continues it)."""
    own = run_dir / "checkpoints" / "last.pt"
    if own.is_file():
        return own
    if runs_root is None or not runs_root.is_dir():
        return None
    candidates = sorted(runs_root.glob("**/checkpoints/last.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for candidate in candidates:
        if config_match is None:
            return candidate
        try:
            saved = load_checkpoint(candidate).get("config") or {}
        except CheckpointError:
            continue
        if all(saved.get(k) == v for k, v in config_match.items()):
            return candidate
    return None
