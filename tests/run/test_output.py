"""What a run leaves and says: folder names that are flat and whole (runs and sweep cells alike),
an end summary whose run folder can be copied, the same status word as the sweep table, a pointer
to the BLEU the run did not compute, eval's progress on a pipe, a logger chosen for a finished
run, and the small words (progress bar, thread count, report titles)."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from runner.run.folder import NAME_LIMIT, folder_name
from tests.conftest import TINY, run_cli_here


# ----------------------------------------------------------------------------- folder names
def test_folder_names_are_flat_and_never_cut_an_override():
    assert folder_name(["data.dir=/tmp/corp/raw", "optim.lr=1e-4"], "default") == \
        "data.dir=_tmp_corp_raw,optim.lr=1e-4"
    # a sweep cell: the preset is the sweep folder's name already
    assert folder_name(["+sweep=beta2_lr", "optim.lr=1e-4"], "default", cell=True) == "optim.lr=1e-4"
    assert folder_name(["+sweep=beta2_lr", "optim.lr=1e-4"], "default") == "sweep=beta2_lr,optim.lr=1e-4"
    # how a run runs, not what it computes, names no folder: the same cell resumes in the same one
    # (runner/sweep/plan.py gives them the same key)
    for how in ("trainer.device=cuda", "trainer.compile=true", "trainer.compile_scope=layers", "trainer.threads=4"):
        assert folder_name(["optim.lr=1e-4", how], "default", cell=True) == "optim.lr=1e-4", how
    overrides = [f"trainer.save_interval={100 + i}" if i == 0 else f"model.key{i:02d}=value{i:03d}"
                 for i in range(10)] + ["data.dir=/a/very/long/path/" + "x" * 200]
    name = folder_name(overrides, "default")
    assert len(name) <= NAME_LIMIT and "/" not in name
    *items, tail = name.split(",")
    safe = {re.sub(r"[^A-Za-z0-9_.,=+\-@:\[\]]", "_", o) for o in overrides}
    assert all(item in safe for item in items), items  # whole overrides only
    assert "trainer.save_interval=100" in items and len(items) == 10  # the path is left out
    assert re.fullmatch(r"\+\d+_more-[0-9a-f]{12}", tail) and int(tail[1:].split("_")[0]) == len(overrides) - len(items)
    # another value of a left-out override: another folder
    assert folder_name(overrides[:-1] + [overrides[-1] + "y"], "default") != name


@pytest.mark.slow
def test_a_sweep_over_paths_makes_flat_cell_folders(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli_here(["-m", *TINY, "trainer.max_updates=10",
                         "data.cache_dir=cache/x/a,cache/x/b", f"hydra.sweep.dir={sweep}"],
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(cells) == 2, [p.name for p in sweep.rglob("result.json")]
    for cell in cells:
        assert (cell / "result.json").is_file()
        assert "/" not in cell.name and "data.cache_dir=cache_x_" in cell.name
    # a second call finds the same folders (finished: skipped)
    again = run_cli_here(["-m", *TINY, "trainer.max_updates=10",
                          "data.cache_dir=cache/x/a,cache/x/b", f"hydra.sweep.dir={sweep}"],
                         cwd=tmp_path)
    assert again.returncode == 0 and sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")) == cells


# ----------------------------------------------------------------------------- one run's output
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A short run that learns nothing (stalled), in a folder with a long path, printed at 80
    columns into a pipe."""
    root = tmp_path_factory.mktemp("out")
    run_dir = root / ("a-long-folder-name-" * 6) / "run"
    proc = run_cli_here(["train", *TINY, "optim=sgd", "optim.lr=1e-12", "warmup=none", "schedule=constant",
                         "trainer.threads=1", f"hydra.run.dir={run_dir}"], cwd=root, columns=80)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, proc


