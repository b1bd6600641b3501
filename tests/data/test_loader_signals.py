"""A stop signal sent to the whole process group (Ctrl-C in a terminal, `timeout`, a batch scheduler) reaches the
torch loader's worker processes too: they must leave the stop to the trainer, which finishes its step, writes
last.pt and exits 0, instead of dying and taking the run down with a worker traceback."""

import os
import signal
import subprocess
import sys
import time

from trainer_utils import QUICK_SYNTHETIC, TINY_MODEL, ForkedRun


def test_sigterm_to_the_process_group_stops_cleanly_with_loader_workers(tmp_path):
    run_dir = tmp_path / "run"
    args = [*QUICK_SYNTHETIC, *TINY_MODEL, "data.loader=torch", "data.num_workers=2", "data.synthetic.num_train=2048"]
    args += ["data.batch_size=16", "trainer.device=cpu", "trainer.epochs=50", "trainer.log_every_n_steps=1"]
    args += ["trainer.attn_maps_every_n_epochs=0", f"hydra.run.dir={run_dir}"]
    # In its own process group, as a terminal or `timeout` would start it; forked (ForkedRun).
    proc = ForkedRun.train(args, tmp_path, session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:  # until the loader's workers are feeding steps
        if " step 3/" in proc.output():
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # the run and its loader workers alike
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    assert out.count("SIGTERM received") == 1 and "stopped by SIGTERM" in out, out[-3000:]
    assert "killed by signal" not in out and "Traceback" not in out
    assert (run_dir / "checkpoints" / "last.pt").is_file()


EXIT_SCRIPT = """
import sys
from omegaconf import OmegaConf
from vit.data import build_data
cfg = OmegaConf.create({"name": "synthetic", "img_size": 16, "batch_size": 8, "loader": "torch", "num_workers": 2,
                        "synthetic": {"num_train": 64, "num_val": 16}})
bundle = build_data(cfg)
for batch in bundle.train_loader:  # one batch, then exit with the workers alive and the bundle still referenced
    break
print("one batch", flush=True)
"""


def test_a_process_holding_live_loader_workers_still_exits(tmp_path):
    """Python's exit stops the loader's worker processes by signalling them; a worker that ignored SIGTERM would
    make it wait forever."""
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "one batch" in done.stdout, done.stderr[-2000:]
