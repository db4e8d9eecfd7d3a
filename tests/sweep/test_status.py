"""A sweep's cell statuses (runner/sweep/cells.py, status.py), `deepinit sweep status`, the exit
rule of `deepinit -m`, and stopping a local launcher's worker processes, on hand-made sweep
folders and small real process trees (no training, no SLURM)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hydra_plugins.deepinit_launcher.processes import alive, descendants, stop_tree
from runner.cli.sweep import main as sweep_main
from runner.run import attempt
from runner.sweep import cells
from runner.sweep.report import load_sweep, read_cell
from runner.sweep.status import exit_code, render, sweep_states


def make_cell(root: Path, overrides: list, result: dict = None, marker: bool = False,
              error: str = None, steps: int = 0) -> Path:
    d = root / ",".join(overrides)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if steps:
        (d / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "loss": 5.0, "split": "train"}) + "\n" for s in range(1, steps + 1)))
    if result is not None:
        (d / "result.json").write_text(json.dumps(result))
    if marker:
        attempt.mark_interrupted(d, "SIGTERM")
    if error is not None:
        attempt.record_failure(d, error, f"Traceback (most recent call last):\n  {error}")
    return d


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Six cells (lr x seed) of a sweep: each status once, one cell never started."""
    root = tmp_path / "sweep"
    root.mkdir()
    (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {
        "overrides": {"task": ["model=ci", "optim.lr=0.0001,0.0005,0.001", "trainer.seed=1,2"]},
        "sweeper": {"params": None}}}))
    make_cell(root, ["model=ci", "optim.lr=0.0001", "trainer.seed=1"], {"status": "ok", "updates": 20})
    make_cell(root, ["model=ci", "optim.lr=0.0001", "trainer.seed=2"],
              {"status": "diverged", "updates": 7, "reason": "loss is nan"})
    make_cell(root, ["model=ci", "optim.lr=0.0005", "trainer.seed=1"], error="ValueError: boom")
    make_cell(root, ["model=ci", "optim.lr=0.0005", "trainer.seed=2"], marker=True, steps=12)
    make_cell(root, ["model=ci", "optim.lr=0.001", "trainer.seed=1"], steps=3)  # running
    return root


def by_cell(states):
    return {(o[1], o[2]): s for s in states for o in [s.overrides]}


def test_statuses_from_folders(sweep):
    states = by_cell(sweep_states(sweep, job_states=lambda jobs: {}))
    got = {k: s.status for k, s in states.items()}
    assert got == {("optim.lr=0.0001", "trainer.seed=1"): "ok",
                   ("optim.lr=0.0001", "trainer.seed=2"): "diverged",
                   ("optim.lr=0.0005", "trainer.seed=1"): "failed",
                   ("optim.lr=0.0005", "trainer.seed=2"): "interrupted",
                   ("optim.lr=0.001", "trainer.seed=1"): "running",
                   ("optim.lr=0.001", "trainer.seed=2"): "pending"}
    failed = states[("optim.lr=0.0005", "trainer.seed=1")]
    assert failed.reason == "ValueError: boom"
    assert "Traceback" in failed.error_file.read_text()
    interrupted = states[("optim.lr=0.0005", "trainer.seed=2")]
    assert interrupted.updates == 12 and interrupted.reason == "SIGTERM"


def test_job_states_override_a_stale_folder(sweep):
    """A resubmitted failed cell is queued; a running job's cell is running; a cancelled job
    that never wrote a result is interrupted; a finished folder wins over any job state."""
    cells.log_jobs(sweep, [
        {"overrides": ["model=ci", "optim.lr=0.0005", "trainer.seed=1"], "launcher": "slurm", "job_id": "7_2"},
        {"overrides": ["model=ci", "optim.lr=0.001", "trainer.seed=2"], "launcher": "slurm", "job_id": "7_5"},
        {"overrides": ["model=ci", "optim.lr=0.001", "trainer.seed=1"], "launcher": "slurm", "job_id": "7_4"},
        {"overrides": ["model=ci", "optim.lr=0.0001", "trainer.seed=1"], "launcher": "slurm", "job_id": "7_0"},
    ])
    fake = {"7_2": "PENDING", "7_5": "RUNNING", "7_4": "CANCELLED", "7_0": "FAILED"}
    states = by_cell(sweep_states(sweep, job_states=lambda jobs: {
        str(j["job_id"]): fake[str(j["job_id"])] for j in jobs}))
    assert states[("optim.lr=0.0005", "trainer.seed=1")].status == "queued"
    assert states[("optim.lr=0.001", "trainer.seed=2")].status == "running"
    assert states[("optim.lr=0.001", "trainer.seed=1")].status == "interrupted"
    assert states[("optim.lr=0.0001", "trainer.seed=1")].status == "ok"
    assert states[("optim.lr=0.0005", "trainer.seed=1")].job_id == "7_2"


