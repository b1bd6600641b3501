"""Sweeps (`train.py -m`) end to end: a folder a job, TensorBoard's HParams row of each, and a failing job that does
not end the sweep, under Hydra's basic launcher, joblib's and submitit's local one; trainer.sweep_budget's one
length for every job."""

import json
import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from trainer_utils import QUICK_SYNTHETIC, TINY_MODEL, run_cli

from vit.errors import ConfigError


def logged_hparams(events: EventAccumulator) -> dict:
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    return dict(plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams)


@pytest.mark.parametrize(
    ("launcher", "heads"),
    [
        pytest.param([], "1,3,2", id="basic"),
        # a process a job (importing torch each): two jobs, the first refused, on one thread each (no load to read);
        # about 20 s, like submitit's local launcher (a submitit process a job): both in `make test-all`
        pytest.param(
            ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "trainer.threads=1"],
            "3,2",
            id="joblib",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["hydra/launcher=submitit_local", "trainer.threads=1"], "3,2", id="submitit_local", marks=pytest.mark.slow
        ),
    ],
)
def test_a_failing_job_does_not_end_the_sweep(tmp_path, launcher, heads):
    """The job of 3 heads is refused (they do not divide 32 wide): the others still train, each in its own folder
    with its HParams row, the refused one's folder names why, the sweep's last lines list it, and the sweep exits
    with its code. Under Hydra's basic launcher (one job after another in this process), joblib's (jobs side by
    side in worker processes) and submitit's local one (a process a job, as on a SLURM cluster)."""
    sweep = tmp_path / "sweep"
    args = ["-m", f"model.num_heads={heads}", *QUICK_SYNTHETIC, *TINY_MODEL[:2], "trainer=debug", *launcher]
    done = run_cli([*args, f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    values = [int(h) for h in heads.split(",")]
    failed_job = values.index(3)
    for n, value in enumerate(values):
        if n == failed_job:
            continue
        assert f"num_heads: {value}" in (sweep / str(n) / ".hydra" / "config.yaml").read_text()
        metrics = json.loads((sweep / str(n) / "metrics.json").read_text())
        events = EventAccumulator(str(sweep / str(n) / "tb")).Reload()
        assert "hparam/val_top1" in events.Tags()["scalars"]
        hparams = logged_hparams(events)  # what TensorBoard's HPARAMS view shows as this run's row
        assert hparams["model.num_heads"].number_value == value
        assert hparams["model.embed_dim"].number_value == 32 and hparams["optim.name"].string_value == "adamw"
        assert hparams["precision"].string_value == metrics["precision"]
        # the swept knob, the keys a reader always wants and the command line's: not every key of the config
        assert "data.augment.re_prob" not in hparams and "sched.warmup_epochs" not in hparams
        assert "data" not in hparams and "data.synthetic.num_train" not in hparams  # given, the same in every job
        assert len(hparams) <= 15, sorted(hparams)
    failed = json.loads((sweep / str(failed_job) / "failed.json").read_text())
    assert failed["exit_code"] == 2 and "model.num_heads=3" in failed["overrides"]
    assert failed["line"].startswith("config error: model.num_heads=3 must be a positive divisor of embed_dim=32")
    assert failed["line"] in (sweep / str(failed_job) / "train.log").read_text()
    tail = done.stderr.strip().splitlines()[-2:]
    assert tail[0].startswith(f"sweep: 1 job failed in {sweep}")
    assert tail[1].startswith(f"  job {failed_job} (model.num_heads=3 ") and tail[1].endswith(failed["line"])


def test_a_sweep_budget_trains_every_job_the_length_its_first_job_fitted(tmp_path):
    """trainer.sweep_budget: the first job fits whole epochs to its share (the budget over the jobs) and keeps that
    plan; the second, the same settings and seed, trains those epochs without a budget and so trains exactly what
    the first did, loss for loss (fp32, one thread), and the sweep's last line says so."""
    sweep = tmp_path / "sweep"
    args = ["-m", "trainer.seed=0,0", *QUICK_SYNTHETIC, *TINY_MODEL, "trainer.epochs=200", "trainer.amp=none"]
    args += ["trainer.threads=1", "trainer.sweep_budget=8s", "trainer.val_every_n_epochs=5"]
    done = run_cli([*args, f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((sweep / "sweep.json").read_text())["sweep_budget"] == {
        "budget_s": 8.0,
        "jobs": 2,
        "at_once": 1,
        "share_s": 4.0,
    }
    length = json.loads((sweep / "sweep_length.json").read_text())
    assert 1 <= length["epochs"] < 200 and length["steps"] == length["epochs"] * 8  # 256 images of batch 32
    first, second = (json.loads((sweep / str(n) / "metrics.json").read_text()) for n in (0, 1))
    assert first["budget"]["replans"] == 0 and "budget" not in second
    assert first["steps_trained"] == second["steps_trained"] == length["steps"]
    assert [e["train_loss"] for e in first["history"]] == [e["train_loss"] for e in second["history"]]
    log = (sweep / "1" / "train.log").read_text()
    assert f"this job trains the sweep's {length['epochs']} epochs, fitted by its first job" in log
    assert f"each trained the {length['epochs']} epochs ({length['steps']} steps)" in done.stdout
    assert not (sweep / "sweep_length.claim").exists()


@pytest.mark.parametrize(
    ("params", "arguments"),
    [
        ({}, ["model.num_heads=1,2,3"]),
        ({"model.qk_scale": "null,1.0,0.5"}, ["trainer.seed=0,1", "trainer.epochs=3"]),
        ({"model.num_heads": "1,2,3,4"}, ["model.num_heads=2,4", "optim.lr=range(1,4)"]),  # the command line wins
    ],
)
def test_the_jobs_are_counted_as_hydras_basic_sweeper_makes_them(params, arguments):
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from vit.cli.sweeps import swept_values

    texts = [f"{key}={value}" for key, value in params.items()] + arguments
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(texts), None)
    assert math.prod(swept_values(params, arguments).values()) == sum(len(batch) for batch in batches)


def test_a_job_waits_for_the_length_while_another_fits_it_and_fits_it_itself_if_that_one_stops(tmp_path, monkeypatch):
    import threading

    from vit.train import sweep_budget
    from vit.train.sweep_budget import length_or_claim

    monkeypatch.setattr(sweep_budget, "WAIT_S", 0.05)

    claim = tmp_path / "sweep_length.claim"
    claim.touch()  # another job fits the length ...
    timer = threading.Timer(0.3, lambda: (tmp_path / "sweep_length.json").write_text('{"epochs": 4}'))
    timer.start()
    assert length_or_claim(tmp_path, patience_s=30) == {"epochs": 4}  # ... and writes it
    (tmp_path / "sweep_length.json").unlink()
    threading.Timer(0.3, claim.unlink).start()  # ... or stops without a plan: this job claims the fitting
    assert length_or_claim(tmp_path, patience_s=30) is None and claim.exists()
    with pytest.raises(ConfigError, match="delete the file and run this job again"):
        length_or_claim(tmp_path, patience_s=0.2)  # a claim nobody releases


def test_a_sweep_budget_outside_a_sweep_is_the_runs_budget_and_never_beside_one():
    from omegaconf import OmegaConf

    from vit.settings import TrainerSettings
    from vit.train.config import check_trainer
    from vit.train.sweep_budget import fit_to_sweep

    trainer, fit = fit_to_sweep(TrainerSettings(sweep_budget=600.0), world_size=1)
    assert trainer.budget == 600.0 and fit is None
    both = OmegaConf.create({"budget": "10m", "sweep_budget": "1h", "resume": None})
    with pytest.raises(ConfigError, match=r"trainer.sweep_budget=1h and trainer.budget=10m: give one"):
        check_trainer(both)
