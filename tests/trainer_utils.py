"""Plain helpers shared by the tests (fixtures are in conftest.py): composing configs, running the real CLI,
writing small image trees and fake finished runs. No test module imports another; what two share is here."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf
from PIL import Image

from vit.config.compose import compose

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(REPO / "configs")

# A model small enough that a CPU epoch over a few hundred images takes about a second.
TINY_MODEL = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2"]
QUICK_SYNTHETIC = ["data=synthetic", "data.synthetic.num_train=256", "data.synthetic.num_val=64", "data.batch_size=32"]
# One name of each foundation-ViT family docs/FINETUNE.md lists (its smallest size, with the tag of its pretrained
# weights): EVA-02-Ti, the smallest, in the default suite; the others, with a larger file to write and model to
# build each, in the slow tier.
FOUNDATION_FAMILIES = [
    *(
        pytest.param(name, marks=pytest.mark.slow)
        for name in (
            "deit3_small_patch16_224.fb_in22k_ft_in1k",
            "vit_small_patch14_reg4_dinov2.lvd142m",
            "vit_small_patch16_dinov3.lvd1689m",
            "vit_base_patch16_siglip_224.webli",
            "vit_base_patch16_clip_quickgelu_224.openai",
        )
    ),
    "eva02_tiny_patch14_224.mim_in22k",
]
# The tiny model on the synthetic data, on the CPU, without attention figures: a run of a few seconds.
QUICK = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.device=cpu", "trainer.attn_maps_every_n_epochs=0"]
# For runs a test holds equal to another run (ranks against one process, compiled against eager, accumulated against
# one large batch): fp32 on every CPU. Under trainer.amp=auto a CPU with native bf16 trains TINY_MODEL in bf16, whose
# rounding of each product's output turns a difference in summation order into one of a bf16 unit.
FP32 = ["trainer.amp=none"]


def head_commit() -> str:
    """This checkout's commit, as git names it."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def assert_provenance(source: dict, *command_words: str) -> None:
    """A result's `provenance` (vit/records/provenance.py): this checkout's commit, a command holding
    `command_words`, this machine's cores, the versions."""
    assert source["commit"] == head_commit() and isinstance(source["dirty"], bool)
    assert all(word in source["command"] for word in command_words), (source["command"], command_words)
    assert source["machine"]["cpu"]["cores"] == os.cpu_count() and source["versions"]["torch"]


def assert_measurement_record(record: dict, measurement: str, *command_words: str) -> None:
    """A measurement script's JSON record: its name and its provenance (assert_provenance)."""
    assert record["measurement"] == measurement, record.get("measurement")
    assert_provenance(record["provenance"], *command_words)


def compose_config(overrides: list[str]):
    """The trainer's config with these overrides, as train.py composes it (vit/config/compose.py's `compose`).

    Through compose_onto_groups, a twentieth of Hydra's cost, where it applies; through Hydra where it does not or
    where a setting is refused, so a refusal is always Hydra's own (ConfigError with Hydra's first line)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from vit.errors import ConfigError

    try:
        return compose_onto_groups(overrides)
    except (HydraException, OmegaConfBaseException, ConfigError, ValueError):
        return compose(overrides)


def _composed_groups(choices: tuple[str, ...]):
    """The config composed with these group choices, read only: the command line's own cache of them (train.py's
    key check composes the same sets), so a test that checks a command and composes it composes once."""
    from vit.cli.overrides import composed_keys

    return composed_keys(choices, "config")[0]


def compose_onto_groups(overrides: list[str]):
    """compose(overrides), faster for the many tests that compose the same group choices with other settings: the
    group choices (`task=mae`) composed once per set, and each setting (`key=value`, `+key=value`) then applied to a
    copy as Hydra applies it (hydra/_internal/config_loader_impl.py: OmegaConf.update with the value Hydra's own
    parser reads; a compose costs Hydra 0.2 s). Hydra too applies the settings after composing the choices, wherever
    they stand on the command line. The other override forms (`~key`, `++key=value`, sweeps, `@package`) and a
    `+key` over a value (which Hydra refuses) are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    parsed = OverridesParser.create().parse_overrides(overrides)
    if any(o.type not in (OverrideType.CHANGE, OverrideType.ADD) or o.is_sweep_override() for o in parsed):
        return compose(overrides)
    is_choice = [(REPO / "configs" / o.key_or_group).is_dir() for o in parsed]
    choices = [o for o, choice in zip(parsed, is_choice, strict=True) if choice]
    settings = [o for o, choice in zip(parsed, is_choice, strict=True) if not choice]
    if any(o.package is not None for o in settings):
        return compose(overrides)
    cfg = copy.deepcopy(_composed_groups(tuple(o.input_line for o in choices)))
    for override in settings:
        value = override.value()
        if override.is_add() and OmegaConf.select(cfg, override.key_or_group, throw_on_missing=False) is not None:
            if not isinstance(value, dict | list):
                return compose(overrides)
        OmegaConf.update(cfg, override.key_or_group, value, merge=True, force_add=override.is_add())
    return cfg


