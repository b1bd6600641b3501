"""The docs' tables of measured figures come from their records (lab/record_tables.py,
lab/doc_tables.py)."""

import json
import shutil

import doc_tables as script
import record_tables
from trainer_utils import REPO


def test_every_generated_table_matches_its_records_and_every_measured_table_is_accounted_for(capsys):
    assert script.main(["check=true"]) == 0, capsys.readouterr().out
    generated = {name for doc in script.DOCS for name, _ in record_tables.blocks(doc.read_text())}
    assert generated == set(record_tables.TABLES)  # every table the generator knows is in a document


def test_a_figure_typed_over_a_generated_table_is_caught():
    text = (REPO / "docs" / "RESULTS.md").read_text()
    assert "**69.13% ± 0.28**" in text
    edited = text.replace("**69.13% ± 0.28**", "**70.13% ± 0.28**")
    assert record_tables.regenerate(edited) == text


def test_the_mean_and_spread_are_computed_from_the_records(tmp_path):
    """A seed's record changed by +3 points moves the mean row by +1 over 3 seeds, and its own row by 3."""
    folder = tmp_path / "gpu_budget_h200"
    shutil.copytree(REPO / "docs" / "results" / "gpu_budget_h200", folder)
    before = record_tables.gpu_budget_table(folder)
    record = folder / "cifar10_minute_60s_seed1.json"
    metrics = json.loads(record.read_text())
    metrics["final"]["val_top1"] += 3.0  # 53.92 -> 56.92
    record.write_text(json.dumps(metrics))
    after = record_tables.gpu_budget_table(folder)
    assert "| same | 1 | 58.4 | 1,940 (20.0) | 24,717 | 56.92% |" in after
    assert "**55.13%** (53.92-56.75)" in before and "**56.13%** (54.71-56.92)" in after


def test_the_cpu_tables_compute_their_ratios_from_the_records(tmp_path):
    """The memory table's medians ratio and the INT8 table's speedup move with the records they come from: a
    checkpointed step twice as slow doubles the time ratio; a dynamic INT8 file twice as fast doubles its speedup."""
    memory = json.loads((REPO / "docs" / "results" / "cpu_grad_checkpointing_avx2" / "memory.json").read_text())
    (tmp_path / "memory.json").write_text(json.dumps(memory))
    before = record_tables.memory_table(tmp_path).splitlines()[-1]
    for process in memory["rows"]:
        if process["setting"] == "checkpointed":
            process["step_s"] *= 2
    memory["medians"]["checkpointed"]["step_s"] *= 2
    (tmp_path / "memory.json").write_text(json.dumps(memory))
    after = record_tables.memory_table(tmp_path).splitlines()[-1]
    ratio = memory["medians"]["checkpointed"]["step_s"] / memory["medians"]["plain"]["step_s"]
    assert f"**{ratio / 2:.2f}x**" in before and f"**{ratio:.2f}x**" in after
    int8 = json.loads((REPO / "docs" / "results" / "cpu_inference_avx2" / "int8_speed.json").read_text())
    first = int8["results"][0]["runtimes"]
    speedup = first[1]["ours_ms"] / first[2]["ours_ms"]  # onnxruntime fp32 over INT8 dynamic
    (tmp_path / "int8_speed.json").write_text(json.dumps(int8))
    assert record_tables.int8_speed_table(tmp_path).splitlines()[2].endswith(f"| {speedup:.2f}x |")
    first[2]["ours_ms"] /= 2
    (tmp_path / "int8_speed.json").write_text(json.dumps(int8))
    assert record_tables.int8_speed_table(tmp_path).splitlines()[2].endswith(f"| {2 * speedup:.2f}x |")


def test_a_measured_table_with_no_record_and_no_registry_entry_is_named(tmp_path):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    doc, readme = tmp_path / "docs" / "NEW.md", tmp_path / "README.md"
    doc.write_text("# New\n\n## A new measurement\n\n| model | img/s |\n|---|---|\n| vit | 100 |\n")
    readme.write_text("# Project\n\n| option | what |\n|---|---|\n| a | b |\n")  # not a table of figures
    registry = tmp_path / "docs" / "results" / "README.md"
    header = f"{record_tables.REGISTRY_SECTION}\n\n| document | section | measured | machine |\n|---|---|---|---|\n"
    registry.write_text(header)
    [problem] = record_tables.unaccounted([readme, doc], registry, root=tmp_path)
    assert problem.startswith("docs/NEW.md:5 (A new measurement): a table of measured figures that is neither")
    registry.write_text(header + "| docs/NEW.md | A new measurement | 2026-11-26 | a CPU |\n")
    assert record_tables.unaccounted([readme, doc], registry, root=tmp_path) == []
    # The README quotes no figure without a record, listed or not; and a listed section must exist.
    readme.write_text("# Project\n\n## Speed\n\n| model | img/s |\n|---|---|\n| vit | 100 |\n")
    registry.write_text(
        header + "| docs/NEW.md | A new measurement | 2026-11-26 | a CPU |\n| docs/NEW.md | Gone | - | - |\n"
    )
    problems = record_tables.unaccounted([readme, doc], registry, root=tmp_path)
    assert problems[0].startswith("README.md:5: a table of measured figures in the README")
    assert problems[1] == "docs/results/README.md: lists docs/NEW.md, 'Gone', which holds no table of measured figures"


