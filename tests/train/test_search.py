"""The Optuna search (vit/search/sweeper.py, vit/search/trial.py): `train.py -m hparams_search=...` keeps its study in a
database, returns the holdout score, prunes, continues a stopped search without re-running a trial, shares a study
between processes, survives a diverged trial, and refuses bad settings in one line with exit code 2."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import warnings

import optuna
import pytest
from omegaconf import OmegaConf
from trainer_utils import QUICK, REPO, compose_config, load_script, run_cli

from vit.errors import ConfigError
from vit.search.space import search_space
from vit.search.sweeper import Fidelity
from vit.search.trial import optimized_metric

optuna.logging.set_verbosity(optuna.logging.WARNING)

# The ready search, on tiny synthetic data: 3 epochs of 2 batches, an evaluation after each, no search space of its
# own (each test gives one on the command line), no pruner unless a test sets one.
SEARCH = [
    "-m",
    "hparams_search=cifar10_proxy_optuna",
    *QUICK,
    "data.holdout=null",
    "trainer.epochs=3",
    "trainer.val_every_n_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.ema=false",
    "sched.warmup_epochs=0",
    "hydra.sweeper.params=null",
    "search.pruner=null",
]


def search(tmp_path, *args, n_trials: int, folder=None, timeout=300):
    folder = folder or tmp_path / "search"
    done = run_cli(
        [*SEARCH, f"hydra.sweep.dir={folder}", f"hydra.sweeper.n_trials={n_trials}", *args], tmp_path, timeout
    )
    return done, folder


def study_of(folder, name="cifar10_proxy"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{folder / 'optuna.db'}")


def states(study) -> list[str]:
    return [t.state.name for t in study.get_trials()]


def final_metrics(folder, number: int) -> dict:
    return json.loads((folder / f"trial_{number}" / "metrics.json").read_text())


@pytest.fixture(scope="module")
def three_trials(tmp_path_factory):
    """A finished 3-trial search over the learning rate."""
    tmp_path = tmp_path_factory.mktemp("three")
    done, folder = search(tmp_path, "optim.lr=tag(log, interval(1e-4, 1e-2))", n_trials=3)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def test_a_search_keeps_its_study_and_its_best_value_is_the_best_trials_holdout_score(three_trials):
    study = study_of(three_trials)
    assert states(study) == ["COMPLETE"] * 3
    scores = {n: final_metrics(three_trials, n)["final"]["val_top1"] for n in range(3)}
    assert study.best_value == max(scores.values())
    assert scores[study.best_trial.number] == study.best_value
    # each trial's own learning rate reached its run, and the study knows where the run is and what it optimised
    for trial in study.trials:
        config = (three_trials / f"trial_{trial.number}" / ".hydra" / "overrides.yaml").read_text()
        assert f"optim.lr={trial.params['optim.lr']!r}" in config
        assert trial.user_attrs["run_dir"] == str(three_trials / f"trial_{trial.number}")
    assert study.metric_names == ["val_top1"]
    # a trial never reads the test split: the search chooses on the validation split only
    assert "test" not in final_metrics(three_trials, 0)


@pytest.mark.slow  # a whole search (12-18 s on 2 cores): make test-all runs it
def test_the_same_command_continues_the_study_without_rerunning_a_trial(three_trials, tmp_path):
    folder = tmp_path / "search"
    shutil.copytree(three_trials, folder)
    before = {n: (folder / f"trial_{n}" / "metrics.json").stat().st_mtime_ns for n in range(3)}
    done, _ = search(tmp_path, "optim.lr=tag(log, interval(1e-4, 1e-2))", n_trials=4)
    assert done.returncode == 0, done.stderr[-3000:]
    study = study_of(folder)
    assert [t.number for t in study.trials] == [0, 1, 2, 3] and states(study) == ["COMPLETE"] * 4
    assert {n: (folder / f"trial_{n}" / "metrics.json").stat().st_mtime_ns for n in range(3)} == before
    assert "3 of 4 trials finished, 1 to run" in done.stderr + done.stdout
    # the seeded sampler moved on: the new trial is not a repeat of the first
    assert study.trials[3].params != study.trials[0].params
    again, _ = search(tmp_path, "optim.lr=tag(log, interval(1e-4, 1e-2))", n_trials=4)
    assert again.returncode == 0 and len(study_of(folder).trials) == 4
    assert "nothing to run" in again.stderr + again.stdout


def enqueue(folder, *params: dict, name="cifar10_proxy"):
    """A study with these trials queued, run first and in this order by the search."""
    folder.mkdir(parents=True)
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{folder / 'optuna.db'}", direction="maximize")
    for p in params:
        study.enqueue_trial(p)


def test_a_trial_below_the_median_is_pruned_and_stops_early_with_its_last_checkpoint(tmp_path):
    folder = tmp_path / "search"
    enqueue(folder, {"optim.lr": 0.003}, {"optim.lr": 1e-7})  # the second learns nothing
    pruner = ["search.pruner={_target_: optuna.pruners.MedianPruner, n_startup_trials: 1}"]
    done, _ = search(tmp_path, "optim.lr=choice(0.003, 1e-07)", *pruner, n_trials=2)
    assert done.returncode == 0, done.stderr[-3000:]
    study = study_of(folder)
    assert states(study) == ["COMPLETE", "PRUNED"]
    pruned = final_metrics(folder, 1)
    assert pruned["epochs_done"] == 1 < 3 and pruned["search"]["pruned_after_epoch"] == 1
    assert final_metrics(folder, 0)["epochs_done"] == 3
    assert (folder / "trial_1" / "checkpoints" / "last.pt").is_file()
    assert study.trials[1].intermediate_values == {1: pruned["final"]["val_top1"]}


def test_successive_halving_runs_the_best_of_each_rung_again_at_the_next_fidelity(tmp_path):
    """hydra.sweeper.fidelity over trainer.epochs [1, 2] with eta 2: 3 settings for 1 epoch, then the best 2 of them
    again for 2 epochs, ranked only against each other; the same command then has nothing to run."""
    folder = tmp_path / "search"
    enqueue(folder, {"optim.lr": 0.003}, {"optim.lr": 1e-7}, {"optim.lr": 0.001})  # the second learns nothing
    fidelity = "hydra.sweeper.fidelity={key: trainer.epochs, values: [1, 2], eta: 2}"
    done, _ = search(tmp_path, "optim.lr=choice(0.003, 1e-07, 0.001)", fidelity, n_trials=3)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_of(folder).trials
    assert states(study_of(folder)) == ["COMPLETE"] * 5
    first, second = trials[:3], trials[3:]
    assert [t.user_attrs["rung"] for t in trials] == [0, 0, 0, 1, 1]
    assert [final_metrics(folder, t.number)["epochs_done"] for t in trials] == [1, 1, 1, 2, 2]
    promoted = [t.user_attrs["promoted_from"] for t in second]
    left = [t for t in first if t.number not in promoted]
    assert len(set(promoted)) == 2 and len(left) == 1
    assert all(trials[n].value >= left[0].value for n in promoted)  # the best two of the first rung
    assert [t.params for t in second] == [trials[n].params for n in promoted]
    best = max(second, key=lambda t: t.value)
    assert f"best trial {best.number} at rung 1 (trainer.epochs=2): val_top1 {best.value:.4f}" in done.stdout
    again, _ = search(tmp_path, "optim.lr=choice(0.003, 1e-07, 0.001)", fidelity, n_trials=3)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "rung 0 (trainer.epochs=1): 3 of 3 trials finished, nothing to run" in again.stdout
    assert "rung 1 (trainer.epochs=2): 2 of 2 trials finished, nothing to run" in again.stdout
    assert len(study_of(folder).trials) == 5
    # summarize_runs: the best of the last rung, a rung column, and importances over the first rung's 3 trials only
    summarize = load_script("summarize_runs")
    assert summarize.main([str(folder), f"out={tmp_path}"]) in (0, None)
    text = (tmp_path / "summary.md").read_text()
    assert f"Best trial: {best.number} (rung 1), val_top1 {best.value:.2f}" in text
    assert "| trial | rung | state | val_top1 | epochs | optim.lr |" in text
    assert "Parameter importances: not shown, 3 complete trials" in text


def test_a_diverged_trial_is_recorded_failed_and_the_search_goes_on(tmp_path):
    folder = tmp_path / "search"
    enqueue(folder, {"optim.lr": 1e30}, {"optim.lr": 0.01})
    diverging = ["optim.name=sgd", "trainer.grad_clip=null", "trainer.max_bad_steps=2"]
    done, _ = search(tmp_path, "optim.lr=choice(1e30, 0.01)", *diverging, n_trials=2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert states(study_of(folder)) == ["FAIL", "COMPLETE"]
    assert "Traceback" not in done.stderr
    assert any(line.startswith("training stopped:") for line in done.stderr.splitlines())


@pytest.mark.slow  # two search processes (9 s on 2 cores): make test-all runs it
def test_a_trial_whose_process_died_is_run_again_and_counted_once(tmp_path):
    """A trial left running by a killed search (its heartbeat stopped) is failed and queued again with its
    parameters; the study's total counts it once."""
    folder = tmp_path / "search"
    folder.mkdir()
    with warnings.catch_warnings():  # heartbeats outside Study.optimize: Optuna warns, as it should here
        warnings.simplefilter("ignore")
        url = f"sqlite:///{folder / 'optuna.db'}"
        storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=1)
        study = optuna.create_study(study_name="cifar10_proxy", storage=storage, direction="maximize")
        trial = study.ask({"optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
    storage.record_heartbeat(trial._trial_id)  # as a running search does, then it died
    lr = trial.params["optim.lr"]
    time.sleep(2.5)
    done, _ = search(tmp_path, "optim.lr=tag(log, interval(1e-4, 1e-2))", "hydra.sweeper.grace_period=1", n_trials=2)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_of(folder).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert trials[1].params["optim.lr"] == lr  # the retry, with the dead trial's parameters
    assert (folder / "trial_1" / "metrics.json").is_file() and not (folder / "trial_0").exists()


@pytest.mark.slow  # a whole search (12-18 s on 2 cores): make test-all runs it
def test_ctrl_c_stops_the_search_and_the_same_command_runs_the_stopped_trial_again(tmp_path):
    folder = tmp_path / "search"
    args = [*SEARCH, f"hydra.sweep.dir={folder}", "hydra.sweeper.n_trials=2", "optim.lr=interval(1e-4, 1e-2)"]
    slow = ["trainer.epochs=40", "trainer.limit_train_batches=3"]  # long enough to be stopped inside its training
    worker = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args, *slow],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in worker.stdout:  # wait for the first trial's second epoch, then Ctrl-C
        lines.append(line)
        if "epoch 2/40" in line:
            worker.send_signal(signal.SIGINT)
            break
    lines += worker.stdout.readlines()
    assert worker.wait(timeout=120) == 0, "".join(lines)[-3000:]
    trials = study_of(folder).trials
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"]
    assert trials[1].params == trials[0].params  # queued again, with its parameters
    assert (folder / "trial_0" / "checkpoints" / "last.pt").is_file()
    assert "trial 0 is queued again with its parameters" in "".join(lines)
    done, _ = search(tmp_path, "optim.lr=interval(1e-4, 1e-2)", n_trials=2)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_of(folder).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]  # the stopped one counted once
    assert trials[1].params == trials[0].params