def exit_status(exit: SystemExit) -> int:
    """The process's exit code for this SystemExit, as the interpreter gives it: sys.exit("message") prints the
    message on stderr and exits 1, sys.exit(None) exits 0."""
    if isinstance(exit.code, str):
        print(exit.code, file=sys.stderr)
    return exit.code if isinstance(exit.code, int) else int(exit.code is not None)


def run_cli(args: list[str], cwd: Path, timeout: int = 240, *, process: bool = False) -> subprocess.CompletedProcess:
    """`python train.py <args>` from `cwd`: its exit code, stdout and stderr. By default in this process: the
    command line's own `main` (vit/cli/train.py: the checks, Hydra, the run) with sys.argv set, its output captured,
    and Hydra's global state, the logging and the working folder put back afterwards; a new Python process costs
    more to start (importing torch, torchvision and timm) than most of these runs take. `process=True` runs it in a
    process of its own (ForkedRun, with `timeout`; stdout and stderr both in stdout), for what
    only a process shows: its wall time counted from the process's start, a run's start-up charged to it."""
    if process:
        forked = ForkedRun.train(args, cwd)
        out, _ = forked.communicate(timeout)
        return subprocess.CompletedProcess(["train.py", *args], forked.returncode, out, out)
    return _run_cli_here(args, cwd)


