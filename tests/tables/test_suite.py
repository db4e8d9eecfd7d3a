"""SCALE=real end to end on a shrunken table2 preset (toy data, tiny model, few updates): cells
run as local processes, records land in results/ (here a temp folder) as each cell finishes, a
second call trains nothing and reuses them, and the report carries every arm and claim."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path

import pytest

from runner.run.allocator import cpu_training_allocator
from runner.tables import suite
from runner.tables.plots import grid_axes, grid_panels, plot_grid, plot_transfer, transfer_panels
from runner.tables.pool import Job, cell_threads, run_jobs
from runner.tables.records import cell_key
from runner.tables.report import curve_slope, provenance, render
from tests.conftest import REPO, compose, run_cli_here

SHRINK = ["data=toy", "data.toy.train_size=300", "data.toy.valid_size=30", "data.toy.test_size=20",
          "model=ci", "model.dim=32", "model.ffn_dim=64", "model.heads=2", "model.layers=2",
          "trainer.max_updates=20", "trainer.log_interval=5", "trainer.valid_interval=10",
          "trainer.save_interval=10", "trainer.eval_beam=2", "method=pre_ln,post_ln",
          "warmup.updates=5,0", "trainer.seed=1,2"]


@pytest.fixture(autouse=True)
def at_most_two_cores(monkeypatch):
    """The pools here share at most 2 cores among their cells (pool.cell_threads), as on the
    2-core machines the suite is timed on: on a many-core machine a lone tiny cell would
    otherwise train with every core, beside the other test workers."""
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "cpu_count", lambda: min(2, cores))


def test_a_partial_suite_reads_incomplete():
    cells = suite.plan("reproduce_table2_real")
    record = {"status": "ok", "bleu": 10.0, "sacrebleu": 9.0, "best_valid_loss": 4.0}
    for cell in cells:
        if cell.arm == {"method": "post_ln", "warmup.updates": "500"} and cell.seed == 1:
            cell.record = record
    by_id = {v.claim.id: v for v in suite.verdicts("reproduce_table2_real", cells)}
    assert by_id["post_ln_deep_fails_with_warmup"].verdict == "incomplete"
    assert by_id["post_ln_deep_fails_with_warmup"].measured.startswith("1 of 3 cells have a record; so far:")
    assert by_id["pre_ln_no_warmup_trains"].verdict == "incomplete"  # 0 of 3


def test_part_of_a_suite_keeps_the_whole_arm_the_seed_and_the_exclusions():
    """Fixing a preset axis on the command line (to train part of a suite) leaves it in the arm,
    so the record names its arm as the full plan does; a fixed seed is the cell's seed; and an
    arm the preset excludes stays excluded when the command line pins it."""
    full = {(tuple(c.arm.items()), c.seed): c.key for c in suite.plan("reproduce_table2_gpu")}
    part = suite.plan("reproduce_table2_gpu", ["model.layers=6", "method=admin,post_ln",
                                               "warmup.updates=0", "trainer.seed=2"])
    assert [(c.arm, c.seed) for c in part] == [
        ({"method": "admin", "model.layers": "6", "warmup.updates": "0"}, 2),
        ({"method": "post_ln", "model.layers": "6", "warmup.updates": "0"}, 2)]
    assert all(full[(tuple(c.arm.items()), c.seed)] == c.key for c in part)  # same identity
    assert suite.plan("reproduce_table2_gpu", ["method=tfixup", "warmup.updates=1000"]) == []
    # how a cell runs (device, compiled or not) reaches its command but not its identity
    compiled = suite.plan("reproduce_table2_gpu", ["trainer.compile=true", "trainer.device=cpu"])
    assert [full[(tuple(c.arm.items()), c.seed)] for c in compiled] == [c.key for c in compiled]
    assert len(compiled) == 28 and all(c.overrides[-2:] == ["trainer.compile=true", "trainer.device=cpu"]
                                       for c in compiled)
    # the prefixes Hydra reads alike give the same cells (the preset's own spelling)
    for spelled in (["++model.layers=6", "+trainer.seed=2"], ["model.layers=6", "++trainer.seed=2"]):
        respelled = suite.plan("reproduce_table2_gpu", spelled)
        assert [(c.key, c.overrides) for c in respelled] == [
            (c.key, c.overrides) for c in suite.plan("reproduce_table2_gpu", ["model.layers=6", "trainer.seed=2"])]
    lipschitz = suite.plan("reproduce_lipschitz_real", ["++reproduce=order_v1"])  # the preset spells it +reproduce
    own = {cell_key(c.key) for c in suite.plan("reproduce_lipschitz_real")}
    assert len(lipschitz) == 12 and all(cell_key(c.key) in own for c in lipschitz)
    # a seed outside the preset's axes is still the cell's seed
    assert {c.seed for c in suite.plan("reproduce_grid_paper", ["trainer.seed=5"])} == {5}
    # a value the preset has, written another way, is the preset's cell (its spelling, its
    # key); a value it does not have, or one of another type, is not respelled
    for other in (["method='admin'", "warmup.updates=0.0", "trainer.seed=2.0", "model.layers=6e0"],
                  ["method=admin", "warmup.updates=0e0,1e3", "trainer.seed=2", "model.layers=6"]):
        cells = suite.plan("reproduce_table2_gpu", other)
        assert cells and all(full[(tuple(c.arm.items()), c.seed)] == c.key for c in cells), other
    assert [c.arm["warmup.updates"] for c in suite.plan("reproduce_table2_gpu", ["warmup.updates=999",
                                                                                 "method=pre_ln"])] == ["999"] * 4
    assert {c.arm["method"] for c in suite.plan("reproduce_table2_gpu", ["method=true"])} == {"True"}
    # a Hydra call runs the text as typed, so the plan that finds its run folders keeps it
    from runner.sweep.plan import plan_cells
    assert plan_cells("reproduce_table2_gpu", ["method='admin'"])[1] == ["method='admin'"]
    # a shuffle() sweep keeps each value with its own text
    for _ in range(5):
        shuffled = suite.plan("reproduce_table2_gpu", ["method=pre_ln", "model.layers=6", "trainer.seed=1",
                                                       "warmup.updates=shuffle(1e3,0,7)"])
        assert sorted(c.arm["warmup.updates"] for c in shuffled) == ["0", "1000", "7"]
    # an axis the command line adds is part of the arm too
    added = suite.plan("reproduce_table2_real", ["method=pre_ln", "optim.lr=1e-3,2e-3"])
    assert {c.arm["optim.lr"] for c in added} == {"0.001", "0.002"}
    assert all(c.arm["method"] == "pre_ln" and "warmup.updates" in c.arm for c in added)


def test_a_claim_on_every_cell_reads_incomplete_until_every_cell_has_a_record(monkeypatch):
    # An empty selector picks every cell: one missing record anywhere keeps it incomplete.
    preset = suite.load_preset("reproduce_table2_real")
    preset = {**preset, "sweep": {**preset["sweep"], "claims": [
        {"id": "all_train", "text": "every cell trains", "kind": "trains", "a": {}}]}}
    monkeypatch.setattr(suite, "load_preset", lambda name: preset)
    cells = suite.plan("reproduce_table2_real")
    for cell in cells[1:]:
        cell.record = {"status": "ok", "bleu": 10.0, "sacrebleu": 9.0, "best_valid_loss": 4.0}
    verdict, = suite.verdicts("reproduce_table2_real", cells)
    assert verdict.verdict == "incomplete"
    assert verdict.measured.startswith(f"{len(cells) - 1} of {len(cells)} cells have a record")
    cells[0].record = dict(cells[1].record)
    verdict, = suite.verdicts("reproduce_table2_real", cells)
    assert verdict.verdict == "reproduced"


def test_a_claim_restricted_to_part_of_a_grid_waits_only_for_that_part():
    # The mup-transfer claims written for the first five lrs are final once those cells have a
    # record, while the claims over the widened grid still read incomplete.
    cells = suite.plan("reproduce_mup_transfer_real")
    first = ("0.0005", "0.001", "0.002", "0.004", "0.008")
    for cell in cells:
        if cell.arm["optim.lr"] in first:
            best = cell.arm["optim.lr"] == "0.002"
            cell.record = {"status": "ok", "best_valid_loss": 3.0 if best else 4.0 + cell.seed / 10}
    by_id = {v.claim.id: v for v in suite.verdicts("reproduce_mup_transfer_real", cells)}
    original = by_id["depth_mup_lr_transfers_across_depth"]
    assert original.verdict == "reproduced", original.measured
    assert "grid 0.0005 to 0.008, 5 values" in original.measured
    wide = by_id["depth_mup_lr_transfers_across_depth_wide_grid"]
    assert wide.verdict == "incomplete" and wide.measured.startswith("20 of 28 cells have a record")
    next(c for c in cells if c.arm["method"] == "depth_mup" and c.arm["optim.lr"] == "0.001").record = None
    original, = [v for v in suite.verdicts("reproduce_mup_transfer_real", cells) if v.claim.id == original.claim.id]
    assert original.verdict == "incomplete" and original.measured.startswith("19 of 20 cells have a record")


def test_transfer_panels_and_plot(tmp_path):
    # One panel per method (the claims kept to the first five lrs share their wide claim's panel),
    # one line per depth: the mean of the ok seeds per lr, NaN where no seed finished ok.
    cells = suite.plan("reproduce_mup_transfer_real")
    for cell in cells:
        lr, seed = float(cell.arm["optim.lr"]), cell.seed
        if cell.arm["method"] == "pre_ln" and cell.arm["model.layers"] == "12" and lr == 0.032:
            cell.record = {"status": "diverged", "best_valid_loss": 9.0}
        elif cell.arm["method"] == "depth_mup" and cell.arm["model.layers"] == "12":
            cell.record = {"status": "stalled", "best_valid_loss": 6.0}  # a line with no ok cell
        elif lr <= 0.016:
            cell.record = {"status": "ok", "best_valid_loss": abs(math.log10(lr) + 2) + seed / 10}
    panels = transfer_panels("reproduce_mup_transfer_real", cells)
    assert list(panels) == ["depth_mup_lr_transfers_across_depth_wide_grid",
                            "pre_ln_lr_transfers_across_depth_wide_grid"]
    pre = panels["pre_ln_lr_transfers_across_depth_wide_grid"]
    assert pre["title"] == "method=pre_ln" and pre["xs"][-2:] == ["0.016", "0.032"]
    means = pre["lines"]["12"]["means"]
    assert means[0] == pytest.approx(abs(math.log10(0.0005) + 2) + 0.15)  # seeds 1 and 2
    assert math.isnan(means[-1]) and pre["lines"]["12"]["failed"] == ["0.032", "0.032"]
    assert pre["lines"]["6"]["failed"] == [] and math.isnan(pre["lines"]["6"]["means"][-1])
    assert len(pre["lines"]["6"]["seeds"]) == 12  # 6 lrs x 2 seeds
    mup12 = panels["depth_mup_lr_transfers_across_depth_wide_grid"]["lines"]["12"]
    assert all(math.isnan(m) for m in mup12["means"]) and len(mup12["failed"]) == 14
    path = plot_transfer("reproduce_mup_transfer_real", cells, tmp_path / "transfer.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "transfer.png: for each transfer claim" in render(
        "mup-transfer", "t", "reproduce_mup_transfer_real", cells)
    assert transfer_panels("reproduce_table2_real", suite.plan("reproduce_table2_real")) == {}


def test_a_transfer_panel_without_cells_draws_no_empty_legend(tmp_path):
    """Overrides that leave the transfer claim's arm out of a run (method=pre_ln,post_ln on the
    LM tier) give its panel no line: the plot is drawn without matplotlib's empty-legend warning
    in the pool's log."""
    import warnings

    cells = [c for c in suite.plan("reproduce_lm_real") if c.arm["method"] in ("pre_ln", "post_ln")]
    cells[0].record = {"status": "ok", "best_valid_loss": 2.0}
    (panel,) = transfer_panels("reproduce_lm_real", cells).values()
    assert panel["lines"] == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = plot_transfer("reproduce_lm_real", cells, tmp_path / "transfer.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_claims_on_the_last_checkpoint_read_its_measurements_and_wait_for_them(tmp_path, monkeypatch):
    """A claim whose BLEU bar reads the last checkpoint (bleu_metric: bleu_last) takes the values
    from last-checkpoint-bleu.jsonl beside the records, and reads incomplete while an ok cell of
    its arm has no measurement; the claim on the averaged BLEU judges the records alone (rule book
    v1, whose per-claim bars reports still show beside the current verdicts)."""
    import json as _json

    from runner.tables.records import Records

    preset = suite.load_preset("reproduce_lipschitz_real")
    arm = {"reproduce": "order_v1", "init": "lipschitz", "model.layers": 12}
    preset = {**preset, "sweep": {**preset["sweep"], "claims": [
        {"id": "avg", "text": "trains", "kind": "trains", "min_bleu": 10, "a": arm},
        {"id": "last", "text": "trains", "kind": "trains", "min_bleu": 10, "bleu_metric": "bleu_last", "a": arm}]}}
    monkeypatch.setattr(suite, "load_preset", lambda name: preset)
    cells = [c for c in suite.plan("reproduce_lipschitz_real")
             if c.arm == {"reproduce": "order_v1", "init": "lipschitz", "model.layers": "12"}]
    assert len(cells) == 3
    tier = tmp_path / "tier"
    tier.mkdir()
    bleu = {1: (5.32, 15.75), 2: (6.0, 14.0), 3: (4.0, 12.5)}
    with (tier / "records.jsonl").open("w") as f:
        for c in cells:
            f.write(_json.dumps({"overrides": c.key, "seed": c.seed, "status": "ok", "bleu": bleu[c.seed][0],
                                 "sacrebleu": 1.0, "best_valid_loss": 3.7}) + "\n")
    measured = [{"overrides": c.key, "seed": c.seed, "bleu_averaged": bleu[c.seed][0], "bleu_last": bleu[c.seed][1]}
                for c in cells]
    (tier / "last-checkpoint-bleu.jsonl").write_text(_json.dumps(measured[0]) + "\n" + _json.dumps(measured[1]) + "\n")
    suite.attach_records(cells, Records.load(tier))
    by_id = {v.claim.id: v for v in suite.verdicts("reproduce_lipschitz_real", cells, version=1)}
    assert by_id["avg"].verdict == "not reproduced"
    assert by_id["last"].verdict == "incomplete"
    assert by_id["last"].measured.startswith("2 of 3 cells have a record measured on their last checkpoint")
    with (tier / "last-checkpoint-bleu.jsonl").open("a") as f:
        f.write(_json.dumps(measured[2]) + "\n")
    suite.attach_records(cells, Records.load(tier))
    by_id = {v.claim.id: v for v in suite.verdicts("reproduce_lipschitz_real", cells, version=1)}
    assert by_id["last"].verdict == "reproduced" and by_id["avg"].verdict == "not reproduced"
    # a measurement taken beside another record of the cell (retrained since) is not used
    stale = dict(measured[2], bleu_averaged=7.0)
    (tier / "last-checkpoint-bleu.jsonl").write_text("".join(_json.dumps(m) + "\n" for m in (*measured[:2], stale)))
    suite.attach_records(cells, Records.load(tier))
    assert {v.claim.id: v for v in suite.verdicts("reproduce_lipschitz_real", cells, version=1)}["last"].verdict == "incomplete"
    (tier / "last-checkpoint-bleu.jsonl").write_text("".join(_json.dumps(m) + "\n" for m in measured))
    # a cell trained with trainer.final_bleu_last carries bleu_last in its record: no file needed
    (tier / "last-checkpoint-bleu.jsonl").unlink()
    suite.attach_records(cells, Records.load(tier))
    assert {v.claim.id: v for v in suite.verdicts("reproduce_lipschitz_real", cells, version=1)}["last"].verdict == "incomplete"
    for c in cells:
        c.record = {**c.record, "bleu_last": bleu[c.seed][1]}
    assert {v.claim.id: v for v in suite.verdicts("reproduce_lipschitz_real", cells, version=1)}["last"].verdict == "reproduced"
    # saving the records writes the records alone: the measurements stay in their own file
    records = Records.load(tier)
    records.save()
    assert all("bleu_last" not in _json.loads(line) for line in (tier / "records.jsonl").read_text().splitlines())


def test_the_last_checkpoint_bleu_column_appears_for_arms_whose_ok_seeds_all_have_it():
    cells = suite.plan("reproduce_table2_real")
    pre = [c for c in cells if c.arm == {"method": "pre_ln", "warmup.updates": "0"}]
    admin = [c for c in cells if c.arm == {"method": "admin", "warmup.updates": "0"}]
    for c, last in zip(pre, (30.0, 32.0, 34.0)):
        c.record = {"status": "ok", "bleu": last - 2, "bleu_last": last, "best_valid_loss": 3.2}
    for c, last in zip(admin, (31.0, None, None)):  # one seed measured of three
        c.record = {"status": "ok", "bleu": 29.0, "bleu_last": last, "best_valid_loss": 3.3}
    report = render("table2", "Table 2", "reproduce_table2_real", cells)
    header = next(line for line in report.splitlines() if line.startswith("| arm"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[cols.index("BLEU (tok)") + 1] == "BLEU last ckpt"
    row = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
           for line in report.splitlines() if line.startswith("| method=")}
    i = cols.index("BLEU last ckpt")
    assert row["method=pre_ln warmup.updates=0"][i].startswith("32.00 ± 2.00")
    assert row["method=pre_ln warmup.updates=0"][i - 1].startswith("30.00 ± 2.00")
    assert row["method=admin warmup.updates=0"][i] == "-"
    assert "BLEU last ckpt: the tokenized BLEU" in report
    for c in pre:
        c.record = {k: v for k, v in c.record.items() if k != "bleu_last"}
    without = render("table2", "Table 2", "reproduce_table2_real", cells)  # only a partial arm: no column
    assert "BLEU last ckpt" not in without


def test_a_claim_added_later_is_marked_with_its_reason():
    cells = suite.plan("reproduce_table2_real")
    for cell in cells:
        if cell.arm == {"method": "post_ln", "warmup.updates": "0"}:
            cell.record = {"status": "stalled", "best_valid_loss": 6.2}
    report = render("table2", "Table 2", "reproduce_table2_real", cells)
    row = next(line for line in report.splitlines() if line.startswith("| post_ln_no_warmup_fails_to_train"))
    assert "†" in row and "**reproduced**" in row and "3 of 3 seeds failed to train" in row
    original = next(line for line in report.splitlines() if line.startswith("| post_ln_no_warmup_fails |"))
    assert "**not reproduced**" in original  # the rule written before the run keeps its verdict
    assert "† post_ln_no_warmup_fails_to_train: after seed 1" in report


def test_claims_added_for_two_reasons_get_one_paragraph_each():
    """The language-model tier added two control claims at two times: each reason is its own
    paragraph under the claims table (a blank line between them)."""
    report = render("lm", "LM", "reproduce_lm_real", suite.plan("reproduce_lm_real"))
    notes = [block for block in report.split("\n\n") if block.startswith("† ")]
    assert [n.split(":")[0] for n in notes] == ["† deepnorm_untied_trains_24l",
                                                "† dyt_embed_scale_matches_layernorm"]
    assert all("\n" not in n.strip() for n in notes)


def test_grid_heatmap_panels_and_png(tmp_path):
    assert grid_axes("reproduce_table2_real") is None
    assert grid_axes("reproduce_grid_real") == ("optim.lr", "optim.beta2")
    cells = suite.plan("reproduce_grid_real")
    assert len(cells) == 90
    for cell in cells:
        if cell.arm["optim.lr"] == "0.0002" and cell.arm["optim.beta2"] == "0.99":
            if cell.arm["method"] == "pre_ln":
                cell.record = {"status": "ok", "best_valid_loss": 3.0 + cell.seed}  # 4.0, 5.0
            elif cell.arm["method"] == "post_ln":
                cell.record = {"status": "diverged" if cell.seed == 1 else "ok", "best_valid_loss": 6.5}
    panels = grid_panels(cells, "optim.lr", "optim.beta2")
    assert sorted(panels) == ["method=admin", "method=post_ln", "method=pre_ln"]
    pre = panels["method=pre_ln"]
    assert pre["xs"] == ["0.0002", "0.0004", "0.0006", "0.0008", "0.001"] and pre["ys"] == ["0.99", "0.995", "0.999"]
    assert pre["values"][0][0] == 4.5 and pre["labels"][0][0] == "4.50"
    assert pre["labels"][1][0] == "-" and pre["values"][1][0] != pre["values"][1][0]  # NaN: not run
    post = panels["method=post_ln"]
    assert post["values"][0][0] == 6.5 and post["labels"][0][0] == "6.50\n1/2 div"
    assert plot_grid("reproduce_grid_real", cells, tmp_path / "heatmap.png") == tmp_path / "heatmap.png"
    assert (tmp_path / "heatmap.png").stat().st_size > 10_000
    assert "heatmap.png: per optim.lr optim.beta2 setting" in render("grid", "Grid", "reproduce_grid_real", cells)


def test_provenance_gives_the_commits_machines_and_wall_time_per_cell():
    machine = {"git_commit": "0123456789abcdef", "device_name": "AMD EPYC", "threads": 1, "torch": "2.13.0+cpu"}
    records = [{"machine": machine, "wall_s": s} for s in (300.0, 1200.0, 600.0)]
    line = provenance(records + [{"machine": machine, "wall_s": None}])  # a record without one is skipped
    assert line == ("Commits: 0123456789. Machines: AMD EPYC, 1 thread(s), torch 2.13.0+cpu. "
                    "Wall time per cell: median 10.0 min (5.0 to 20.0).")
    assert "Wall time" not in provenance([{"machine": machine}])


def test_curve_slope():
    assert curve_slope([(200, 5.0), (400, 4.0), (600, 3.8), (800, 3.7)]) == pytest.approx(-0.75)
    assert curve_slope([(200, 5.0)]) is None


@pytest.mark.slow
def test_real_tier_records_reuse_and_report(tmp_path):
    env = {**os.environ, "DEEPINIT_RESULTS": str(tmp_path / "results")}
    args = ["reproduce", "table2", "--scale", "real", "--parallel", "2", "--out", str(tmp_path / "out"),
            *SHRINK[:-2], "warmup.updates=0", "trainer.seed=1,2",  # Table 2's no-warmup arms
            "trainer.divergence.stall_margin=-1000",  # 20 updates: never call a cell stalled
            "trainer.threads=1"]  # a process of its own: one thread per cell on any machine
    first = run_cli_here(args, cwd=REPO, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # SHRINK changes the preset's cells (toy data, a tiny model): a variant, whose records and
    # report stay beside its run folders and never reach results/
    tier = tmp_path / "out" / "table2-real"
    assert not (tmp_path / "results").exists()
    assert "a variant, kept out of results/" in first.stdout
    # a log that is not a terminal has no progress bar: each cell's line counts the cells and
    # says the time left at the pace so far
    assert re.search(r"\[1 of 4 cells, ~[\d.]+ (s|min|h) left\]", first.stdout), first.stdout[-2000:]
    assert "[4 of 4 cells]" in first.stdout
    records = [json.loads(line) for line in (tier / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4  # 2 methods x 2 seeds
    assert {r["seed"] for r in records} == {1, 2}
    for r in records:
        assert r["status"] == "ok" and r["updates"] == 20
        assert r["machine"]["git_commit"] and r["machine"]["torch"]
        assert r["machine"]["compile"] is False and r["pool_slots"] == 2  # how it ran: eager, 2 at once
        # each cell's process on the CPU keeps its freed memory (runner/run/allocator.py; glibc)
        assert r["machine"]["host_allocator"] == cpu_training_allocator()
        assert r["valid_curve"] and "+sweep=reproduce_table2_real" in r["overrides"]
        # the logged training losses, what loss spikes are counted from (SHRINK logs every 5)
        assert [step for step, _ in r["train_curve"]] == [5, 10, 15, 20]
        assert len(r["train_curve"]) == 4
        assert r["bleu"] is not None and r["best_valid_loss"] is not None
        assert r["bleu_last"] is not None  # the preset's trainer.final_bleu_last
    report = (tier / "report.md").read_text()
    assert "method=pre_ln warmup.updates=0" in report and "post_ln_no_warmup_fails" in report
    # claims on arms this shrunken plan trains get a verdict; those on arms it lacks are "not run"
    assert "**not run**" in report and "**incomplete**" not in report
    assert (tier / "curves.png").stat().st_size > 0
    # a second call trains nothing: every cell has its record
    second = run_cli_here(args, cwd=REPO, env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "4 with a record" in second.stdout
    assert (tier / "report.md").read_text() == report


def test_a_report_after_part_of_a_suite_is_the_whole_suites(tmp_path):
    """Overrides that pick some of the preset's own cells (here for --table-only, which trains
    nothing) still give the report of the whole suite from its records; overrides that make
    other cells report those cells."""
    import shutil

    results = tmp_path / "results"
    shutil.copytree(REPO / "results" / "table2" / "real", results / "table2" / "real")
    env = {**os.environ, "DEEPINIT_RESULTS": str(results)}
    report = results / "table2" / "real" / "report.md"

    def table(*overrides: str) -> str:
        proc = run_cli_here(["reproduce", "table2", "--scale", "real", "--table-only", "--out",
                             str(tmp_path / "out"), *overrides], cwd=REPO, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return report.read_text()

    whole = table()
    done = len((results / "table2" / "real" / "records.jsonl").read_text().splitlines())
    assert f"{done} of 35 cells have a record" in whole
    assert table("method=pre_ln", "trainer.seed=2") == whole
    # a spelling Hydra reads alike picks the same cells
    assert table("++method=pre_ln", "+trainer.seed=2") == whole
    # cells the preset does not have: a variant, reported beside its run folders
    assert table("method=pre_ln", "optim.lr=2e-3") == whole
    other = (tmp_path / "out" / "table2-real" / "report.md").read_text()
    # Pre-LN's cells: seeds 1-10 with warmup, 1-3 without
    assert "0 of 13 cells have a record" in other and "| method=post_ln" not in other


def test_gpu_tier_records_under_its_own_tier_with_time_and_memory_columns(tmp_path):
    """SCALE=gpu is the same suite with its own preset and records folder; here on CPU
    (trainer.device=cpu, the override that lets it run without a GPU), shrunk like above."""
    env = {**os.environ, "DEEPINIT_RESULTS": str(tmp_path / "results")}
    args = ["reproduce", "tfixup-depth", "--scale", "gpu", "--out", str(tmp_path / "out"),
            "++trainer.device=cpu", "trainer.precision=fp32", *SHRINK[:4], "model.layers=2",
            "trainer.max_updates=6", "trainer.log_interval=3", "trainer.valid_interval=3",
            "trainer.save_interval=3",
            "trainer.eval_beam=2", "trainer.seed=1"]
    proc = run_cli_here(args, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "(real data, GPU)" in proc.stdout and "1 at a time" in proc.stdout  # one cell per GPU by default
    tier = tmp_path / "out" / "tfixup-depth-gpu"  # shrunk: a variant, kept out of results/
    assert not (tmp_path / "results").exists()
    (record,) = [json.loads(line) for line in (tier / "records.jsonl").read_text().splitlines()]
    assert "+sweep=reproduce_tfixup_depth_gpu" in record["overrides"] and record["updates"] == 6
    assert record["seconds_per_update"] > 0 and record["peak_memory_mb"] is None  # no CUDA: no peak
    report = (tier / "report.md").read_text()
    assert report.startswith("# T-Fixup ultra-deep scan") and "real-data tier on a GPU" in report
    header = next(line for line in report.splitlines() if line.startswith("| arm"))
    assert header.split("|")[-4:-1] == [" GPU min ", " s/update ", " peak MiB "]
    lines = report.splitlines()
    row = lines[lines.index(header) + 2]  # the one arm (model.layers=2 pins the preset's axis)
    assert row.split("|")[-3].strip() == f"{record['seconds_per_update']:.3f}"


def test_gpu_tier_without_a_gpu_says_so_in_one_line(tmp_path):
    from runner.run.hardware import gpu_visible

    if gpu_visible():
        pytest.skip("a GPU is visible: the tier runs")
    proc = run_cli_here(["reproduce", "table2", "--scale", "gpu", "--out", str(tmp_path)], cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]  # one line, no traceback
    assert "--scale gpu trains on CUDA, and no GPU is visible here" in proc.stderr
    assert not (tmp_path / "table2-gpu").exists()
    # the plan trains nothing, so it is shown without a GPU (e.g. on a cluster's login node)
    proc = run_cli_here(["reproduce", "table2", "--scale", "gpu", "--dry-run", "--out", str(tmp_path)],
                        cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "28 cells" in proc.stdout and "estimated wall time" in proc.stdout
    assert not any(tmp_path.iterdir())


# ci/gpu-session.sh's reproduce steps rehearsed on CPU: the device forced to CPU, one tiny cell
GPU_SESSION_CPU_ARGS = ["trainer.device=cpu", "trainer.precision=fp32", *SHRINK[:4], "model.layers=2",
                        "trainer.seed=1", "trainer.max_updates=6", "trainer.log_interval=3",
                        "trainer.valid_interval=3", "trainer.save_interval=3", "trainer.eval_beam=2"]


def _gpu_session_env(tmp_path, out) -> dict:
    """The script's environment for a test: $OUT, the records, the run folders, this Python."""
    import sys

    return {**os.environ, "OUT": str(out), "DEEPINIT_RESULTS": str(tmp_path / "results"),
            "PYTHON": sys.executable, "RUNS": str(tmp_path / "runs")}


@pytest.mark.slow
def test_gpu_session_script_runs_a_suite_step_and_copies_its_records_to_out(tmp_path):
    """ci/gpu-session.sh's reproduce step, here on CPU (trainer.device=cpu, toy data): the step
    passes its arguments on, and $OUT receives the log, the machine file and the records; an
    unknown step is one line and status 2."""
    import subprocess

    out = tmp_path / "gpu-out"
    env = _gpu_session_env(tmp_path, out)
    # a limit of 400 s: the step's deadline (30 s inside) leaves room for the preset's 5 min per cell
    proc = subprocess.run(["bash", "ci/gpu-session.sh", "depth", "400", *GPU_SESSION_CPU_ARGS], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "machine-depth.txt").read_text().strip()
    log = (out / "tfixup-depth.log").read_text()
    assert "(real data, GPU)" in log and "deadline" not in log  # the one cell fit
    # the shrunken cells are a variant: their records come back from beside the run folders
    (record,) = (out / "tfixup-depth-gpu-variant" / "records.jsonl").read_text().splitlines()
    assert json.loads(record)["updates"] == 6 and (out / "tfixup-depth-gpu-variant" / "report.md").is_file()
    bad = subprocess.run(["bash", "ci/gpu-session.sh", "nope"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "gpu-session: unknown step 'nope' (expected tests, bench, table2, depth or call)"


@pytest.mark.slow
def test_gpu_session_bench_step_times_presets_and_depth_apart_and_bundles_its_files(tmp_path):
    """ci/gpu-session.sh's bench step, here on CPU: each preset's call times that preset alone
    (no depth entries riding along), "depth" is a call of the depth entries alone, and BUNDLE packs
    every file of the step into one archive under $OUT."""
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    out = tmp_path / "gpu-out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PRESETS": "tiny depth",
           "DEPTHS": "2", "COMPILE": "off", "REPS": "1", "BUNDLE": "bench"}
    proc = subprocess.run(["bash", "ci/gpu-session.sh", "bench", "540", "--device", "cpu", "--warmup", "1",
                           "--steps", "1", "--windows", "1", "--no-decode", "--peak-gflops", "50",
                           "--work", str(tmp_path / "work")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=660)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [f.name for f in out.iterdir()] == ["bench.tgz"]
    with tarfile.open(out / "bench.tgz") as tar:
        names = {Path(n).name for n in tar.getnames()}
        reports = {p: json.load(tar.extractfile(f"./bench-{p}.json")) for p in ("tiny", "depth")}
    assert {"machine-bench.txt", "bench.log", "bench-tiny.json", "bench-depth.json"} <= names
    assert [(e["name"], e["group"]) for e in reports["tiny"]["entries"]] == [("tiny", "preset")]
    assert [(e["name"], e["group"]) for e in reports["depth"]["entries"]] == [("depth-2", "depth"),
                                                                             ("depth-2-ckpt", "depth")]


@pytest.mark.slow
def test_one_pool_trains_several_suites_and_reports_after_each_cell(tmp_path):
    import yaml
    from omegaconf import OmegaConf

    from runner.run.build import check_config
    from runner.tables.records import Records

    cells = suite.plan("reproduce_table2_real", SHRINK)
    first, second = cells[:2], cells[2:3]
    a, b = Records.load(tmp_path / "a"), Records.load(tmp_path / "b")
    jobs = [Job(c, tmp_path / "work-a", a, "a") for c in first] + \
        [Job(c, tmp_path / "work-b", b, "b") for c in second]
    done = []
    outcome = run_jobs(jobs, parallel=2, on_cell_done=done.append, compose=compose)
    assert (outcome.crashed, outcome.trained, outcome.not_started, outcome.stopped) == (0, 3, 0, 0)
    assert sorted(done) == ["a", "a", "b"]  # each suite's report follows each of its cells
    assert len(Records.load(tmp_path / "a").by_key) == 2 and len(Records.load(tmp_path / "b").by_key) == 1
    assert all(c.record is not None and c.record["status"] in ("ok", "stalled") for c in first + second)
    run_dir = tmp_path / "work-b" / second[0].name
    assert (run_dir / "result.json").is_file()
    # each cell ran as `python -m runner.run` on the config `deepinit train` composes, in a folder
    # that reads like a Hydra run's (its overrides, its resolved config, train.log)
    # two cells at once share the cores: each gets its share of threads (cell_threads)
    # two cells at once share the cores (cell_threads; one each under `make test`'s OMP_NUM_THREADS=1)
    overrides = [*second[0].overrides, f"trainer.threads={cell_threads('cpu', 2)}", "trainer.progress=false"]
    assert yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) == overrides
    assert all(c.record["machine"]["threads"] == cell_threads("cpu", 2) for c in first + second)
    resolved = compose(overrides)
    check_config(resolved)
    assert (run_dir / ".hydra" / "config.yaml").read_text() == OmegaConf.to_yaml(OmegaConf.structured(resolved))
    assert "valid at update" in (run_dir / "train.log").read_text()


def test_all_real_suites_are_in_the_pool_order():
    from runner.tables.targets import REAL_SUITE_ORDER, TARGETS

    real = [name for name, t in TARGETS.items() if "real" in t.parts]
    assert sorted(REAL_SUITE_ORDER) == sorted(real) and len(set(REAL_SUITE_ORDER)) == len(real)


@pytest.mark.slow
def test_sigterm_to_the_driver_stops_its_cells_and_marks_them_interrupted(tmp_path):
    """`kill PID` of `deepinit reproduce` (SIGTERM to the driver alone, not its process group)
    leaves no cell training on orphaned: each running cell gets SIGTERM, writes interrupted.json
    and ends; the driver exits 143."""
    import signal
    import subprocess
    import sys
    import time

    from hydra_plugins.deepinit_launcher.processes import alive, descendants

    env = {**os.environ, "DEEPINIT_RESULTS": str(tmp_path / "results"), "OMP_NUM_THREADS": "1"}
    one_cell = [a for a in SHRINK if not a.startswith(("method=", "warmup.updates=", "trainer.seed=",
                                                         "trainer.max_updates="))]
    cmd = [sys.executable, "-m", "runner.cli", "reproduce", "table2", "--scale", "real", "--parallel",
           "1", "--out", str(tmp_path / "out"), *one_cell, "method=pre_ln", "warmup.updates=0",
           "trainer.seed=1", "trainer.max_updates=100000", "trainer.threads=1"]
    driver = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and driver.poll() is None:
            if list((tmp_path / "out").rglob("checkpoint_last.pt")):
                break
            time.sleep(0.2)
        assert driver.poll() is None, "the suite ended before it could be stopped"
        cell_processes = descendants(driver.pid)
        assert cell_processes
        driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 143, out[-3000:]
    assert not [p for p in cell_processes if alive(p)], "a cell outlived the suite's driver"
    (run_dir,) = [p.parent for p in (tmp_path / "out").rglob("checkpoint_last.pt")]
    marker = json.loads((run_dir / "interrupted.json").read_text())
    assert marker["status"] == "interrupted" and marker["reason"] == "SIGTERM"
    assert not (run_dir / "result.json").exists()


def test_a_deadline_starts_no_cell_that_would_end_after_it_and_stops_the_running_ones(tmp_path):
    """A cell expected to outlast the time left is not started (no run folder); a cell still
    running at the deadline is stopped as Ctrl-C stops it (interrupted, not failed)."""
    import time

    from runner.tables.pool import Deadline
    from runner.tables.records import Records

    cells = suite.plan("reproduce_table2_real", SHRINK)[:2]
    records = Records.load(tmp_path / "records")
    jobs = [Job(c, tmp_path / "work", records) for c in cells]
    late = run_jobs(jobs, parallel=1, compose=compose, deadline=Deadline(time.monotonic() + 600, cell_s=3600))
    assert (late.not_started, late.trained, late.stopped, late.crashed) == (2, 0, 0, 0)
    assert not (tmp_path / "work").exists() and not records.by_key
    # per-cell times: an expensive cell ahead in the queue does not hold back a cheaper one that fits
    costed = Deadline(time.monotonic() + 600, cell_s=1.0, per_cell={cells[0].name: 3600.0})
    mixed = run_jobs(jobs, parallel=1, compose=compose, deadline=costed)
    assert (mixed.not_started, mixed.trained, mixed.crashed) == (1, 1, 0)
    assert list(records.by_key) == [cell_key(cells[1].key)]
    records = Records.load(tmp_path / "records2")
    # no estimate: the first cell starts and is stopped at the deadline, the second never starts
    jobs = [Job(c, tmp_path / "work", records) for c in suite.plan("reproduce_table2_real", [
        *SHRINK, "trainer.max_updates=100000"])[:2]]
    run_dir = tmp_path / "work" / jobs[0].cell.name

    class OnceTraining(Deadline):
        """A deadline that falls once the first cell has logged an update: the same point of the
        run on any machine, however slow its start-up (a cell stopped before its signal handler
        is installed would end without interrupted.json)."""

        def left(self) -> float:
            metrics = run_dir / "metrics.jsonl"
            return -1.0 if metrics.is_file() and metrics.stat().st_size else 3600.0

    cut = run_jobs(jobs, parallel=1, compose=compose, deadline=OnceTraining(time.monotonic() + 3600))
    assert (cut.stopped, cut.not_started, cut.trained, cut.crashed) == (1, 1, 0, 0)
    assert (run_dir / "interrupted.json").is_file() and not (run_dir / "result.json").exists()
    assert not records.by_key


def test_start_unfinished_fills_the_free_slots_with_the_cheapest_cells_and_stops_them_at_the_deadline(tmp_path):
    """With start_unfinished, a pool whose cells all outlast the time left gives its free slots to
    the cheapest cells instead of starting none; at the deadline it stops them with a checkpoint
    (interrupted.json names it, and the next call's estimate reads it: updates_left), and it
    starts nothing once less than UNFINISHED_MIN_LEFT_S are left."""
    import time

    from runner.tables.pool import UNFINISHED_MIN_LEFT_S, Deadline
    from runner.tables.real_tier import updates_left
    from runner.tables.records import Records

    cells = suite.plan("reproduce_table2_real", [*SHRINK, "trainer.max_updates=100000"])[:3]
    records = Records.load(tmp_path / "records")
    jobs = [Job(c, tmp_path / "work", records) for c in cells]
    started = [tmp_path / "work" / c.name for c in cells[1:]]

    class OnceTraining(Deadline):
        """Falls once both started cells have logged an update (as in the test above)."""

        def left(self) -> float:
            logged = all((d / "metrics.jsonl").is_file() and (d / "metrics.jsonl").stat().st_size
                         for d in started)
            return -1.0 if logged else 3600.0

    # none fits in the hour left; the queue holds the dearest first
    costs = {cells[0].name: 9000.0, cells[1].name: 5400.0, cells[2].name: 7200.0}
    out = run_jobs(jobs, parallel=2, compose=compose,
                   deadline=OnceTraining(time.monotonic() + 3600, 5400.0, costs, start_unfinished=True))
    assert (out.stopped, out.not_started, out.trained, out.crashed) == (2, 1, 0, 0)
    for run_dir in started:
        marker = json.loads((run_dir / "interrupted.json").read_text())
        assert marker["checkpoint"] is True and 0 < marker["resume_update"] < 100000
        assert 0 < 1 - updates_left(run_dir, 100000) < 0.01
    assert not (tmp_path / "work" / cells[0].name).exists()  # the dearest cell: never started
    # too little time left for a start: none, even with the flag
    short = Deadline(time.monotonic() + UNFINISHED_MIN_LEFT_S - 10, 5400.0, costs, start_unfinished=True)
    assert run_jobs(jobs[:1], parallel=1, compose=compose, deadline=short).not_started == 1


def test_parallel_auto_probes_1_and_2_at_once_and_takes_the_faster(tmp_path, monkeypatch):
    """`--parallel auto` at the real tier: the probe trains the first cell (10 updates here) alone and as
    2 copies at once (2 cores here), in a folder beside the suite's, and the pool takes the count
    of most cells per hour. `--bundle` packs the report and a summary (the probe, the deadline,
    the time per cell it assumed: the preset's minutes, and the cell it did not start) into one file; a
    deadline that is not positive, or a count that is not one, is one line and status 2."""
    import tarfile

    from runner.cli.reproduce import main as reproduce_main
    from runner.tables import real_tier

    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(real_tier, "PROBE_UPDATES", 10)  # enough to time a tiny step
    monkeypatch.setattr(real_tier, "PROBE_BUDGET_SHARE", 1.0)  # both rounds, however loaded the machine
    bundle = tmp_path / "table2.tgz"
    # a deadline of 60 s: after the probe, no cell of the preset's 32 min fits, so none trains here
    # (the pool trains with the chosen count in the other tests; the summary says which it chose)
    code = reproduce_main(["table2", "--scale", "real", "--parallel", "auto", "--out", str(tmp_path / "out"),
                           "--deadline", "60", "--bundle", str(bundle), *SHRINK[:-3], "method=pre_ln",
                           "warmup.updates=15", "trainer.seed=1"])  # a warmup longer than the probe's run
    assert code == 0
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        summary = json.load(tar.extractfile("summary.json"))
    assert "results/report.md" in names and "summary.json" in names
    assert not any(n.endswith(".pt") for n in names)  # no checkpoints
    # the probe's copies' logs come back too (a failed probe says why there)
    for n in (1, 2):
        assert sum(name.startswith(f"logs/probe/x{n}/copy") and name.endswith(".out") for name in names) == n
        assert sum(name.startswith(f"logs/probe/x{n}/copy") and name.endswith("/train.log") for name in names) == n
    assert summary["deadline_s"] == 60
    assert (summary["not_started"], summary["stopped"], summary["trained"]) == (1, 0, 0)
    rounds = summary["probe"]
    assert [r["parallel"] for r in rounds] == [1, 2]
    assert all(r["seconds_per_update"] > 0 and r["cells_per_hour"] > 0 for r in rounds)
    best = max(rounds, key=lambda r: (r["cells_per_hour"], -r["parallel"]))
    assert summary["parallel"] == best["parallel"]
    # no record yet: the time per cell is the probe's at the chosen count, not the preset's 32 min
    measured = 3600 * best["parallel"] / best["cells_per_hour"] + real_tier.PROBE_UNTIMED_S
    assert summary["expected_cell_s"] == pytest.approx(measured) and measured < 32 * 60
    probe_dir = tmp_path / "out" / "table2-real-probe"
    assert len(list(probe_dir.glob("x2/copy*/*/result.json"))) == 2  # two copies, two folders
    # a probe whose budget (a share of the time to the deadline) runs out stops its round and ends
    monkeypatch.setattr(real_tier, "PROBE_BUDGET_SHARE", 0.001)
    assert reproduce_main(["table2", "--scale", "real", "--parallel", "auto", "--out", str(tmp_path / "out2"),
                           "--deadline", "60", "--bundle", str(bundle), *SHRINK[:-3], "method=pre_ln",
                           "warmup.updates=15", "trainer.seed=1"]) == 0
    with tarfile.open(bundle) as tar:
        cut = json.load(tar.extractfile("summary.json"))
    assert cut["probe"] == [] and cut["parallel"] == 1 and cut["not_started"] == 1
    assert reproduce_main(["table2", "--scale", "real", "--deadline", "0"]) == 2
    assert reproduce_main(["table2", "--scale", "real", "--start-unfinished"]) == 2  # needs --deadline
    assert reproduce_main(["all", "--deadline", "60", "--start-unfinished"]) == 2  # one target's suite
    assert reproduce_main(["table2", "--scale", "cpu", "--deadline", "60", "--start-unfinished"]) == 2
    assert reproduce_main(["table2", "--scale", "cpu", "--deadline", "60"]) == 2  # the sweep tiers have none
    assert reproduce_main(["all", "--parallel", "auto"]) == 2  # the probe is one suite's
    with pytest.raises(SystemExit) as exit_:  # argparse: one line, status 2
        reproduce_main(["table2", "--scale", "real", "--parallel", "none"])
    assert exit_.value.code == 2


def test_the_probe_reads_the_steady_rate_from_the_second_half_of_its_updates():
    """A GPU's first updates run many times slower than the rest: the probe's seconds per update
    come from the training log's cumulative wall times over the second half of its updates, not
    from the run's mean; with fewer than two log records there, the mean."""
    from runner.tables.pool import steady_seconds_per_update

    # 200 updates: the first 100 at 0.45 s each (45 s), then 0.05 s each; logged every 20
    walls = {step: (0.45 * step if step <= 100 else 45 + 0.05 * (step - 100)) for step in range(20, 201, 20)}
    metrics = [{"split": "train", "step": k, "wall_s": w} for k, w in walls.items()]
    metrics.append({"split": "valid", "step": 200, "wall_s": 99.0})  # not a training record
    record = {"updates": 200, "seconds_per_update": 50.0 / 200}
    assert steady_seconds_per_update(record, metrics) == pytest.approx(0.05)
    assert steady_seconds_per_update(record, metrics[:5]) == 0.25  # nothing after update 100: the mean
    assert steady_seconds_per_update(record, metrics[:6]) == 0.25  # one record after it: the mean


def _table2_gpu_cells():
    """table2's GPU cells (method-major: 18+18 before 6+6 within a method) and their layers (both
    stacks: model_layers of the composed config, checked on one cell of each depth; the rest read
    from the arm, as composing all 28 costs seconds)."""
    from runner.tables.real_tier import model_layers

    cells = suite.plan("reproduce_table2_gpu")
    for depth in ("6", "18"):
        cell = next(c for c in cells if c.arm["model.layers"] == depth)
        assert model_layers(compose(cell.overrides)) == 2 * int(depth)
    return cells, lambda c: 2 * int(c.arm["model.layers"])


def _probe_run(n: int, spu: float, start: float = 24.0, updates: int = 6000):
    from runner.tables.pool import ProbeRun

    return ProbeRun(n, spu, start, n * 3600 / (start + updates * spu))


def test_each_cell_expects_its_own_time_from_records_and_probe_scaled_by_its_layers():
    """A cell's expected time: the median record's wall time times the probe's slowdown, or
    without a record the probe's projection for its cell, each scaled by the cell's layers over
    its own cell's; the preset's minutes (neither) stay one figure for every cell."""
    from runner.tables.pool import Deadline
    from runner.tables.real_tier import PROBE_UNTIMED_S, CellCosts, median_timed

    cells, layers = _table2_gpu_cells()
    shallow = [c for c in cells if layers(c) == 12]
    deep = [c for c in cells if layers(c) == 36]
    assert len(shallow) == len(deep) == 14 and cells[0] in deep
    preset = Deadline(at=1e9, cell_s=300.0)
    assert CellCosts(preset, median_timed(cells), cells, [], None, layers).deadline(1) is preset  # neither: one figure

    rounds = [_probe_run(1, 0.010), _probe_run(4, 0.025)]
    projected_4 = 24 + 6000 * 0.025 + PROBE_UNTIMED_S  # 234 s for a 6+6 cell at 4 at once
    by_probe = CellCosts(preset, median_timed(cells), cells, rounds, shallow[0], layers)
    assert by_probe.seconds(shallow[1], 4) == pytest.approx(projected_4)
    assert by_probe.seconds(deep[0], 4) == pytest.approx(3 * projected_4)
    assert by_probe.seconds(shallow[1], 1) == pytest.approx(24 + 60 + PROBE_UNTIMED_S)

    # a 6+6 record of 265 s (alone): at 4 at once 2.5x slower, 662.5 s, more than the projection
    shallow[0].record = {"status": "ok", "wall_s": 265.0}
    try:
        todo = [c for c in cells if c.record is None]
        both = CellCosts(Deadline(at=1e9, cell_s=265.0), median_timed(cells), todo, rounds, shallow[1], layers)
        assert both.seconds(shallow[1], 4) == pytest.approx(265 * 2.5)
        assert both.seconds(deep[0], 4) == pytest.approx(3 * 265 * 2.5)
        # without a record, the probe of a deep cell (projection for 36 layers) is brought to
        # each cell's layers
        deep_probe = CellCosts(Deadline(at=1e9), median_timed(todo), todo, [_probe_run(1, 0.030)], deep[0], layers)
        deep_projected = 24 + 6000 * 0.030 + PROBE_UNTIMED_S
        assert deep_probe.seconds(deep[1], 1) == pytest.approx(deep_projected)
        assert deep_probe.seconds(shallow[1], 1) == pytest.approx(deep_projected / 3)
        costed = both.deadline(4)
        assert len(costed.per_cell) == 27 and costed.cell_s == pytest.approx(265 * 2.5)
        records_only = CellCosts(Deadline(at=1e9, cell_s=265.0), median_timed(cells), todo, [], None, layers)
        assert records_only.seconds(deep[0], 1) == pytest.approx(3 * 265)
        # a record wins over a probe that projects more (one read while the GPU warmed up: 85 ms
        # per update, 594 s for the 6+6 cell the record timed at 265 s)
        warming = CellCosts(Deadline(at=1e9, cell_s=265.0), median_timed(cells), todo, [_probe_run(1, 0.085)], shallow[1], layers)
        assert warming.seconds(shallow[1], 1) == pytest.approx(265)
        assert warming.seconds(deep[0], 1) == pytest.approx(3 * 265)
        # a record whose pool ran 4 at once (2.5x slower there) is brought back to alone first
        shallow[0].record["pool_slots"] = 4
        assert both.seconds(shallow[1], 4) == pytest.approx(265)
        assert both.seconds(shallow[1], 1) == pytest.approx(265 / 2.5)
        assert warming.seconds(shallow[1], 1) == pytest.approx(265)  # 4 at once not probed: as alone
    finally:
        shallow[0].record = None


def test_under_a_deadline_each_cell_expects_its_own_arms_records_not_one_time_scaled_by_layers():
    """Width's 6+6 cells differ about 6x in cost by their width alone, which their layers cannot
    say: under a deadline a cell expects the median record of its own arm (or model shape), the
    time the plan prints, so a 64-wide cell that fits in the time left starts where a 256-wide
    one does not; a cell without records of its arm, shape or width falls back to the median
    record of the suite scaled by layers."""
    import time

    from runner.tables.plan import RECORD_UNTIMED_S, RealSuite
    from runner.tables.pool import Deadline
    from runner.tables.real_tier import CellCosts, median_timed, record_estimates
    from runner.tables.targets import TARGETS

    target = TARGETS["width"]
    part = target.parts["real"][0]
    cells = suite.plan(part.preset)

    def cell(seed: int, **arm: str):
        return next(c for c in cells if c.seed == seed and all(c.arm.get(k) == v for k, v in arm.items()))

    def layers(c) -> int:
        return 2 * int(c.arm["model.layers"])

    narrow = {"method": "pre_ln", "model.dim": "64", "optim.lr": "0.001", "model.layers": "6"}
    wide = {**narrow, "model.dim": "256"}
    for c, wall in ((cell(1, **narrow), 1000.0), (cell(1, **wide), 6000.0)):
        c.record = {"status": "ok", "wall_s": wall, "machine": {"device": "cpu"}}
    try:
        real = RealSuite(target, part, cells, None, 0.0)
        todo = real.todo
        estimates = real.estimates("cpu")
        recorded = record_estimates(todo, estimates)
        reference = median_timed(cells, "cpu")  # the upper of two: the 256-wide record
        assert reference is cell(1, **wide)
        deadline = Deadline(at=1e9, cell_s=6000.0 + RECORD_UNTIMED_S)
        costs = CellCosts(deadline, reference, todo, [], None, layers, recorded=recorded)
        assert costs.seconds(cell(2, **narrow), 1) == pytest.approx(1000.0 + RECORD_UNTIMED_S)
        assert costs.seconds(cell(2, **wide), 1) == pytest.approx(6000.0 + RECORD_UNTIMED_S)
        # no record of its arm, shape or width (128 wide, 6+6 and 12+12): the suite's median
        # record, scaled by layers
        mid = {**narrow, "model.dim": "128"}
        assert cell(2, **mid).name not in recorded
        assert costs.seconds(cell(2, **mid), 1) == pytest.approx(6000.0 + RECORD_UNTIMED_S)
        assert costs.seconds(cell(1, **{**mid, "model.layers": "12"}), 1) == pytest.approx(
            2 * (6000.0 + RECORD_UNTIMED_S))
        # a record of the 128-wide shape (at the other lr): the shape's time at 6+6, and scaled
        # by layers at 12+12 (the same width at another depth), as the plan estimates them
        cell(1, **{**mid, "optim.lr": "0.0005"}).record = {"status": "ok", "wall_s": 3000.0,
                                                            "machine": {"device": "cpu"}}
        todo = real.todo
        by_shape = CellCosts(deadline, median_timed(cells, "cpu"), todo, [], None, layers,
                             recorded=record_estimates(todo, real.estimates("cpu")))
        assert by_shape.seconds(cell(2, **mid), 1) == pytest.approx(3000.0 + RECORD_UNTIMED_S)
        assert by_shape.seconds(cell(1, **{**mid, "model.layers": "12"}), 1) == pytest.approx(
            2 * (3000.0 + RECORD_UNTIMED_S))
        # 30 min left: the narrow cell fits, the wide one does not
        soon = CellCosts(Deadline(time.monotonic() + 1800, 6000.0 + RECORD_UNTIMED_S), reference, todo, [],
                         None, layers, recorded=recorded).deadline(1)
        assert soon.fits(cell(2, **narrow).name) and not soon.fits(cell(2, **wide).name)
    finally:
        for c in cells:
            c.record = None


def test_a_cell_that_resumes_expects_the_share_of_its_updates_left(tmp_path):
    """A cell stopped with a checkpoint (interrupted.json: checkpoint, resume_update) resumes
    there: under a deadline it expects the share of its updates left of its time past
    RECORD_UNTIMED_S (start-up and the final decoding are paid again), so a long cell that an
    earlier call on the same machine brought most of the way fits where the whole cell would not."""
    from runner.tables.pool import Deadline
    from runner.tables.real_tier import RECORD_UNTIMED_S, CellCosts, median_timed, updates_left

    run = tmp_path / "cell"
    run.mkdir()
    assert updates_left(run, 2000) == 1.0  # fresh
    (run / "interrupted.json").write_text(json.dumps({"checkpoint": True, "resume_update": 500}))
    assert updates_left(run, 2000) == 1.0  # the checkpoint the marker names is gone
    (run / "checkpoint_last.pt").write_bytes(b"")
    assert updates_left(run, 2000) == 0.75
    (run / "interrupted.json").write_text(json.dumps({"checkpoint": False, "resume_update": 0}))
    assert updates_left(run, 2000) == 1.0  # stopped before any checkpoint: from the start
    (run / "interrupted.json").write_text("{")
    assert updates_left(run, 2000) == 1.0

    cells, layers = _table2_gpu_cells()
    shallow = [c for c in cells if layers(c) == 12]
    deep = [c for c in cells if layers(c) == 36]
    shallow[0].record = {"status": "ok", "wall_s": 265.0}
    try:
        todo = [c for c in cells if c.record is None]
        left = {deep[0].name: 0.1}
        costs = CellCosts(Deadline(at=1e9, cell_s=265.0), median_timed(cells), todo, [], None, layers,
                          lambda c: left.get(c.name, 1.0))
        assert costs.seconds(deep[1], 1) == pytest.approx(3 * 265)
        assert costs.seconds(deep[0], 1) == pytest.approx(RECORD_UNTIMED_S + (3 * 265 - RECORD_UNTIMED_S) * 0.1)
        # cheaper now than a fresh 6+6 cell: the pool takes it first
        per_cell = costs.deadline(1).per_cell
        assert min(per_cell, key=per_cell.get) == deep[0].name
    finally:
        shallow[0].record = None


def test_the_time_per_cell_comes_from_whole_records_plus_what_wall_s_leaves_out():
    """median_timed reads only records of cells that ran their whole budget (a diverged cell's
    short wall time is no cell's time), and the deadline adds what a record's wall_s does not
    time (start-up, data, the final decoding)."""
    from runner.tables.plan import Request
    from runner.tables.real_tier import RECORD_UNTIMED_S, cell_deadline, median_timed

    cells, _ = _table2_gpu_cells()
    first, second, third = cells[:3]
    try:
        first.record = {"status": "ok", "wall_s": 265.0}
        second.record = {"status": "diverged", "wall_s": 12.0}
        third.record = {"status": "ok", "wall_s": 300.0}
        assert median_timed(cells) is third  # the upper of two whole records; not the diverged one
        third.record = None
        assert median_timed(cells) is first
        request = Request("table2", deadline_s=500.0)
        assert cell_deadline(request, first, 5.0, start=0.0).cell_s == pytest.approx(265.0 + RECORD_UNTIMED_S)
        assert cell_deadline(request, None, 5.0, start=0.0).cell_s == pytest.approx(300.0)  # the preset's
        second.record, first.record = None, None
        assert median_timed(cells) is None
        # a suite trained on a GPU is timed by its GPU records only, and on a CPU by its CPU ones
        first.record = {"status": "ok", "wall_s": 4000.0, "machine": {"device": "cpu"}}
        second.record = {"status": "ok", "wall_s": 120.0, "machine": {"device": "cuda:1"}}
        assert median_timed(cells, "cuda") is second and median_timed(cells, "cpu") is first
        assert median_timed(cells) is first  # any device
        second.record = None
        assert median_timed(cells, "cuda") is None
        # a stalled cell ran its whole budget; one the early-stopping rule ended did not
        first.record = {"status": "stalled", "wall_s": 265.0}
        second.record = {"status": "ok", "wall_s": 90.0, "stopped_early": True}
        assert median_timed(cells) is first
    finally:
        for cell in (first, second, third):
            cell.record = None


def test_the_probe_runs_only_where_a_cell_still_fits_after_it():
    """A probe spends a third of the time left: where a cell (its records' time alone) would no
    longer fit after that, it is skipped; without a deadline or records it runs."""
    import time

    from runner.tables.pool import Deadline
    from runner.tables.real_tier import probe_leaves_time

    assert not probe_leaves_time(Deadline(time.monotonic() + 400), 295.0)  # 267 s left after it
    assert probe_leaves_time(Deadline(time.monotonic() + 530), 295.0)  # 353 s left after it
    assert probe_leaves_time(Deadline(time.monotonic() + 10), None)  # no records: only a probe can tell
    assert probe_leaves_time(None, 295.0)


@pytest.mark.slow
def test_a_probe_that_would_leave_no_cell_time_is_skipped(tmp_path, monkeypatch, capsys):
    """With a record, a short deadline: the probe's third would leave less than the record's
    time, so `--parallel auto` trains at the count the record was timed at, with no probe."""
    from runner.cli.reproduce import main as reproduce_main

    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path / "results"))
    base = ["table2", "--scale", "real", "--out", str(tmp_path / "out"), *SHRINK[:-3], "method=pre_ln",
            "warmup.updates=5"]
    assert reproduce_main([*base, "--parallel", "1", "trainer.seed=1"]) == 0  # one record, timed alone
    capsys.readouterr()
    # a cell trained alone gets every core (at most OMP_NUM_THREADS: one under `make test`)
    record = json.loads((tmp_path / "out" / "table2-real" / "records.jsonl").read_text().splitlines()[0])
    assert record["machine"]["threads"] == cell_threads("cpu", 1) and record["pool_slots"] == 1
    # 35 s: a third for the probe leaves 23 s, less than the record's wall time plus 30 s (and
    # seed 2, expected to take as long, is not started either)
    assert reproduce_main([*base, "--parallel", "auto", "--deadline", "35", "trainer.seed=1,2"]) == 0
    out = capsys.readouterr().out
    assert "probe: skipped" in out and "1 at a time, as the records were timed" in out
    assert not (tmp_path / "out" / "table2-real-probe").exists()


@pytest.mark.slow
def test_cells_share_the_cores_and_a_users_thread_count_reaches_them_as_given(tmp_path, monkeypatch):
    """cell_threads: on a CPU, the cores shared among the cells at once (all of them for a cell
    alone, at least one each); on a GPU one per cell. A user's trainer.threads (an override of
    how a cell runs, passed to every cell) reaches the cell as given: the pool adds none of its
    own, so the cell of a pool of one trains with the user's count."""
    import yaml

    from runner.tables.records import Records

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [cell_threads("cpu", n, cores=16) for n in (1, 2, 3, 4, 16, 32)] == [16, 8, 5, 4, 1, 1]
    assert cell_threads("cuda", 1, cores=16) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the environment's count bounds a cell's
    assert [cell_threads("cpu", n, cores=16) for n in (1, 4, 8, 16)] == [3, 3, 2, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cell = suite.plan("reproduce_table2_real", [*SHRINK[:-3], "method=pre_ln", "warmup.updates=0",
                                               "trainer.seed=1", "trainer.threads=1"])[0]
    records = Records.load(tmp_path / "records")
    outcome = run_jobs([Job(cell, tmp_path / "work", records)], parallel=1, compose=compose)
    assert outcome.trained == 1
    overrides = yaml.safe_load((tmp_path / "work" / cell.name / ".hydra" / "overrides.yaml").read_text())
    assert [o for o in overrides if o.startswith("trainer.threads=")] == ["trainer.threads=1"]
    assert cell.record["machine"]["threads"] == 1


def test_records_time_the_counts_at_once_they_ran_at(monkeypatch):
    """record_rounds: the whole-budget GPU records of the median record's model shape and compile
    setting, by the count their pool ran at once (an H200: 0.041 s/update alone, 0.058-0.063 with
    4 at once); other shapes, compiled runs and CPU records stay out. A count the records did not
    time is bounded from above: that of the next count above it, and past the largest, no more
    cells per hour than there."""
    from runner.tables.pool import Deadline
    from runner.tables.real_tier import RECORD_UNTIMED_S, CellCosts, median_timed, record_rounds

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # a pool of one would give a cell all 16 cores
    cells, layers = _table2_gpu_cells()
    shallow = [c for c in cells if layers(c) == 12]
    deep = [c for c in cells if layers(c) == 36]

    def gpu(wall, spu, slots=None, **machine):
        return {"status": "ok", "wall_s": wall, "seconds_per_update": spu, "updates": 6000,
                "pool_slots": slots, "machine": {"device": "cuda", **machine}}

    timed = [(shallow[0], gpu(265.0, 0.041)), (shallow[1], gpu(375.0, 0.059, 4)), (shallow[2], gpu(374.0, 0.058, 4)),
             (shallow[3], gpu(404.0, 0.063, 4)), (shallow[4], gpu(376.0, 0.059, 4)),
             (shallow[5], gpu(100.0, 0.010, 4, compile=True)), (deep[0], gpu(900.0, 0.140, 4)),
             (shallow[6], {**gpu(9000.0, 1.4), "machine": {"device": "cpu", "threads": 16}}),
             # timed alone with one thread of 16 cores: not what a pool of one runs (cell_threads)
             (shallow[9], {**gpu(20000.0, 3.1), "machine": {"device": "cpu", "threads": 1}})]
    try:
        for cell, record in timed:
            cell.record = record
        reference = median_timed(cells, "cuda")
        assert reference is shallow[1] and reference.record["pool_slots"] == 4
        rounds = record_rounds(cells, reference, "cuda")
        assert sorted(rounds) == [1, 4]
        assert rounds[1].seconds_per_update == pytest.approx(0.041)
        assert rounds[4].seconds_per_update == pytest.approx(0.059)  # the median of four
        assert rounds[4].cells_per_hour == pytest.approx(4 * 3600 / 375.5)
        on_cpu = record_rounds(cells, reference, "cpu", most=16)  # the CPU record that ran as a pool runs
        assert list(on_cpu) == [1] and on_cpu[1].seconds_per_update == pytest.approx(1.4)
        assert record_rounds(cells, None, "cuda") == {}
        todo = [c for c in cells if c.record is None]
        cell_s = reference.record["wall_s"] + RECORD_UNTIMED_S
        costs = CellCosts(Deadline(at=1e9, cell_s=cell_s), reference, todo, list(rounds.values()), None, layers)
        slow = 0.059 / 0.041
        assert costs.seconds(shallow[7], 4) == pytest.approx(cell_s)
        assert costs.seconds(shallow[7], 1) == pytest.approx(cell_s / slow)
        assert costs.seconds(shallow[7], 2) == pytest.approx(cell_s)  # bounded by 4 at once
        assert costs.seconds(shallow[7], 8) == pytest.approx(2 * cell_s)  # no more cells per hour than at 4
        assert costs.seconds(deep[1], 4) == pytest.approx(3 * cell_s)
        # the reference's own count missing from the rounds: its time stands at that count, is
        # at most that alone, and at least the measured slowdown at a count above
        reference.record["pool_slots"] = 2
        costs = CellCosts(Deadline(at=1e9, cell_s=cell_s), reference, todo, list(rounds.values()), None, layers)
        assert costs.seconds(shallow[7], 2) == pytest.approx(cell_s)
        assert costs.seconds(shallow[7], 1) == pytest.approx(cell_s)
        assert costs.seconds(shallow[7], 4) == pytest.approx(cell_s * slow)
        reference.record["pool_slots"] = 4
        # timed alone only: on a CPU, cells at once split its cores (at most that many times
        # slower each); elsewhere nothing says they slow each other
        only_alone = [r for n, r in rounds.items() if n == 1]
        on_cpu_costs = CellCosts(Deadline(at=1e9, cell_s=cell_s), reference, todo, only_alone, None, layers,
                                 device="cpu")
        assert on_cpu_costs.seconds(shallow[7], 2) == pytest.approx(2 * on_cpu_costs.seconds(shallow[7], 1))
        elsewhere = CellCosts(Deadline(at=1e9, cell_s=cell_s), reference, todo, only_alone, None, layers)
        assert elsewhere.seconds(shallow[7], 2) == pytest.approx(elsewhere.seconds(shallow[7], 1))
        # counts past the machine's cores, other GPUs and other compile settings stay out
        shallow[8].record = gpu(900.0, 0.2, 16)
        assert 16 in record_rounds(cells, reference, "cuda") and 16 not in record_rounds(cells, reference, "cuda", most=8)
        shallow[8].record = gpu(300.0, 0.030, 1, device_name="NVIDIA H100")
        assert record_rounds(cells, reference, "cuda")[1].seconds_per_update == pytest.approx(0.041)
        assert record_rounds(cells, reference, "cuda", (True, "layers")) == {}  # the reference ran eagerly
    finally:
        for cell, _ in timed:
            cell.record = None
        shallow[8].record = None


def test_a_record_names_the_most_cells_that_ran_while_it_ran(monkeypatch, tmp_path):
    """pool_slots is measured, not the pool's size: a pool's last cell, or a pool of more slots
    than cells, shares the machine with fewer."""
    from runner.tables import pool

    class Process:
        def poll(self):
            return None

    monkeypatch.setattr(pool, "write_config", lambda *a, **k: None)
    monkeypatch.setattr(pool.subprocess, "Popen", lambda *a, **k: Process())
    cells = suite.plan("reproduce_table2_gpu")[:4]
    jobs = [pool.Job(c, tmp_path, None) for c in cells]
    running = pool._Pool(jobs, 4, None, compose=compose)
    running._start(jobs[0])
    running._start(jobs[1])
    running.running.pop(0)  # the first cell ends
    running._start(jobs[2])
    running._start(jobs[3])
    assert [running.peak[c.name] for c in cells] == [2, 3, 3, 3]


def test_a_cell_gets_its_share_of_the_cores_in_its_config_and_environment(monkeypatch, tmp_path):
    """The thread count a pool gives a cell (cell_threads) is in the cell's config and in the
    environment of its process, for the libraries that read OMP_NUM_THREADS / MKL_NUM_THREADS: the
    usable cores over the cells that can run at once (a pool of fewer jobs than slots shares them
    among its jobs); one for a cell on a GPU, trainer.device=auto included where one is visible."""
    from runner.tables import pool

    class Process:
        def poll(self):
            return None

    started = []
    monkeypatch.setattr(pool, "write_config", lambda run_dir, cfg, overrides: started.append([cfg, overrides]))
    monkeypatch.setattr(pool.subprocess, "Popen", lambda *a, **k: started[-1].append(k["env"]) or Process())
    monkeypatch.setattr(pool, "usable_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cells = suite.plan("reproduce_table2_real")[:3]

    def threads_of(parallel, cell, *extra):
        job = pool.Job(dataclasses.replace(cell, overrides=[*cell.overrides, *extra]), tmp_path, None)
        pool._Pool([job] * 8, parallel, None, compose=compose)._start(job)
        cfg, overrides, env = started[-1]
        assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == (str(cfg.trainer.threads),) * 2
        assert overrides.count(f"trainer.threads={cfg.trainer.threads}") == 1
        return cfg.trainer.threads

    assert [threads_of(n, cells[0]) for n in (1, 2, 3, 8)] == [8, 4, 2, 1]
    job = pool.Job(cells[0], tmp_path, None)
    pool._Pool([job], 4, None, compose=compose)._start(job)  # one job in 4 slots: alone
    assert started[-1][0].trainer.threads == 8
    monkeypatch.setattr(pool, "gpu_visible", lambda: True)
    assert threads_of(1, cells[1], "trainer.device=auto") == 1
    assert threads_of(1, cells[1], "trainer.device=cuda") == 1
    monkeypatch.setattr(pool, "gpu_visible", lambda: False)
    assert threads_of(1, cells[2], "trainer.device=auto") == 8


@pytest.mark.slow
def test_parallel_auto_takes_the_counts_the_records_timed_without_a_probe(tmp_path, monkeypatch, capsys):
    """Records from pools of 1 and of 2 cells at once: `--parallel auto` chooses between those
    counts from the records and runs no probe (the shrunk cells are a variant: records beside the
    run folders)."""
    from runner.cli.reproduce import main as reproduce_main

    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path / "results"))
    base = ["table2", "--scale", "real", "--out", str(tmp_path / "out"), *SHRINK[:-3], "method=pre_ln",
            "warmup.updates=5"]
    assert reproduce_main([*base, "--parallel", "1", "trainer.seed=1"]) == 0
    assert reproduce_main([*base, "--parallel", "2", "trainer.seed=2,3"]) == 0
    capsys.readouterr()
    assert reproduce_main([*base, "--parallel", "auto", "--deadline", "600", "trainer.seed=1,2,3,4"]) == 0
    out = capsys.readouterr().out
    assert "probe: skipped: the records time 1 at once" in out and "; 2 at once" in out
    assert not (tmp_path / "out" / "table2-real-probe").exists()
    records = [json.loads(line) for line in (tmp_path / "out" / "table2-real" / "records.jsonl").read_text().splitlines()]
    assert sorted(r["seed"] for r in records) == [1, 2, 3, 4]

def test_a_cell_trains_on_the_device_its_config_names():
    """cells_device: trainer.device=cuda on a real-tier suite (a CPU tier trained on a lent GPU)
    is a GPU's cell, trainer.device=cpu on the gpu tier (its CPU rehearsal) a CPU's; the real
    presets pin fp32, so on a GPU they train in the CPU's precision, not bf16."""
    from runner.run.hardware import gpu_visible
    from runner.tables.pool import cells_device

    real = suite.plan("reproduce_width_real")[0]
    assert cells_device(compose(real.overrides)) == "cpu"
    on_gpu = compose([*real.overrides, "trainer.device=cuda"])
    assert cells_device(on_gpu) == "cuda" and on_gpu.trainer.precision == "fp32"
    assert cells_device(compose([*suite.plan("reproduce_table2_gpu")[0].overrides, "trainer.device=cpu"])) == "cpu"
    auto = compose([*real.overrides, "trainer.device=auto"])
    assert cells_device(auto) == ("cuda" if gpu_visible() else "cpu")
    for preset in ("reproduce_table2_real", "reproduce_lm_real", "reproduce_table2_converged_real"):
        assert compose(suite.plan(preset)[0].overrides).trainer.precision == "fp32", preset


def test_with_a_deadline_the_count_at_once_is_the_one_that_finishes_the_most_cells():
    """The most cells per hour is not the most cells by a deadline. 8 at once (0.055 s/update:
    414 s a 6+6 cell) finish none in 400 s; 4 at once (264 s) finish 4; 1 alone (124 s) finishes 3,
    cheapest first in waves. A tie goes to the more cells per hour; where nothing finishes, or the
    deadline has passed, the probe's own choice stays."""
    import time

    from runner.tables.pool import Deadline
    from runner.tables.real_tier import CellCosts, median_timed

    cells, layers = _table2_gpu_cells()
    shallow = [c for c in cells if layers(c) == 12]
    rounds = [_probe_run(1, 0.0067), _probe_run(4, 0.030), _probe_run(8, 0.055)]
    assert max(rounds, key=lambda r: r.cells_per_hour).parallel == 8

    def choose(left: float, todo) -> int:
        return CellCosts(Deadline(time.monotonic() + left), median_timed(cells), todo, rounds, shallow[0], layers).parallel_for_deadline(8)

    assert choose(400, cells) == 4
    assert choose(400, shallow[:2]) == 4  # 2 cells either way: the more per hour
    assert choose(6000, cells) == 8  # every cell fits at 8 and at 4: the more per hour
    assert choose(60, cells) == 8  # nothing fits anywhere
    assert choose(-5, cells) == 8  # the probe ended past the deadline
    # deep cells expect 3x: in 400 s at 1 at once, 3 shallow cells (124 s each) and no deep one
    costs = CellCosts(Deadline(time.monotonic() + 400), median_timed(cells), cells, rounds, shallow[0], layers)
    assert costs.finished(1, 400) == 3 and costs.finished(4, 400) == 4 and costs.finished(8, 400) == 0


def test_under_a_deadline_the_cheapest_cells_run_first(monkeypatch):
    """With per-cell times the pool runs the cheapest cells first (seed-major among equals), so a
    session cut short ends with the most records; with one figure for every cell, the plan's order."""
    from runner.tables import pool
    from runner.tables.pool import Deadline, run_cells
    from runner.tables.real_tier import CellCosts, median_timed

    cells, layers = _table2_gpu_cells()
    shallow = next(c for c in cells if layers(c) == 12)
    costed = CellCosts(Deadline(at=1e9, cell_s=300.0), median_timed(cells), cells, [_probe_run(1, 0.01)], shallow, layers).deadline(1)
    order = []
    monkeypatch.setattr(pool, "run_jobs", lambda jobs, *a, **k: order.extend(j.cell for j in jobs))
    run_cells(cells, Path("unused"), None, 1, compose=compose, deadline=costed)
    assert [layers(c) for c in order] == [12] * 14 + [36] * 14
    assert [c.seed for c in order[:14]] == [1] * 7 + [2] * 7  # seed-major among the shallow cells
    order.clear()
    run_cells(cells, Path("unused"), None, 1, compose=compose, deadline=Deadline(at=1e9, cell_s=300.0))
    assert layers(order[0]) == 36  # one figure for every cell: the plan's order


def test_the_call_step_takes_a_real_tier_suite_and_refuses_another_scale(tmp_path):
    """SCALE=real: the call step plans a CPU tier's suite on the GPU (here --dry-run: it trains
    nothing) with the same pool, deadline and bundle; a scale other than gpu or real is one line
    and status 2."""
    import subprocess
    import tarfile

    out = tmp_path / "gpu-out"
    env = {**_gpu_session_env(tmp_path, out), "BUNDLE": "call", "TARGET": "width", "SCALE": "real",
           "TESTS_LIMIT": "0"}
    proc = subprocess.run(["bash", "ci/gpu-session.sh", "call", "120", "--dry-run", "trainer.device=cuda"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(out / "call.tgz") as tar:
        log = tar.extractfile("./width.log").read().decode()
    # the suite's own 36 cells (the device is not part of a cell), timed on a GPU by GPU records
    assert "reproduce-width (real data)" in log and "36 cells" in log and "a variant" not in log
    assert "on a GPU, its records or the probe time the cells" in log
    env["SCALE"] = "paper"
    bad = subprocess.run(["bash", "ci/gpu-session.sh", "call", "60"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == "gpu-session: SCALE must be gpu or real, got 'paper'"


@pytest.mark.slow
def test_the_prepared_gpu_call_rehearsed_on_cpu_returns_one_bundle(tmp_path):
    """ci/gpu-session.sh call, rehearsed on CPU with the device forced to CPU and tiny sizes: the
    CUDA tests (skipped here), then the GPU tier's pool with a deadline inside the call's limit;
    with BUNDLE=call everything comes back as one file holding the suite's own bundle."""
    import subprocess
    import tarfile

    out = tmp_path / "gpu-out"
    # the probe (the step's default, --parallel auto) has a test of its own
    env = {**_gpu_session_env(tmp_path, out), "BUNDLE": "call", "TARGET": "tfixup-depth", "PARALLEL": "1"}
    proc = subprocess.run(["bash", "ci/gpu-session.sh", "call", "480", *GPU_SESSION_CPU_ARGS], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [p.name for p in out.iterdir()] == ["call.tgz"]  # one file comes back
    with tarfile.open(out / "call.tgz") as tar:
        names = tar.getnames()
        log = tar.extractfile("./tfixup-depth.log").read().decode()
        tests_log = tar.extractfile("./cuda-tests.log").read().decode()
        inner = tarfile.open(fileobj=tar.extractfile("./tfixup-depth-gpu.tgz"))
        summary = json.load(inner.extractfile("summary.json"))
        assert not any(n.startswith("logs/probe") for n in inner.getnames())  # PARALLEL=1: no probe
        # the records also outside the suite's own bundle (one the limit cut short is not packed);
        # the test's overrides make a variant, whose records stay beside its run folders
        copied = tar.extractfile("./tfixup-depth-gpu-variant/records.jsonl").read().decode().splitlines()
    assert len(copied) == 1 and json.loads(copied[0])["wall_s"] > 0  # the one cell trained
    assert "./cuda-tests.xml" in names and "skipped" in tests_log  # no GPU here
    assert "(real data, GPU)" in log and "deadline" not in log.split("estimated wall time")[1]  # it fit
    assert summary["tier"] == "gpu" and summary["trained"] == 1 and summary["parallel"] == 1
    assert 300 < summary["deadline_s"] < 480 and summary["expected_cell_s"] == 5 * 60  # the preset's


def test_time_left_in_a_pool_log_is_the_cells_estimates_not_the_pace_of_a_resumed_cell(tmp_path):
    """A resumed cell ends minutes after the pool starts it, so the pace since the start would put
    50 cells of an hour at an hour; the log's time left comes from the cells' estimates (a running
    one: what is left of its estimate), else from the wall_s of the cells recorded so far, with the
    queue given in order to the slot that frees first, as the pool does."""
    import time

    from runner.tables import pool
    from runner.tables.records import Records

    cells = suite.plan("reproduce_width_real")[:5]
    records = Records.load(tmp_path)
    jobs = [pool.Job(c, tmp_path, records, expected_s=s) for c, s in zip(cells, (100.0, 200.0, 300.0, 120.0))]
    state = pool._Pool(jobs[:3], 2, None, compose=None)
    state.running.append((jobs[3], None, None))
    state.started[jobs[3].cell.name] = time.monotonic() - 50.0
    # the running cell holds a slot for ~70 more seconds; the queue in order: 100 to the free
    # slot, 200 after the running one (270), 300 after the 100 (400)
    assert state.left_s() == pytest.approx(400.0, abs=1.0)
    unknown = pool._Pool([pool.Job(c, tmp_path, records) for c in cells[:3]], 1, None, compose=None)
    assert unknown.left_s() is None  # no estimate and nothing recorded yet
    unknown.walls += [1000.0, 3000.0]
    assert unknown.left_s() == pytest.approx(3 * 2000.0)  # the recorded cells' mean wall time
    wide = pool._Pool([pool.Job(cells[0], tmp_path, records)], 4, None, compose=None)
    wide.walls.append(3600.0)
    assert wide.left_s() == pytest.approx(3600.0)  # one cell left takes a whole cell, however many slots
    assert pool._Pool([], 1, None, compose=None).left_s() == 0.0
