"""The folder a run of `train.py` goes to, made by Hydra before the run starts: what existed of it beforehand
(RunFolders, a Hydra callback), the folder a refused run made taken away again (forget_refused_run), and the line
that ends a run written to its log (log_in_run_folder)."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from hydra.experimental.callback import Callback

from vit.records.sweep_files import SWEEP_FILE


@dataclasses.dataclass(frozen=True)
class NewFolders:
    """What existed, before Hydra made anything, of the folder a command's runs go to (hydra.run.dir, or a sweep's
    hydra.sweep.dir holding one folder per job)."""

    top: str  # the folder, absolute
    existed: bool
    entries: frozenset[str]  # a sweep folder that existed: what it held (an earlier sweep's job folders)
    keep: str  # its nearest ancestor that existed: emptied parents are removed up to it, never it


NEW_FOLDERS: dict[str, NewFolders] = {}  # by `top`, noted by RunFolders for this command's runs


def note_folder(path) -> None:
    top = os.path.abspath(str(path))
    keep = Path(top)
    while not keep.exists() and keep != keep.parent:
        keep = keep.parent
    entries = frozenset(os.listdir(top)) if os.path.isdir(top) else frozenset()
    NEW_FOLDERS[top] = NewFolders(top, os.path.exists(top), entries, str(keep))


class RunFolders(Callback):
    """A Hydra callback (configs/config.yaml: hydra.callbacks.run_folders): before Hydra makes a run's folder, it
    notes whether the folder, or a sweep's, existed, so that a run refused before it wrote anything of its own can
    take away the folder made for it (forget_refused_run) and never one the user named that was there before. The
    folder's name is resolved here from the config the run then uses, so the ${now:...} in it is the same."""

    def on_run_start(self, config, **kwargs) -> None:
        note_folder(config.hydra.run.dir)

    def on_multirun_start(self, config, **kwargs) -> None:
        note_folder(config.hydra.sweep.dir)

    def on_run_end(self, config, **kwargs) -> None:
        NEW_FOLDERS.clear()

    def on_multirun_end(self, config, **kwargs) -> None:
        NEW_FOLDERS.clear()


def forget_refused_run(err: BaseException) -> None:
    """A run refused (a setting, the data, a checkpoint) leaves no folder behind when it wrote nothing of its own:
    Hydra made the folder and wrote its config copy (.hydra/) and the log before the task started, so without this
    every refused command left an outputs/<date>/<time>/ whose log does not even hold the error. The folder goes
    where it holds only those and this command made it (RunFolders), and so do the parents it emptied that this
    command made (outputs/<date>/, a sweep's folder holding only its multirun.yaml). A folder kept, holding
    checkpoints, TensorBoard events or metrics, or the user's own from before, gets the error line in its log."""
    import shutil

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    noted_folders = list(NEW_FOLDERS.values())
    NEW_FOLDERS.clear()  # this command's: a later run in this process (a test, a notebook) notes its own
    if not HydraConfig.initialized() or not noted_folders:
        return
    hydra_cfg = HydraConfig.get()
    output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None, throw_on_missing=False)
    if not output_dir:  # Hydra's compose API sets its config without a folder: no run of a command
        return
    folder = os.path.abspath(output_dir)
    noted = next((n for n in noted_folders if folder == n.top or folder.startswith(n.top + os.sep)), None)
    log_name = f"{hydra_cfg.job.name}.log"
    own = {log_name, *([hydra_cfg.output_subdir] if hydra_cfg.output_subdir else [])}  # what Hydra wrote there
    made = noted is not None and not noted.existed
    if noted is not None and noted.existed and folder != noted.top:  # a job's folder in a sweep folder of before
        made = os.path.relpath(folder, noted.top).split(os.sep)[0] not in noted.entries
    if made and os.path.isdir(folder) and set(os.listdir(folder)) <= own:
        close_logs_in(folder)
        shutil.rmtree(folder, ignore_errors=True)
        remove_emptied_parents(Path(folder).parent, noted)
        return
    log_in_run_folder(err)  # kept: the log says why the run stopped, as the console did


def log_in_run_folder(err: BaseException) -> None:
    """The line that ends a run (`one_line(err)`) written to the run folder's log (train.log) too: on the console
    alone, it was gone with the terminal. Not through the "vit.train" logger, whose console handler would print it
    a second time beside exit_with's line on stderr."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from vit.errors import one_line

    if not HydraConfig.initialized():
        return
    output_dir = OmegaConf.select(HydraConfig.get(), "runtime.output_dir", default=None, throw_on_missing=False)
    if not output_dir:
        return
    for handler in logs_in(os.path.abspath(output_dir)):
        handler.handle(logging.makeLogRecord({"name": "vit.train", "levelno": logging.ERROR,
                                              "levelname": "ERROR", "msg": one_line(err)}))  # fmt: skip


def logs_in(folder: str) -> list[logging.FileHandler]:
    handlers = logging.getLogger().handlers
    return [h for h in handlers if isinstance(h, logging.FileHandler) and os.path.dirname(h.baseFilename) == folder]


def close_logs_in(folder: str) -> None:
    for handler in logs_in(folder):
        logging.getLogger().removeHandler(handler)
        handler.close()


def remove_emptied_parents(parent: Path, noted: NewFolders) -> None:
    """The folders above a removed run folder that this command made and that are now empty, up to the nearest one
    that existed before; a sweep's folder counts as empty holding only its multirun.yaml and SWEEP_FILE (Hydra's
    record of the sweep and ours, both written before the first job)."""
    while str(parent) != noted.keep and parent != parent.parent and parent.is_dir():
        entries = set(os.listdir(parent))
        if str(parent) == noted.top and not noted.existed:
            entries -= {"multirun.yaml", SWEEP_FILE}
        if entries:
            return
        for record in ("multirun.yaml", SWEEP_FILE):
            (parent / record).unlink(missing_ok=True)
        parent.rmdir()
        parent = parent.parent
