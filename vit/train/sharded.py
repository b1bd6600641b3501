"""Checkpoints of a sharded run (`trainer.strategy=fsdp`): every rank writes its own shards in parallel through
torch.distributed.checkpoint (DCP), and any number of processes reads them back (DCP reshards on load).

In the run's checkpoints/ folder, each checkpoint is a folder and the usual names point at it:
    sharded/step_<step>_<id>/    DCP's files for "model", "optimizer" and "ema", and training.pt (rank 0, written
                                 last: schedule, step, epoch, RNG, config, classes, history, budget, parameter
                                 groups; layout in vit/weights/sharded.py)
    last.pt, best.pt, epoch_NNNN.pt   symbolic links to such folders (relative: the run folder can move)

A new checkpoint is written into a new folder; only when training.pt is in place does last.pt switch to it, in one
rename of a link. A process killed at any moment leaves last.pt on a complete checkpoint, as a single file's
atomic write does. Folders no name points at any more are then removed.

Every consumer of a checkpoint reads the folder through the one reader of weight files (a whole dict in one
process, vit/weights/sharded.py): evaluate, predict, export, average, `model.pretrained=<last.pt>`, and
`vit-consolidate`, which writes it as one file. A sharded run resumes from one with `resume_sharded` below.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from vit.records.files import atomic_save
from vit.runtime.distributed import Distributed
from vit.runtime.sharding import reshard
from vit.weights.files import read_weights_file
from vit.weights.read import CheckpointError
from vit.weights.sharded import TRAINING_FILE, SafeReader, dcp_reason, is_sharded_checkpoint

SHARDED_DIR = "sharded"
OPTIMIZER_KEYS = "names"  # training.pt's "optimizer_keys": its optimizer state is keyed by parameter name


def split_optimizer_state(state: dict) -> tuple[dict, dict]:
    """An optimizer state dict keyed by parameter name -> (its tensors: {name: {key: tensor}}, the rest: the
    parameter groups and any value that is not a tensor), so DCP holds tensors alone."""
    tensors, others = {}, {}
    for name, values in state.get("state", {}).items():
        tensors[name] = {key: value for key, value in values.items() if isinstance(value, torch.Tensor)}
        rest = {key: value for key, value in values.items() if not isinstance(value, torch.Tensor)}
        if rest:
            others[name] = rest
    return tensors, {"state": others, "param_groups": state.get("param_groups", [])}


def sharded_tensors(model, optimizer, ema) -> tuple[dict, dict]:
    """(what DCP writes, the optimizer's non-tensor part). Every rank must call it (it is collective)."""
    for module in (model, ema.module if ema is not None else None):
        if module is not None:
            reshard(module)  # the parameters the optimizer holds: the sharded ones
    optimizer_tensors, optimizer_rest = split_optimizer_state(get_optimizer_state_dict(model, optimizer))
    tensors = {"model": get_model_state_dict(model), "optimizer": optimizer_tensors}
    if ema is not None:
        tensors["ema"] = get_model_state_dict(ema.module)
    return tensors, optimizer_rest


def point(link: Path, target: Path) -> None:
    """Make `link` a symbolic link to `target` (relative), replacing whatever `link` was in one rename."""
    temporary = link.with_name(f".{link.name}.link-{os.getpid()}")
    temporary.unlink(missing_ok=True)
    os.symlink(os.path.relpath(target, link.parent), temporary)
    os.replace(temporary, link)


def save_sharded(folder: Path, dist: Distributed, parts: dict, rest: dict, step: int, names: list[str]) -> Path:
    """Write one checkpoint (every rank calls it): `parts` (model, optimizer, ema) through DCP, `rest` as
    training.pt, then point each of `names` (last.pt, best.pt, epoch_NNNN.pt) at it. Returns its folder."""
    name = dist.broadcast(f"step_{step:08d}_{time.time_ns():x}")  # rank 0's clock names it for all
    target = folder / SHARDED_DIR / name
    tensors, optimizer_rest = sharded_tensors(parts["model"], parts["optimizer"], parts["ema"])
    try:
        dcp.save(tensors, storage_writer=FileSystemWriter(target))
    except (Exception, CheckpointException) as err:  # a full or read-only disk on any rank: DCP gathers them
        raise CheckpointError(f"cannot write sharded checkpoint {str(target)!r}: {dcp_reason(err)}") from None
    if dist.is_main:
        atomic_save({**rest, "optimizer": optimizer_rest, "optimizer_keys": OPTIMIZER_KEYS}, target / TRAINING_FILE)
        for link in names:
            point(folder / link, target)
        remove_unnamed(folder)
    if torch_dist.is_initialized():
        torch_dist.barrier()  # no rank reads or writes the next checkpoint before this one is named
    return target


def remove_unnamed(folder: Path) -> None:
    """Remove the checkpoint folders under sharded/ that no name in `folder` points at (replaced, or an epoch
    file removed by trainer.keep_last)."""
    named = {path.resolve() for path in folder.iterdir() if path.is_symlink()}
    for candidate in (folder / SHARDED_DIR).iterdir():
        if candidate.resolve() not in named:
            shutil.rmtree(candidate, ignore_errors=True)


def resume_sharded(path: Path, parts: dict, check) -> dict:
    """Load the sharded checkpoint `path` into the sharded model, optimizer and EMA of `parts`, each rank reading
    its own shards (any number of ranks: DCP reshards). `check(rest, shapes)` runs before anything is loaded, with
    training.pt's dict and the model's saved shapes ({name: meta tensor}). Returns training.pt's dict."""
    if not is_sharded_checkpoint(path):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is a single file, written without sharding: a trainer.strategy=fsdp run "
            f"resumes a sharded checkpoint folder; resume this one with trainer.strategy=ddp, or start from its "
            f"weights with model.pretrained={path}"
        )
    if not (path / TRAINING_FILE).is_file():
        raise CheckpointError(f"sharded checkpoint {str(path)!r} has no {TRAINING_FILE}: the folder is incomplete")
    rest = read_weights_file(path / TRAINING_FILE, "checkpoint")
    reader = SafeReader(path)
    metadata = reader.read_metadata()
    shapes = {
        key.removeprefix("model."): torch.empty(item.size, device="meta")
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith("model.")
    }
    check(rest, shapes)
    model, optimizer, ema = parts["model"], parts["optimizer"], parts["ema"]
    tensors, _ = sharded_tensors(model, optimizer, ema)  # the shards of this run, for DCP to fill in place
    if ema is not None and not any(key.startswith("ema.") for key in metadata.state_dict_metadata):
        tensors.pop("ema")  # a run without an EMA resumed with one: the EMA starts from the weights (below)
    try:
        dcp.load(tensors, storage_reader=SafeReader(path))
    except (Exception, CheckpointException) as err:
        raise CheckpointError(f"sharded checkpoint {str(path)!r} does not load: {dcp_reason(err)}") from None
    set_model_state_dict(model, tensors["model"])
    saved_optimizer = rest.get("optimizer") or {}
    others = saved_optimizer.get("state", {})
    state = {name: {**values, **others.get(name, {})} for name, values in tensors["optimizer"].items()}
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": saved_optimizer["param_groups"]})
    if ema is not None:
        set_model_state_dict(ema.module, tensors.get("ema") or get_model_state_dict(model))
    return rest