def _run_cli_here(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    import io
    import logging
    from unittest import mock

    from hydra.core.global_hydra import GlobalHydra

    import vit.cli.train as cli

    run_module = importlib.import_module("vit.train.run")  # the module (vit.train.run is also the function)

    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    saved = [(lg, lg.level, lg.handlers[:], lg.propagate, lg.disabled) for lg in loggers]
    out, err, argv, code = io.StringIO(), io.StringIO(), sys.argv, 0
    GlobalHydra.instance().clear()
    try:
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            # A process started for the run counts its wall time from its start; this one was not.
            with mock.patch.object(run_module, "count_from_process_start", lambda: None):
                sys.argv = [str(REPO / "train.py"), *args]
                try:
                    cli.main()
                except SystemExit as exit:
                    code = exit_status(exit)
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()
        for lg, level, handlers, propagate, disabled in saved:
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()  # Hydra's console and train.log handlers of this run
            lg.setLevel(level)
            lg.handlers[:], lg.propagate, lg.disabled = handlers, propagate, disabled
    return subprocess.CompletedProcess(["train.py", *args], code, out.getvalue(), err.getvalue())


class ForkedRun:
    """`main()` with sys.argv = `argv` in a process of its own, with a subset of subprocess.Popen's interface (poll,
    send_signal, kill, wait, communicate, returncode): so signals and kill -9 reach it alone. Forked, without the
    seconds a new interpreter spends importing torch, torchvision and timm, but not from this process: from
    multiprocessing's fork server, a clean interpreter started once per test process that has imported them and
    never computed. A child forked from this process would copy whatever its other threads held at that moment
    (gloo's event loop and run-loop threads, which torch keeps alive after a sharded run in this process, a lock,
    GNU OpenMP's thread pool), and ranks forked that way hung now and then in a full suite, never alone.

    `main` must be picklable (a module-level function, or a functools.partial of one). The child starts in `cwd`
    with this process's environment plus `env`, on one CPU, `cpu` (by default the first this process may use), so
    its `trainer.threads=auto` is 1; it leaves with os._exit and `main`'s exit code (the interpreter's own exit is
    what the tests that start `python train.py` are for). stdout and stderr go to one log unless `merge` is false;
    `session`: the child leads a new session and process group; after `stacks_after` seconds it writes every
    thread's Python stack to its stderr, so a run that hangs says where. `train` builds the one for
    `python train.py <args>`."""

    def __init__(
        self,
        main,
        argv: list[str],
        cwd: Path,
        env: dict[str, str] | None = None,
        cpu=0,
        merge=True,
        session=False,
        stacks_after: float | None = None,
    ):
        import multiprocessing
        import tempfile

        self.argv, self.returncode = argv, None
        Path(cwd).mkdir(parents=True, exist_ok=True)  # the child starts in it
        self._out = tempfile.NamedTemporaryFile(mode="w+")  # noqa: SIM115 - read back after the child ends
        self._err = self._out if merge else tempfile.NamedTemporaryFile(mode="w+")  # noqa: SIM115
        cpus = sorted(os.sched_getaffinity(0))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        files = (self._out.name, self._err.name)
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["vit.cli.train", "vit.train", "trainer_utils"])  # what every child would import
        args = (main, list(argv), str(cwd), files, env, cpus[cpu % len(cpus)], session, stacks_after)
        self._process = context.Process(target=_forked_child, args=args)
        self._process.start()
        self.pid = self._process.pid

    @classmethod
    def train(cls, args: list[str], cwd: Path, env: dict[str, str] | None = None, cpu=0, session=False, **kwargs):
        """`python train.py <args>` from `cwd`: the command line's own main."""
        return cls(_train_main, [str(REPO / "train.py"), *args], cwd, env, cpu, session=session, **kwargs)

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self.returncode = self._process.exitcode  # -N for a signal N, as Popen says
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                self.kill()
                raise subprocess.TimeoutExpired(self.argv, timeout)
            time.sleep(0.02)
        return self.returncode

    def output(self, stream: str = "stdout") -> str:
        file = self._out if stream == "stdout" else self._err
        file.seek(0)
        return file.read()

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        self.wait(timeout)
        return self.output(), None if self._err is self._out else self.output("stderr")


def _forked_child(main, argv, cwd, files, env, cpu, session, stacks_after) -> None:
    """ForkedRun's child: its own session if asked (a process group, as a terminal gives), its output to the files,
    one CPU, the environment, then `main`."""
    code = 1
    try:
        if session:
            os.setsid()
        for fd, name in zip((1, 2), files, strict=True):
            os.dup2(os.open(name, os.O_WRONLY | os.O_APPEND), fd)
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        if stacks_after:
            import faulthandler

            faulthandler.dump_traceback_later(stacks_after)
        os.sched_setaffinity(0, {cpu})
        import torch

        torch.set_num_threads(1)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = argv
        try:
            main()
            code = 0
        except SystemExit as exit:
            code = exit_status(exit)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


def _train_main() -> None:
    import vit.cli.train as cli

    cli.main()