@pytest.mark.slow  # two search processes (9 s on 2 cores): make test-all runs it
def test_two_processes_share_one_study(tmp_path):
    folder = tmp_path / "search"
    common = [*SEARCH, f"hydra.sweep.dir={folder}", "hydra.sweeper.n_trials=4"]
    common.append("optim.lr=tag(log, interval(1e-4, 1e-2))")
    workers = [
        subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *common, f"hydra.sweeper.sampler.seed={seed}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for seed in (0, 1)
    ]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    trials = study_of(folder).trials
    finished = [t for t in trials if t.state.is_finished()]
    assert len(finished) in (4, 5)  # two workers may each start the last trial at once
    ran = [{n for n in range(len(trials)) if f"] trial {n}: " in out} for out in outputs]
    assert ran[0] and ran[1] and not ran[0] & ran[1]  # each worked on the study, never on the same trial
    assert ran[0] | ran[1] == {t.number for t in trials}


@pytest.mark.parametrize(
    "args, message",
    [
        (["optimized_metric=val_top7"], "optimized_metric='val_top7' must be one of ('val_top1', 'val_top5', "),
        (["optimized_metric=val_loss"], "optimized_metric=val_loss is to minimize but hydra.sweeper.direction=max"),
        (["hydra.sweeper.storage=nosuchdb://x/y"], "hydra.sweeper.storage=nosuchdb://x/y cannot be opened: "),
        (["hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0 must be at least 1"),
        (
            ["hydra.sweeper.fidelity={key: trainer.epochs, values: [1, 2], eta: 1}"],
            "hydra.sweeper.fidelity.eta=1 must be an integer >= 2",
        ),
        (["hydra.sweeper.fidelity={key: trainer.epochs, values: [1]}"], "hydra.sweeper.fidelity.values=[1] must list"),
        (["hydra.sweeper.fidelity={key: optim.lr, values: [1, 2]}"], "fidelity.key=optim.lr is also searched"),
        (["hydra.sweeper.fidelity={key: trainer.epochs, values: [1, 2], rungs: 3}"], "fidelity.rungs is not a"),
        (
            [
                "hydra.sweeper.fidelity={key: trainer.epochs, values: [1, 2]}",
                "search.pruner={_target_: optuna.pruners.MedianPruner}",
            ],
            "set search.pruner=null",
        ),
    ],
)
def test_bad_search_settings_exit_2_with_one_line(tmp_path, args, message):
    done, folder = search(tmp_path, "optim.lr=interval(1e-4, 1e-2)", *args, n_trials=2)
    assert done.returncode == 2, done.stderr[-3000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if "error" in line.lower()] == [done.stderr.strip()]
    assert not (folder / "trial_0").exists()  # refused before any trial ran


@pytest.mark.slow  # a whole search (12-18 s on 2 cores): make test-all runs it
def test_a_trial_with_an_impossible_setting_ends_the_search_with_its_one_line(tmp_path):
    """Composing cannot tell that 5 heads do not divide 32 wide: the trial's run refuses it, the trial is recorded
    as failed, and the search stops with the run's exit code and line."""
    done, folder = search(tmp_path, "model.num_heads=choice(5)", n_trials=3)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "config error: model.num_heads=5 must be a positive divisor of embed_dim=32" in done.stderr
    assert "Traceback" not in done.stderr
    assert states(study_of(folder)) == ["FAIL"]
    # another search space in the same study: one line, before any trial
    done, _ = search(tmp_path, "model.num_heads=choice(2, 4)", n_trials=3)
    assert done.returncode == 2 and done.stderr.startswith("config error: model.num_heads: the search space differs")
    # fixed, the same search runs its 3 trials: the refused one does not count
    done, _ = search(tmp_path, "model.num_heads=choice(5)", "model.embed_dim=40", n_trials=3)
    assert done.returncode == 0, done.stderr[-3000:]
    assert states(study_of(folder)) == ["FAIL", "COMPLETE", "COMPLETE", "COMPLETE"]


def test_a_storage_under_a_file_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done, _ = search(
        tmp_path, "optim.lr=interval(1e-4, 1e-2)", f"hydra.sweeper.storage=sqlite:///{blocker}/s.db", n_trials=1
    )
    assert done.returncode == 2 and done.stderr.startswith(f"config error: hydra.sweeper.storage=sqlite:///{blocker}")


def test_a_plain_run_refuses_an_unknown_metric_and_returns_the_one_asked():
    assert optimized_metric(compose_config([])) == "val_top1"
    assert optimized_metric(compose_config(["task=mae"])) == "val_loss"
    assert optimized_metric(compose_config(["optimized_metric=val_ema_top1", "trainer.ema=true"])) == "val_ema_top1"
    with pytest.raises(ConfigError, match="needs labels"):
        optimized_metric(compose_config(["task=mae", "optimized_metric=val_top1"]))
    with pytest.raises(ConfigError, match="trainer.ema=false"):
        optimized_metric(compose_config(["optimized_metric=val_ema_top1", "trainer.ema=false"]))


def test_the_sweep_grammar_becomes_optuna_distributions():
    d = optuna.distributions
    space, fixed = search_space(
        {"optim.lr": "tag(log, interval(1e-4, 1e-2))", "model.depth": "choice(4, 6)", "trainer.epochs": 3},
        ["sched.warmup_epochs=range(0, 3)", "data.augment.auto_augment=null,autoaug", "model.embed_dim=64"],
    )
    assert space == {
        "optim.lr": d.FloatDistribution(1e-4, 1e-2, log=True),
        "model.depth": d.CategoricalDistribution([4, 6]),
        "sched.warmup_epochs": d.IntDistribution(0, 2),
        "data.augment.auto_augment": d.CategoricalDistribution([None, "autoaug"]),
    }
    assert fixed == ["trainer.epochs=3", "model.embed_dim=64"]


def test_summarize_runs_reads_a_search(three_trials, tmp_path):
    summarize = load_script("summarize_runs")  # its main in this process: a new one costs seconds of imports
    assert summarize.main([str(three_trials), f"out={tmp_path}"]) in (0, None)
    text = (tmp_path / "summary.md").read_text()
    study = study_of(three_trials)
    assert "## Study 'cifar10_proxy': 3 trials (3 complete), maximize val_top1" in text
    assert f"Best trial: {study.best_trial.number}, val_top1 {study.best_value:.2f}" in text
    assert "Trial-epochs run: 9 of 9 asked by the 3 trials the study counts (0% saved by pruning)." in text
    # Three trials are too few for fANOVA to mean anything: said, not shown.
    assert "Parameter importances: not shown, 3 complete trials (at least 10 are needed for 1 parameters)." in text
    assert "| optim.lr |" not in text.split("| trial |")[0]


def test_importances_are_shown_with_their_trial_count_once_there_are_enough():
    from vit.search.report import importance_lines

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_float("lr", 0, 1) + 0.01 * t.suggest_float("wd", 0, 1), n_trials=12)
    lines = importance_lines(study)
    assert lines[0] == "Parameter importances (Optuna's fANOVA over the 12 complete trials):"
    ranked = [line.split("|")[1].strip() for line in lines[4:] if line]
    assert ranked[0] == "lr"  # the parameter the score depends on ranks first
    tied = optuna.create_study()
    tied.optimize(lambda t: t.suggest_float("lr", 0, 1) * 0 + 1.0, n_trials=12)
    assert importance_lines(tied)[0] == "Parameter importances: not shown, the 12 complete trials all scored the same."