def test_the_summary_prints_the_whole_run_folder_and_the_status_sweeps_use(finished_run):
    run_dir, proc = finished_run
    out = proc.stdout
    assert f"run folder: {run_dir}\n" in out  # one line, whole, however narrow the console
    assert "…" not in out.split("deepinit run summary")[1]
    status = next(line for line in out.splitlines() if "│ status" in line)
    assert "stalled" in status and " ok " not in status
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["stalled"] is True  # result.json's fields stay
    from runner.sweep.cells import folder_status
    assert folder_status(run_dir)[0] == "stalled"  # the sweep table's word


def test_the_run_says_how_to_get_the_bleu_it_did_not_compute(finished_run):
    run_dir, proc = finished_run
    assert (f"BLEU: not computed (trainer.final_bleu=false); score the test split with: "
            f"deepinit eval {run_dir}") in proc.stdout


def test_the_overview_counts_threads_in_words(finished_run):
    _, proc = finished_run
    assert re.search(r"fp32, 1 thread\b", proc.stdout) and "1 threads" not in proc.stdout


def test_eval_on_a_pipe_shows_progress_and_says_what_it_averaged(finished_run):
    run_dir, _ = finished_run
    proc = run_cli_here(["eval", str(run_dir), "--no-result", "--max-len-b", "5", "--batch-size", "8"],
                        cwd=run_dir)
    assert proc.returncode == 0, proc.stderr
    progress = [line for line in proc.stderr.splitlines() if line.startswith("decode (beam 5): ")]
    assert len(progress) >= 5 and progress[-1].startswith("decode (beam 5): 50/50 done"), proc.stderr
    assert ("deepinit: warning: --average-last 10: " in proc.stderr
            and "only 1 numbered checkpoint, so it was scored alone" in proc.stderr)


def test_a_logger_chosen_for_a_finished_run_records_it(finished_run):
    run_dir, first = finished_run
    assert not (run_dir / "csv").exists()
    proc = run_cli_here(["train", *TINY, "optim=sgd", "optim.lr=1e-12", "warmup=none", "schedule=constant",
                         "trainer.threads=1", "logger=csv", f"hydra.run.dir={run_dir}"], cwd=run_dir)
    assert proc.returncode == 0, proc.stderr
    metrics = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert "not trained again" in proc.stdout and f"{len(metrics)} metrics records" in proc.stdout
    rows = (run_dir / "csv" / "train.csv").read_text().splitlines()
    assert len(rows) == 1 + sum('"split": "train"' in line for line in metrics)
    assert json.loads((run_dir / "result.json").read_text())["loggers"] == ["csv"]
    # once recorded, not again
    again = run_cli_here(["train", *TINY, "optim=sgd", "optim.lr=1e-12", "warmup=none", "schedule=constant",
                          "trainer.threads=1", "logger=csv", f"hydra.run.dir={run_dir}"], cwd=run_dir)
    assert "not trained again" not in again.stdout
    assert (run_dir / "csv" / "train.csv").read_text().splitlines() == rows


# ----------------------------------------------------------------------------- words
def test_the_progress_bar_shows_no_markup():
    from runner.console import _Field, progress_bar

    bar = progress_bar(True)
    task_id = bar.add_task("train", total=10, loss="2.345", lr="1e-3", tps="100")
    task = next(t for t in bar.tasks if t.id == task_id)
    texts = [column.render(task).plain for column in bar.columns if isinstance(column, _Field)]
    assert texts == ["loss 2.345", "lr 1e-3", "100 tok/s"]


def test_the_isolation_title_says_what_it_shows():
    from runner.sweep.report import isolation_title

    assert isolation_title(SimpleNamespace(nuisance=[]), "best_valid_loss") == \
        "lowest best valid loss per setting (the sweep has no nuisance axes)"
    assert isolation_title(SimpleNamespace(nuisance=["optim.lr", "optim.beta2"]), "bleu") == \
        "highest BLEU over optim.lr, optim.beta2"