def free_port() -> int:
    """A TCP port free on this machine now, for a process group's rendezvous."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_envs(nproc: int) -> list[dict[str, str]]:
    """The environment torchrun gives each of `nproc` workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...)."""
    common = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1"}
    common |= {"MASTER_PORT": str(free_port()), "GROUP_RANK": "0"}
    return [{**common, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(nproc)]


def wait_for_ranks(ranks: list, timeout: float) -> int:
    """Wait until every rank is done, or one failed (the others would wait for it) and the rest had 10 s to end, or
    `timeout` passed; kill what is left. The first non-zero exit code, else 0."""
    deadline = time.monotonic() + timeout
    try:
        while None in (codes := [rank.poll() for rank in ranks]) and time.monotonic() < deadline:
            if any(codes):
                deadline = min(deadline, time.monotonic() + 10)
            time.sleep(0.05)
    finally:
        for rank in ranks:
            rank.kill()
    return next((c for c in (rank.wait() for rank in ranks) if c), 0)


def start_ranks(args: list[str], cwd: Path, nproc: int = 2, env: dict | None = None, **kwargs) -> list[ForkedRun]:
    """The ranks of `train.py <args>`, started as torchrun starts its workers (plus `env`), left running."""
    envs = [{**rank_env, **(env or {})} for rank_env in rank_envs(nproc)]
    return [ForkedRun.train(args, cwd, rank_env, cpu=r, **kwargs) for r, rank_env in enumerate(envs)]


def run_ranks(args: list[str], cwd: Path, nproc: int = 2, timeout: int = 240) -> subprocess.CompletedProcess:
    """`train.py <args>` as `nproc` data-parallel ranks, each a ForkedRun with the environment torchrun gives its
    workers: the same process group, sharding and rank-0 writing as under torchrun, minus a launcher and a new
    interpreter per rank. stdout holds every rank's output, rank by rank (with every thread's stack where a rank
    was still running 10 s before `timeout`); the exit code is the first non-zero one. (The launch by torchrun
    itself is tested too, in tests/train/test_distributed.py.)"""
    ranks = start_ranks(args, cwd, nproc, stacks_after=timeout - 10)
    code = wait_for_ranks(ranks, timeout)
    return subprocess.CompletedProcess(["train.py", *args], code, "".join(r.output() for r in ranks), "")


# Image modes a folder of real-world images holds; make_tree cycles through them.
MODES = ["RGB", "L", "P", "RGBA", "CMYK", "I;16"]


def noise_image(mode: str, size: int, seed: int) -> Image.Image:
    """A size x size image of random pixels in `mode`."""
    rng = np.random.default_rng(seed)
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65535, (size, size), dtype=np.uint16))
    rgb = Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))
    return rgb.convert(mode)


def make_tree(root: Path, classes=("cat", "dog", "frog"), per_class=8, val="val", size=20) -> Path:
    """An image-folder tree, root/train/<class>/ and root/<val>/<class>/, of noise images in every mode of MODES
    (PNG where JPEG cannot hold the mode), `per_class` training and `per_class // 2` validation images a class."""
    for split, count in (("train", per_class), (val, per_class // 2)):
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                mode = MODES[(i + c) % len(MODES)]
                suffix = ".png" if mode in ("I;16", "RGBA", "P") else ".jpg"
                image = noise_image(mode, size, seed=100 * c + i)
                if suffix == ".jpg" and mode not in ("RGB", "L", "CMYK"):
                    image = image.convert("RGB")
                image.save(folder / f"img {i}{suffix}")  # a space in the name on purpose
    return root


def mixed_shape_tree(root: Path) -> Path:
    """root/{train,val}/{a,b}/: wide (40 x 24 px), tall (24 x 40) and square (32 x 32) noise images, 6 a class."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for i, (width, height) in enumerate([(40, 24), (24, 40), (32, 32)] * 2):
                pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return root


# The data config a fake run records (fake_run).
DATA_CFG = {"name": "cifar10", "img_size": 32, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}