def test_an_unknown_table_name_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "X.md"
    doc.write_text("<!-- table: no_such_table -->\n<!-- /table -->\n")
    monkeypatch.setattr(script, "DOCS", [doc])
    monkeypatch.setattr(script, "REPO", tmp_path)
    assert script.run_script(script.main, ["check=true"]) == 2
    assert "X.md: no table named 'no_such_table'" in capsys.readouterr().err


def test_the_model_step_rows_come_from_each_record_with_the_peer_named(tmp_path):
    """A record's throughput and ratio change its row and only its row; the official code is named as the peer of
    the T2T cases and timm of the ViTs."""
    folder = tmp_path / "model_step_h200"
    shutil.copytree(REPO / "docs" / "results" / "model_step_h200", folder)
    record = folder / "step_vit_base.json"
    data = json.loads(record.read_text())
    eager = data["results"][0]
    eager["sides"][0]["img_per_s"], eager["ratio_median"] = 5000.0, 1.9
    record.write_text(json.dumps(data))
    before = record_tables.model_step_table(REPO / "docs" / "results" / "model_step_h200").splitlines()
    after = record_tables.model_step_table(folder).splitlines()
    changed = [(old, new) for old, new in zip(before, after, strict=True) if old != new]
    assert len(changed) == 1
    assert "| `vit_base` | 224 | 128 | eager | 5,000 |" in changed[0][1] and "| 1.900 (" in changed[0][1]
    assert all("(official)" in row for row in after if "t2t_vit" in row)
    assert all("(timm)" in row for row in after[2:] if "`vit_" in row)


def test_the_headline_rows_come_from_their_seeds_and_refuse_a_run_cut_short(tmp_path):
    """The first table of README.md and docs/RESULTS.md: a seed's test top-1 raised by 3 points raises the row's
    mean by 1 over 3 seeds; a seed that trained fewer steps than it planned is named, not averaged."""
    row = record_tables.HEADLINES_CPU[0]
    shutil.copytree(REPO / "docs" / "results" / row.records, tmp_path / row.records)
    before = record_tables.headline_table([row], tmp_path, "results/")
    record = tmp_path / row.records / "seed1" / "metrics.json"
    metrics = json.loads(record.read_text())
    scored = metrics["test"] if metrics.get("test") else metrics["final"]  # no holdout: the last evaluation's
    scored["top1" if "top1" in scored else "val_top1"] += 3.0
    record.write_text(json.dumps(metrics))
    after = record_tables.headline_table([row], tmp_path, "results/")
    mean = float(before.split("**")[1].rstrip("%"))
    assert f"**{mean + 1:.2f}%**" in after and "(3 seeds)" in after
    assert f"[{row.records.rsplit('/', 1)[0]}](results/{row.records}/)" in after
    metrics["budget"]["trained_steps"] -= 1
    record.write_text(json.dumps(metrics))
    try:
        record_tables.headline_table([row], tmp_path, "results/")
    except ValueError as error:
        assert row.records in str(error) and "stopped after" in str(error)
    else:
        raise AssertionError("a seed cut short was averaged")


def test_the_first_plan_rows_read_each_runs_first_plan_and_how_it_priced_the_later_sizes(tmp_path):
    """A row's ratio is the first plan's steps over the steps trained; a run that recorded its fixed share says how
    the later sizes were priced, one before it that they were priced at the first size's cost."""
    name = record_tables.FIRST_PLANS[-1][1]
    shutil.copytree(REPO / "docs" / "results" / "cifar10_cpu_budget" / name, tmp_path / name)
    for record in (tmp_path / name).rglob("metrics.json"):  # the last row is the folder's last run
        metrics = json.loads(record.read_text())
        metrics["budget"]["plans"][0]["total_steps"] = 2 * metrics["budget"]["trained_steps"]
        metrics["budget"]["fixed_share"] = 0.06
        record.write_text(json.dumps(metrics))
    table = record_tables.first_plan_table(tmp_path)
    assert "| by tokens and a fixed 6% |" in table and table.rstrip().endswith("| 2.00 |")
    del metrics["budget"]["fixed_share"]
    record.write_text(json.dumps(metrics))
    assert "| at the first size's cost |" in record_tables.first_plan_table(tmp_path)
