"""A measurement's record names its code, machine and versions (vit/records/provenance.py)."""

import json
import subprocess

import pytest
from records import measurement_record, write_record

from vit.records.provenance import cpu_facts, git_state

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse avx2 avx512f {extra}
processor\t: 1
model name\t: another model
flags\t\t: fpu
"""


@pytest.mark.parametrize(
    ("extra", "flags"), [("", ["avx2", "avx512f"]), ("avx512_bf16", ["avx2", "avx512f", "avx512_bf16"])]
)
def test_the_cpu_model_and_the_flags_that_decide_its_speed(tmp_path, extra, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(extra=extra))
    facts = cpu_facts(path)
    assert facts["model"] == "AMD EPYC 9B14" and facts["flags"] == flags  # the first core's block


def test_git_state_names_the_commit_and_a_changed_tracked_file(tmp_path, tmp_path_factory):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("a run's output\n")
    assert git_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_state(tmp_path) == {"commit": head, "dirty": True}
    assert git_state(tmp_path_factory.mktemp("not_a_checkout")) == {"commit": None, "dirty": None}


def test_a_record_keeps_every_value_beside_its_provenance(tmp_path):
    record = measurement_record("toy", {"rounds": [1.0, 2.0, 4.0], "median": 2.0}, argv=["bench.py", "n=2"])
    path = write_record(record, tmp_path / "sub" / "toy.json")
    read = json.loads(path.read_text())
    assert read["rounds"] == [1.0, 2.0, 4.0] and read["measurement"] == "toy"
    assert read["provenance"]["command"] == "bench.py n=2"
    assert set(read["provenance"]) >= {"commit", "dirty", "date", "machine", "versions", "torch_threads"}
    assert read["provenance"]["versions"]["torch"] and read["provenance"]["versions"]["timm"]


def test_a_runs_record_names_the_code_it_started_with(tmp_path, monkeypatch):
    """A long run whose checkout moves on (a commit, a pull) still records the commit it was started from."""
    import importlib

    from trainer_utils import QUICK, compose_config

    run_module = importlib.import_module("vit.train.run")  # the module; vit.train.run is also its function

    states = iter([{"commit": "at-start"}, {"commit": "later"}])
    monkeypatch.setattr(run_module, "provenance", lambda: next(states))
    metrics = run_module.run(compose_config([*QUICK, "trainer.epochs=1"]), output_dir=tmp_path)
    assert metrics["provenance"] == {"commit": "at-start"}
    assert json.loads((tmp_path / "metrics.json").read_text())["provenance"] == {"commit": "at-start"}