def fake_run(run_dir: Path, overrides: list[str], model: dict, metrics: dict | None, tb_curve=()):
    """A run folder as the trainer leaves it (.hydra/overrides.yaml and config.yaml, metrics.json unless None,
    a TensorBoard val/top1 curve of (step, value) pairs), without training."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"model": model, "data": DATA_CFG}))
    if metrics is not None:
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
    if tb_curve:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(run_dir / "tb") as writer:
            for step, value in tb_curve:
                writer.add_scalar("val/top1", value, step)


def assert_resumes_exactly(overrides: list[str], tmp_path: Path) -> tuple[dict, dict, dict]:
    """Train `overrides` straight through, and again stopped after epoch 1 and resumed: the two last.pt files must
    hold the same weights and the two histories the same training losses. Returns (straight metrics, resumed
    metrics, the straight run's model state dict)."""
    import torch

    from vit.train import run
    from vit.weights.read import load_checkpoint

    straight = run(compose_config(overrides), output_dir=tmp_path / "straight")
    run(compose_config([*overrides, "trainer.stop_after_epoch=1"]), output_dir=tmp_path / "resumed")
    resumed = run(compose_config([*overrides, "trainer.resume=auto"]), output_dir=tmp_path / "resumed")
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["train_loss"] for r in straight["history"]] == [r["train_loss"] for r in resumed["history"]]
    return straight, resumed, a


def assert_evaluates_as_the_run(result: dict, metrics: dict, prefix: str) -> None:
    """vit-eval's `result` against the run's own last evaluation of the same weights (`final[prefix_top1]` and
    `_loss` in its metrics.json), in the run's precision: equal in fp32; in bf16, where this CPU trained the tiny model
    in it, within one image's top-1 and 1e-4 of the loss (the products' outputs, rounded to 8 bits, differ by a unit
    where vit-eval's batches sum in another order)."""
    final, fp32 = metrics["final"], metrics["precision"] == "fp32"
    one_image = 100 / result["count"]  # top-1 in percent
    assert result["top1"] == pytest.approx(final[f"{prefix}_top1"], abs=1e-6 if fp32 else one_image + 1e-6)
    assert result["loss"] == pytest.approx(final[f"{prefix}_loss"], rel=1e-6 if fp32 else 1e-4)


def trainer_path_evaluation(
    checkpoint, *data_overrides: str, ema: bool = False, flip: bool = False, shift: int = 0
) -> dict:
    """The reference the evaluation tool is checked against: a checkpoint's weights through the trainer's own data
    path (`vit.data.build_data` on the checkpoint's data config) and the tasks' evaluation pass, with the split's
    name and the per-class top-1 of the classes evaluated."""
    import torch
    from omegaconf import OmegaConf

    from vit.data import build_data
    from vit.tasks.build import build_model_from_config
    from vit.tasks.evaluation import evaluate
    from vit.weights.read import load_checkpoint

    state = load_checkpoint(checkpoint)
    config = OmegaConf.create(state["config"])
    data_cfg = OmegaConf.merge(config.data, OmegaConf.from_dotlist(list(data_overrides)))
    data_cfg.num_workers = 0
    model = build_model_from_config(config.model, num_classes=len(state.get("class_to_idx") or {}) or None)
    model.load_state_dict(state["ema"] if ema else state["model"])
    device = torch.device("cpu")
    bundle = build_data(data_cfg, device=device)
    result = evaluate(model, bundle.val_loader, device, None, num_classes=bundle.num_classes, flip=flip, shift=shift)
    confusion = result.pop("confusion")
    names = sorted(bundle.class_to_idx, key=bundle.class_to_idx.get)
    accuracy = (confusion.diag().float() / confusion.sum(1).clamp_min(1).float() * 100).tolist()
    seen = (confusion.sum(1) > 0).tolist()
    result["per_class_top1"] = {n: round(a, 2) for n, a, s in zip(names, accuracy, seen, strict=True) if s}
    result["split"] = bundle.val_name
    return result


@contextlib.contextmanager
def reference_code(folder: str):
    """Import unmodified reference code (an official implementation a parity test compares with) from `folder`
    inside the block, read-only: nothing is written there (no __pycache__), and the modules loaded from it are
    forgotten afterwards, so its generic names (`models`, `util`) do not linger in sys.modules."""
    folder = str(Path(folder).resolve())
    before = set(sys.modules)
    writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)
        sys.dont_write_bytecode = writes_bytecode
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(folder + os.sep):
                del sys.modules[name]