def test_every_setting_of_the_budgeted_cpu_search_builds(tmp_path):
    """hparams_search=cifar10_cpu_budget: each value of its space (width with every head count) is a valid recipe
    whose model builds, so no trial of a 2-hour search dies on a setting."""
    import itertools

    import yaml

    from vit.tasks.build import build_model_from_config
    from vit.train.config import validate

    raw = yaml.safe_load((REPO / "configs" / "hparams_search" / "cifar10_cpu_budget.yaml").read_text())
    assert raw["trainer"]["budget"] == "5m" and raw["data"]["holdout"] == 5000 and raw["search"]["pruner"] is None
    fidelity = Fidelity.of(raw["hydra"]["sweeper"]["fidelity"])
    assert fidelity.key == "trainer.budget" and fidelity.values[-1] == "30m"  # the last rung is the recipe's budget
    assert fidelity.sizes(raw["hydra"]["sweeper"]["n_trials"]) == [18, 6, 2]
    space, fixed = search_space(raw["hydra"]["sweeper"]["params"], [])
    assert fixed == [] and len(space) == 8
    (tmp_path / "train" / "a").mkdir(parents=True)
    recipe = compose_config(["experiment=cifar10_cpu", f"data.root={tmp_path}", "data.holdout=5000"])
    # the search chooses the width itself: the recipe's width by the budget is off in it
    assert raw["trainer"]["width_by_budget"] == {"widths": None}
    OmegaConf.update(recipe, "trainer.width_by_budget.widths", None)
    choices = {k: v.choices for k, v in space.items() if isinstance(v, optuna.distributions.CategoricalDistribution)}
    singles = [{key: value} for key, values in choices.items() for value in values if key != "model.embed_dim"]
    pairs = itertools.product(choices["model.embed_dim"], choices["model.num_heads"])
    for settings in [*singles, *({"model.embed_dim": w, "model.num_heads": h} for w, h in pairs)]:
        cfg = recipe.copy()
        for key, value in settings.items():
            OmegaConf.update(cfg, key, value)
        validate(cfg)
        build_model_from_config(cfg.model, num_classes=10)