def test_cell_status_rules():
    assert cells.cell_status(None) == ("pending", "", None)
    assert cells.cell_status(None, {"job_id": "1_0"}, "PENDING")[0] == "queued"
    assert cells.cell_status(None, {"job_id": "1_0"}, "OUT_OF_MEMORY")[:2] == ("failed", "job 1_0 OUT_OF_MEMORY")
    assert cells.cell_status(None, {"job_id": "1_0"}, "COMPLETED")[0] == "failed"  # no folder at all
    assert cells.cell_status(None, {"job_id": "42"}, "GONE")[0] == "pending"  # a local job that never started


def test_exit_rule():
    def st(*statuses):
        return [type("S", (), {"status": s, "expected": True})() for s in statuses]
    assert exit_code(st("ok", "diverged", "stalled")) == 0  # divergence is a result
    assert exit_code(st("ok", "failed")) == 1  # partial failure
    assert exit_code(st("failed", "failed")) == 1
    assert exit_code(st("ok", "interrupted")) == 1
    assert exit_code(st("ok", "pending")) == 1  # a launcher that waited left a cell behind
    assert exit_code(st("ok", "queued", "running"), waited=False) == 0  # submitted and left
    assert exit_code(st("queued", "failed"), waited=False) == 1


def test_sweep_status_cli(sweep, capsys):
    assert sweep_main(["status", str(sweep), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["status"] for r in rows) == sorted(
        ["ok", "diverged", "failed", "interrupted", "running", "pending"])
    failed = next(r for r in rows if r["status"] == "failed")
    assert failed["error_file"].endswith("/error.txt")
    os.environ["COLUMNS"] = "200"
    try:
        assert sweep_main(["status", str(sweep)]) == 0
    finally:
        del os.environ["COLUMNS"]
    out = capsys.readouterr().out
    assert "6 cells: 1 ok, 1 diverged, 1 failed, 1 interrupted, 1 running, 1 pending" in out
    assert "optim.lr" in out and "trainer.seed" in out  # the varying axes are the columns
    assert "error.txt" in out
    assert sweep_main(["status", str(sweep / "nope")]) == 2


def test_report_knows_interrupted_cells_and_tolerates_missing_ones(sweep, tmp_path):
    from runner.cli.report import main as report_main

    assert read_cell(sweep / "model=ci,optim.lr=0.0005,trainer.seed=2").status == "interrupted"
    n = load_sweep(sweep).counts()
    assert (n["interrupted"], n["running"], n["pending"], n["failed"], n["done"]) == (1, 1, 1, 1, 3)
    assert report_main([str(sweep), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "1 failed), 1 interrupted, 1 running, 1 pending" in md


def test_a_new_attempt_forgets_how_the_last_one_ended(sweep):
    failed = sweep / "model=ci,optim.lr=0.0005,trainer.seed=1"
    stopped = sweep / "model=ci,optim.lr=0.0005,trainer.seed=2"
    done = sweep / "model=ci,optim.lr=0.0001,trainer.seed=1"
    for d in (failed, stopped, done):
        attempt.begin_attempt(d)
    assert cells.folder_status(failed)[0] == "running" and not (failed / "error.txt").exists()
    assert cells.folder_status(stopped)[0] == "running"
    assert cells.folder_status(done)[0] == "ok"
    # a finished cell is never marked failed or interrupted afterwards
    assert not attempt.record_failure(done, "late") and not attempt.mark_interrupted(done, "late")


def test_render_survives_brackets_in_values(sweep, capsys):
    make_cell(sweep, ["model=ci", "optim.lr=[1]", "trainer.seed=9"], error="bad [bold]value[/]")
    render(sweep_states(sweep, job_states=lambda jobs: {}), sweep)
    assert "[1]" in capsys.readouterr().out


STUBBORN = """
import signal, subprocess, sys, time
# SIGINT's disposition is set explicitly here and in the children, so the test does not depend on
# the one pytest inherited (a background job of a script starts with SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
# a child that ignores SIGINT (stands in for a wedged worker), and one that does not
kids = [subprocess.Popen([sys.executable, "-c", "import signal, time; " + handler +
                          "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
        for handler in ("signal.signal(signal.SIGINT, signal.SIG_IGN); ",
                        "signal.signal(signal.SIGINT, signal.default_int_handler); ")]
for k in kids:
    k.stdout.readline()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
def test_stop_tree_ends_every_process_below_it():
    parent = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        tree = descendants(parent.pid) | {parent.pid}
        assert len(tree) == 3
        t0 = time.time()
        killed = stop_tree(parent.pid, [parent], grace_s=3.0)  # ample for a Python exit under load
        parent.wait(timeout=10)
        assert time.time() - t0 < 15
        assert len(killed) == 1  # only the child that ignored SIGINT needed SIGKILL
        assert not any(alive(p) for p in tree)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