class VirtualClock:
    """A `time` stand-in whose clock moves only when told: a benchmark timed with it measures the costs a test
    assigns to each call, exactly, whatever else the machine is doing (a timed test on a loaded CI machine is a
    flaky test)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def costing(self, call, seconds: float):
        """`call`, run for real, then charged `seconds` on this clock."""

        def charged(*args, **kwargs):
            out = call(*args, **kwargs)
            self.now += seconds
            return out

        return charged


def load_script(name: str):
    """scripts/<name>.py or lab/<name>.py imported as a module, so a test can call its `main` and patch its
    helpers; for an installed command (`vit-export`), its module vit/cli/<name>.py."""
    import importlib
    import importlib.util

    path = REPO / "scripts" / f"{name}.py"
    if not path.is_file():
        path = REPO / "lab" / f"{name}.py"
    if not path.is_file():
        return importlib.import_module(f"vit.cli.{name}")
    spec = importlib.util.spec_from_file_location(f"script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass in the script looks its module up there
    spec.loader.exec_module(module)
    return module


def installed(command: str) -> str:
    """The path of an installed command (`vit-predict`) in the environment running the tests."""
    return str(Path(sys.executable).parent / command)


def empty_image_tree(root: Path, classes) -> Path:
    """root/{train,test}/<class>/0.jpg, empty files: a tree a script checks the layout of but never decodes."""
    for split in ("train", "test"):
        for name in classes:
            (root / split / name).mkdir(parents=True)
            (root / split / name / "0.jpg").write_bytes(b"")
    return root


def train_exit_line(overrides: list[str], tmp_path: Path, monkeypatch, capsys) -> str:
    """The one line `train.py <overrides>` prints on stderr as it exits with code 2; reading any data fails the
    test (the source must be checked first)."""
    import importlib

    import pytest

    import vit.train
    from vit.cli.train import train_task

    def no_data(*args, **kwargs):
        raise AssertionError("the data was read before the source was checked")

    monkeypatch.setattr(importlib.import_module("vit.train.setup"), "build_data", no_data)
    monkeypatch.setattr(vit.train, "run", functools.partial(vit.train.run, output_dir=tmp_path / "run"))
    with pytest.raises(SystemExit) as exit_info:
        train_task(compose_config(overrides))
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def stub_step_parts(model, **kwargs):
    """The StepParts a training step reads, around `model` with plain parts (SGD at lr 0.1, a 100-step cosine,
    cross-entropy, fp32 on the CPU); `kwargs` replace any of them."""
    import torch
    from timm.scheduler import CosineLRScheduler

    from vit.runtime.device import Precision
    from vit.train.step_parts import StepParts

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    defaults = dict(
        train_model=model,
        model=model,
        optimizer=optimizer,
        scheduler=CosineLRScheduler(optimizer, t_initial=100),
        criterion=torch.nn.CrossEntropyLoss(),
        device=torch.device("cpu"),
        precision=Precision("fp32", "test"),
        scaler=None,
    )
    return StepParts(**{**defaults, **kwargs})


def scales_by_name(model, groups: list[dict]) -> dict[str, tuple[float, float]]:
    """Each parameter's (lr_scale, weight_decay) in optimizer parameter groups, by the parameter's name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["lr_scale"], g["weight_decay"]) for g in groups for p in g["params"]}


def saved_timm_model(folder: Path, name: str, num_classes: int, depth: int = 2, seed: int = 1):
    """timm's `name` with random weights (`depth` blocks, `num_classes` outputs), saved as a plain state dict in
    `folder`: the file a user downloads in timm's layout. Returns (its path, the timm model)."""
    import timm
    import torch

    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, depth=depth).eval()
    path = folder / "vit_tiny.pth"
    torch.save(model.state_dict(), path)
    return path, model
