"""Hyper-parameter search with Optuna (`python train.py -m hparams_search=...`): `sweeper.py` (the Hydra sweeper
that asks the study for each trial's settings and launches its run; hydra_plugins/vit_sweeper/ names it for
Hydra), `space.py` (Hydra's sweep forms as Optuna distributions), `study.py` (opening the study; which trials
count), `trial.py` (a run as a trial: the metric it reports, its reports to the pruner) and `report.py` (reading a
finished search: its trials, the best one, the parameters' importances). Above the tasks, below the trainer, whose
runs report through `trial.py` without importing the sweeper."""
