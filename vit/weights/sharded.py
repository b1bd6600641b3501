"""Reading a sharded checkpoint: the folder `trainer.strategy=fsdp` writes (vit/train/sharded.py), as one dict of
whole tensors, the layout of a single-file checkpoint (vit/train/checkpoints.py), in one process.

A sharded checkpoint is a folder of torch.distributed.checkpoint (DCP) files:
    .metadata                  DCP's index: every tensor's global shape, dtype and where its pieces lie
    __<rank>_<n>.distcp        the pieces each rank wrote: "model", "optimizer" (the state's tensors) and "ema"
    training.pt                everything else (schedule, step, epoch, RNG, config, classes, history, the optimizer's
                               parameter groups): written last, so a folder without it is incomplete

What is read runs no code: the tensors through `torch.load(weights_only=True)` (DCP's reader), training.pt as
well, and DCP's index (a pickle) through an unpickler that builds only DCP's own metadata classes, torch's dtypes
and sizes. DCP can also store pickled objects of any kind ("bytes" items), which it would read with
`weights_only=False`; this trainer writes none, and a folder holding one is refused, not read.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

METADATA = ".metadata"
TRAINING_FILE = "training.pt"

# What DCP's index may build when unpickled: its metadata classes and the few torch and pathlib names they hold.
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class ShardedFileError(ValueError):
    """A sharded checkpoint folder that cannot be read: why, in one line (the caller names the folder)."""


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        is_torch_type = module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype))
        if is_torch_type or name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise ShardedFileError(f"its {METADATA} asks to build {module}.{name}, which a DCP index never holds")


class SafeReader(FileSystemReader):
    """DCP's file reader whose index is unpickled by `_IndexUnpickler` (nothing but DCP's metadata is built)."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        path = Path(self.path) / METADATA
        try:
            metadata = _IndexUnpickler(io.BytesIO(path.read_bytes())).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, IndexError) as err:
            raise ShardedFileError(f"its {METADATA} is not a DCP index ({type(err).__name__})") from None
        if not isinstance(metadata, Metadata):
            raise ShardedFileError(f"its {METADATA} is not a DCP index")
        if getattr(metadata, "storage_meta", None) is None:  # an index written by an older torch
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether `path` (a symlink to one included) is a sharded checkpoint folder."""
    path = Path(path)
    return path.is_dir() and (path / METADATA).is_file()


def tensor_template(metadata: Metadata) -> dict:
    """Empty whole tensors, nested as the checkpoint saved them ({"model": {name: tensor}, "optimizer": {name:
    {"exp_avg": tensor}}, ...}), for DCP to fill. A pickled ("bytes") item is refused (the module doc says why)."""
    nested: dict = {}
    for key, item in metadata.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            raise ShardedFileError(f"it holds a pickled object ({key!r}), which is read only by running it")
        path = (metadata.planner_data or {}).get(key, (key,))
        node = nested
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = torch.empty(item.size, dtype=item.properties.dtype)
    return nested


def merge_tensors(state: dict, tensors: dict) -> dict:
    """training.pt's dict with the tensors of the DCP files put back in their places: the model's and EMA's state
    dicts whole, the optimizer's tensors into its state beside the values training.pt kept."""
    state["model"] = tensors.get("model", {})
    state["ema"] = tensors.get("ema")
    optimizer = state.get("optimizer") or {"state": {}, "param_groups": []}
    for name, values in (tensors.get("optimizer") or {}).items():
        optimizer.setdefault("state", {}).setdefault(name, {}).update(values)
    state["optimizer"] = optimizer
    return state


def read_sharded_checkpoint(path: str | Path, read_file) -> dict:
    """The checkpoint in folder `path` as one dict of whole tensors on the CPU (the layout of a single-file
    checkpoint, its optimizer state keyed by parameter name). `read_file(path)`: the reader of training.pt (the
    one reader of weight files, for its messages). Raises ShardedFileError with the reason."""
    path = Path(path)
    training = path / TRAINING_FILE
    if not training.is_file():
        raise ShardedFileError(f"it has no {TRAINING_FILE}: the folder is incomplete (a write that did not finish)")
    state = read_file(training)
    if not isinstance(state, dict):
        raise ShardedFileError(f"its {TRAINING_FILE} is not a checkpoint's dict")
    reader = SafeReader(path)
    tensors = tensor_template(reader.read_metadata())
    try:
        with warnings.catch_warnings():  # DCP says that a load without a process group is one process's: it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(tensors, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as err:  # a missing or truncated piece (DCP's is a BaseException)
        raise ShardedFileError(f"its tensors cannot be read ({dcp_reason(err)})") from None
    return merge_tensors(state, tensors)


def dcp_reason(err: BaseException) -> str:
    """Why a DCP load or save failed, in one line: the first rank's own exception, not DCP's wrapper around every
    rank's traceback."""
    if isinstance(err, CheckpointException) and err.failures:
        failure = next(iter(err.failures.values()))
        err = failure[0] if isinstance(failure, tuple) else failure
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")
