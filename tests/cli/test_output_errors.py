"""Output that cannot be written and checkpoints of other classes: one line naming the path (or the class), exit 2,
and nothing good lost (metrics.json is replaced atomically; a dead TensorBoard writer thread prints no traceback)."""

import errno
import importlib
import os
import subprocess
import threading
from contextlib import contextmanager

import pytest
import torch
from tensorboard.compat.tensorflow_stub.io.gfile import LocalFileSystem
from trainer_utils import QUICK, TINY_MODEL, compose_config, run_cli

from vit.cli.overrides import check_output_dir
from vit.records.files import OutputError, atomic_write_text
from vit.train import run
from vit.train.report import TensorBoard
from vit.weights.read import CheckpointError, load_checkpoint

setup_phase = importlib.import_module("vit.train.setup")  # where a run builds its model and data
NAMES = {f"class_{i}": i for i in range(10)}  # the synthetic data's classes, as the `trained` checkpoint holds them
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@contextmanager
def full_tmpfs(folder):
    """A real 64 KiB tmpfs at `folder`, filled to the last byte (needs mount rights; the test skips without)."""
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root); the monkeypatched tests cover the logic")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def fill(folder) -> None:
    """Write one file into `folder` until its disk has no byte left."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError as err:
        assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)


@pytest.fixture
def thread_tracebacks(monkeypatch):
    """The exceptions that would have printed a traceback from a background thread (threading.excepthook)."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    return seen


# --- resuming a checkpoint of other classes ---------------------------------------------------------------------


def with_classes(checkpoint, tmp_path, classes):
    """A copy of `checkpoint` whose class_to_idx is `classes` (None: without the key, as older files are)."""
    state = load_checkpoint(checkpoint)
    state.pop("class_to_idx")
    if classes is not None:
        state["class_to_idx"] = classes
    path = tmp_path / "edited.pt"
    torch.save(state, path)
    return path


@pytest.mark.parametrize(
    ("classes", "extra", "message"),
    [
        (
            {**NAMES, "class_0": 3, "class_3": 0},
            [],
            "was trained on the same 10 classes in another order than the data's: index 0 is 'class_3' in the "
            "checkpoint but 'class_0' in the data",
        ),
        (
            {**{n: i for n, i in NAMES.items() if i != 3}, "cat": 3},
            [],
            "was trained on other classes than the data's: index 3 is 'cat' in the checkpoint but 'class_3' in the "
            "data",
        ),
        (  # a head of the same shape (model.num_classes=10) over fewer classes of data
            NAMES,
            ["data.num_classes=7", "model.num_classes=10"],
            "was trained on other classes than the data's: index 7 is 'class_7' in the checkpoint but unused in the "
            "data",
        ),
    ],
)
def test_resuming_a_checkpoint_of_other_classes_names_the_first_difference(
    trained,  # noqa: F811
    tmp_path,
    monkeypatch,
    classes,
    extra,
    message,
):
    path = with_classes(trained, tmp_path, classes)

    def loaded(*args, **kwargs):
        raise AssertionError("a state dict was loaded before the classes were compared")

    monkeypatch.setattr(torch.nn.Module, "load_state_dict", loaded)
    monkeypatch.setattr(torch.optim.Optimizer, "load_state_dict", loaded)
    with pytest.raises(CheckpointError) as err:
        run(compose_config([*QUICK, "trainer.epochs=2", *extra, f"trainer.resume={path}"]), output_dir=tmp_path / "run")
    assert str(err.value) == f"checkpoint '{path}' {message}; a resume needs the data it was trained on"


def test_a_checkpoint_of_other_classes_through_the_cli(trained, tmp_path):  # noqa: F811
    path = with_classes(trained, tmp_path, {**{n: i for n, i in NAMES.items() if i != 3}, "cat": 3})
    done = run_cli(
        [*QUICK, "trainer.epochs=2", f"trainer.resume={path}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path
    )
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if "error" in x]
    assert line == (
        f"checkpoint error: checkpoint '{path}' was trained on other classes than the data's: index 3 is 'cat' in "
        "the checkpoint but 'class_3' in the data; a resume needs the data it was trained on"
    )


