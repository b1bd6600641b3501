"""Sweeps (`train.py -m`) end to end: a folder a job, TensorBoard's HParams row of each, and a failing job that does
not end the sweep, under Hydra's basic launcher, joblib's and submitit's local one."""

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from trainer_utils import QUICK_SYNTHETIC, TINY_MODEL, run_cli


def logged_hparams(events: EventAccumulator) -> dict:
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    return dict(plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams)


@pytest.mark.parametrize(
    ("launcher", "heads"),
    [
        pytest.param([], "1,3,2", id="basic"),
        # a process a job (importing torch each): two jobs, the first refused, on one thread each (no load to read)
        pytest.param(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "trainer.threads=1"], "3,2", id="joblib"),
        pytest.param(["hydra/launcher=submitit_local", "trainer.threads=1"], "3,2", id="submitit_local"),
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
        assert hparams["data"].string_value == "synthetic"
        assert hparams["precision"].string_value == metrics["precision"]
        # the swept knob, the keys a reader always wants and the command line's: not every key of the config
        assert "data.augment.re_prob" not in hparams and "sched.warmup_epochs" not in hparams
        assert len(hparams) <= 20, sorted(hparams)
    failed = json.loads((sweep / str(failed_job) / "failed.json").read_text())
    assert failed["exit_code"] == 2 and "model.num_heads=3" in failed["overrides"]
    assert failed["line"].startswith("config error: model.num_heads=3 must be a positive divisor of embed_dim=32")
    assert failed["line"] in (sweep / str(failed_job) / "train.log").read_text()
    tail = done.stderr.strip().splitlines()[-2:]
    assert tail[0].startswith(f"sweep: 1 job failed in {sweep}")
    assert tail[1].startswith(f"  job {failed_job} (model.num_heads=3 ") and tail[1].endswith(failed["line"])
