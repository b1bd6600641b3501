"""The files a sweep (`train.py -m`) keeps beside its jobs' folders and in them, named once for the command line that
writes them (vit/cli/sweeps.py), the trainer (vit/train/sweep_budget.py) and the summary (vit/analysis/runs.py)."""

FAILED_FILE = "failed.json"  # in a failed job's folder: its exit code, its one line, its overrides
SWEEP_FILE = "sweep.json"  # in the sweep's folder: its jobs, the keys it sweeps, trainer.sweep_budget's shares
LENGTH_FILE = "sweep_length.json"  # ... the epochs every job trains, from the job that fitted them
CLAIM_FILE = "sweep_length.claim"  # ... while a job fits them