@pytest.mark.parametrize("missing", ["no key in the checkpoint", "empty in the checkpoint", "data without names"])
def test_a_checkpoint_or_data_without_class_names_still_resumes(trained, tmp_path, monkeypatch, missing):  # noqa: F811
    path = with_classes(trained, tmp_path, {} if missing == "empty in the checkpoint" else None)
    if missing == "data without names":
        path = trained
        real_build = setup_phase.build_data

        def build_data(*args, **kwargs):
            bundle = real_build(*args, **kwargs)
            bundle.class_to_idx = {}
            return bundle

        monkeypatch.setattr(setup_phase, "build_data", build_data)
    metrics = run(compose_config([*QUICK, "trainer.epochs=2", f"trainer.resume={path}"]), output_dir=tmp_path / "run")
    assert [r["epoch"] for r in metrics["history"]] == [1, 2]


# --- metrics.json -----------------------------------------------------------------------------------------------


def test_a_failed_metrics_write_keeps_the_previous_file(tmp_path, monkeypatch):
    """The disk fills up half way through metrics.json: one OutputError naming it, the earlier file unchanged."""
    args = [*QUICK, "trainer.epochs=1", "trainer.save_checkpoints=false"]
    run(compose_config(args), output_dir=tmp_path)
    before = (tmp_path / "metrics.json").read_text()
    real_open = open

    def full_disk_open(file, mode="r", *args, **kwargs):
        if "metrics.json" in os.fspath(file) and "w" in mode:
            with real_open(file, mode, *args, **kwargs) as handle:
                handle.write(b'{"half' if "b" in mode else '{"half')
            raise ENOSPC
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full_disk_open)
    with pytest.raises(OutputError) as err:
        run(compose_config([*args, "trainer.seed=1"]), output_dir=tmp_path)
    monkeypatch.undo()
    message = str(err.value)
    assert message.startswith(f"cannot write file '{tmp_path / 'metrics.json'}': No space left on device (")
    assert message.endswith(" MiB free there); the previous file is intact")
    assert (tmp_path / "metrics.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "tb"]  # no temporary file left


def test_metrics_on_a_real_full_disk(tmp_path):
    with full_tmpfs(tmp_path / "tiny") as mount:
        atomic_write_text('{"epochs_done": 1}', mount / "metrics.json")
        fill(mount)
        with pytest.raises(OutputError, match=r"No space left on device \(0\.0 MiB free there\); the previous file"):
            atomic_write_text('{"epochs_done": 2}', mount / "metrics.json")
        assert (mount / "metrics.json").read_text() == '{"epochs_done": 1}'
        assert sorted(p.name for p in mount.iterdir()) == ["filler", "metrics.json"]


# --- TensorBoard events -----------------------------------------------------------------------------------------


def test_tensorboard_on_a_real_full_disk_is_one_error_without_a_thread_traceback(tmp_path, thread_tracebacks):
    """The writer's first event fails in its background thread; the constructor raises it as one OutputError."""
    with full_tmpfs(tmp_path / "tiny") as mount:
        fill(mount)
        with pytest.raises(OutputError) as err:
            TensorBoard(str(mount / "tb"))
        assert (
            str(err.value)
            == f"cannot write TensorBoard events in '{mount / 'tb'}': No space left on device (0.0 MiB free there)"
        )
    assert thread_tracebacks == []
    assert threading.excepthook == thread_tracebacks.append  # the hook is put back


def test_a_tensorboard_write_failing_mid_run_stops_it_with_one_error(tmp_path, monkeypatch, thread_tracebacks):
    """Every event after the file's first fails (its appends meet a full disk, in the writer's thread): the run
    stops with one OutputError, no thread prints a traceback, and no writer thread is left running."""

    def append(self, filename, file_content, binary_mode=False):
        raise ENOSPC

    monkeypatch.setattr(LocalFileSystem, "append", append)
    with pytest.raises(OutputError) as err:
        run(compose_config([*QUICK, "trainer.epochs=2", "trainer.log_every_n_steps=1"]), output_dir=tmp_path)
    assert str(err.value).startswith(
        f"cannot write TensorBoard events in '{tmp_path / 'tb'}': No space left on device ("
    )
    assert thread_tracebacks == []
    assert not [t for t in threading.enumerate() if type(t).__module__.startswith("tensorboard")]


def test_a_file_where_the_event_folder_should_be_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tb").write_text("a file where the TensorBoard folder should be")
    done = run_cli([*QUICK, "trainer.epochs=1", f"hydra.run.dir={run_dir}"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"output error: cannot write TensorBoard events in '{run_dir / 'tb'}': '{run_dir / 'tb'}' is a file"
    )


# --- the run directory ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("under", [False, True])
def test_a_run_directory_that_is_a_file_exits_2_before_any_data_is_read(tmp_path, under):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    run_dir = blocker / "run" if under else blocker
    data = ["data=imagefolder", f"data.root={tmp_path / 'no-such-data'}"]  # reading it would be a data error
    done = run_cli([*TINY_MODEL, "trainer.device=cpu", *data, f"hydra.run.dir={run_dir}"], tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"output error: cannot use the run directory '{run_dir}' (hydra.run.dir={run_dir}): '{blocker}' is a file, "
        "not a folder ("
    )
    assert line.endswith(" MiB free there)")


def test_a_run_directory_on_a_real_full_disk_exits_2(tmp_path):
    with full_tmpfs(tmp_path / "tiny") as mount:
        fill(mount)
        done = run_cli([*QUICK, f"hydra.run.dir={mount / 'run'}"], tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"output error: cannot use the run directory '{mount / 'run'}' (hydra.run.dir={mount / 'run'}): "
        "No space left on device (0.0 MiB free there)"
    )


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS])
def test_an_unwritable_run_directory_is_named(tmp_path, monkeypatch, capsys, code):
    """No write permission, a read-only file system (root ignores permissions, so the OS error is raised by hand)."""

    def refused(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("vit.records.files.tempfile.TemporaryFile", refused)
    with pytest.raises(SystemExit) as exit_info:
        check_output_dir([f"hydra.run.dir={tmp_path / 'new' / 'run'}"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        f"output error: cannot use the run directory '{tmp_path / 'new' / 'run'}' (hydra.run.dir="
        f"{tmp_path / 'new' / 'run'}): {os.strerror(code)}: cannot create files in '{tmp_path}' ("
    )
    assert not (tmp_path / "new").exists()  # checked, not created


def test_the_default_run_directory_is_checked_up_to_its_interpolation(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").write_text("a file where Hydra's outputs/ folder should be")
    with pytest.raises(SystemExit) as exit_info:
        check_output_dir(["data=synthetic"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "output error: cannot use the run directory 'outputs' (hydra.run.dir=outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}): "
        "'outputs' is a file, not a folder ("
    )
    check_output_dir(["--cfg", "job"])  # prints the config, writes nothing: not checked
    check_output_dir(["-m", "data=synthetic"])  # a multirun writes under multirun/


def test_run_with_a_file_as_output_dir_raises_before_reading_data(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")

    def build_data(*args, **kwargs):
        raise AssertionError("data read before the run directory was checked")

    monkeypatch.setattr(setup_phase, "build_data", build_data)
    with pytest.raises(OutputError, match=rf"cannot use the run directory '{blocker}/run': '{blocker}' is a file"):
        run(compose_config(QUICK), output_dir=blocker / "run")
