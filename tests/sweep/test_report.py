"""`deepinit report` on sweeps made by real Hydra multiruns of the presets, with a stand-in task
(tests/sweep_probe_app.py) that writes run folders from a known loss surface."""
import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runner.cli.report import main as main_report
from runner.sweep.report import axis_value, default_metric, expected_cells, isolation_rows, load_sweep

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "tests" / "sweep_probe_app.py"


def run_sweep(sweep_dir: Path, *overrides: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PROBE_MODE="fake_train")
    proc = subprocess.run([sys.executable, str(APP), "-m", f"hydra.sweep.dir={sweep_dir}",
                           "trainer.max_updates=40", *overrides],
                          cwd=sweep_dir.parent, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("beta2_lr") / "sweep"
    run_sweep(d, "+sweep=beta2_lr")
    return d


@pytest.fixture(scope="module")
def faceted(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("methods") / "sweep"
    run_sweep(d, "+sweep=beta2_lr", "method=post_ln,pre_ln", "optim.lr=1e-4,3e-4",
              "optim.beta2=0.99,0.999")
    return d


def test_multirun_yaml_expands_to_the_15_cells_hydra_ran(grid):
    cells = expected_cells(grid / "multirun.yaml")
    assert len(cells) == 15
    ran = [d for d in grid.iterdir() if (d / "result.json").exists()]
    assert len(ran) == 15


def test_beta2_lr_grid_report(grid, tmp_path):
    sweep = load_sweep(grid)
    assert sweep.name == "beta2_lr"
    counts = sweep.counts()
    assert (counts["total"], counts["ok"], counts["diverged"], counts["pending"]) == (15, 13, 2, 0)
    # the preset declares lr and beta2 nuisance; nothing scientific varies, so one isolation row
    assert sweep.nuisance == ["optim.lr", "optim.beta2"] and sweep.scientific == []
    (row,) = isolation_rows(sweep)
    assert row["best_nuisance"] == {"optim.lr": "0.0003", "optim.beta2": "0.99"}
    assert row["metric"] == pytest.approx(3.0 + 0.1 + 0.2 + 5.0 / 40)
    assert row["counts"]["diverged"] == 2

    out = tmp_path / "rep"
    assert main_report([str(grid), "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "report.csv")))
    assert len(rows) == 15
    diverged = {(r["optim.lr"], r["optim.beta2"]) for r in rows if r["status"] == "diverged"}
    assert diverged == {("0.0004", "0.999"), ("0.0005", "0.999")}
    # a diverged cell has no best loss even though its metrics.jsonl has early valid points
    assert all(r["best_valid_loss"] == "" for r in rows if r["status"] == "diverged")
    md = (out / "report.md").read_text()
    assert "15 cells: 15 done (13 ok, 2 diverged, 0 stalled, 0 failed), 0 running, 0 pending" in md
    assert (out / "heatmap.png").stat().st_size > 1000
    assert (out / "curves_all.png").stat().st_size > 1000


def test_cli_axes_override_changes_the_isolation(grid, tmp_path):
    sweep = load_sweep(grid, nuisance=["optim.lr"])
    assert sweep.scientific == ["optim.beta2"]
    best = {r["scientific"]["optim.beta2"]: r["best_nuisance"]["optim.lr"]
            for r in isolation_rows(sweep)}
    assert best == {"0.99": "0.0003", "0.995": "0.0003", "0.999": "0.0003"}
    by_bleu = isolation_rows(sweep, metric="bleu")  # higher is better
    assert all(r["best"].value("bleu") == max(c.value("bleu") or 0 for c in sweep.cells
                                               if axis_value(c, "optim.beta2") == beta2)
               for beta2, r in zip(["0.99", "0.995", "0.999"], by_bleu))
    # every finished cell of the stand-in has BLEU, so the report ranks by it by default
    assert default_metric(sweep) == "bleu"


def test_unfinished_sweep_counts_running_and_pending(grid, tmp_path):
    d = tmp_path / "partial"
    shutil.copytree(grid, d)
    cells = sorted(p for p in d.iterdir() if p.is_dir())
    for c in cells[:2]:  # interrupted mid-run: metrics and a checkpoint, no result
        (c / "result.json").unlink()
        (c / "checkpoint_last.pt").write_bytes(b"x")
    for c in cells[2:5]:  # never started
        shutil.rmtree(c)
    crashed = cells[5]
    res = json.loads((crashed / "result.json").read_text())
    res.update(status="failed", reason="RuntimeError: boom")
    (crashed / "result.json").write_text(json.dumps(res))

    sweep = load_sweep(d)
    n = sweep.counts()
    assert (n["total"], n["running"], n["pending"], n["failed"], n["done"]) == (15, 2, 3, 1, 10)
    running = [c for c in sweep.cells if c.status == "running"]
    # a running cell reports what metrics.jsonl shows so far
    assert all(c.value("best_valid_loss") is not None and c.updates == 40 for c in running)
    pending = [c for c in sweep.cells if c.status == "pending"]
    assert all(c.path is None and any(o.startswith("optim.lr=") for o in c.overrides)
               for c in pending)
    assert main_report([str(d), "--no-plots"]) == 0
    assert "1 failed), 2 running, 3 pending" in (d / "report.md").read_text()


def test_methods_are_the_scientific_axis_with_one_heatmap_each(faceted, tmp_path):
    sweep = load_sweep(faceted)
    assert sweep.counts()["total"] == 8
    # norm and init follow from the method, so they are not separate axes
    assert sweep.scientific == ["method"]
    rows = isolation_rows(sweep)
    assert [r["scientific"]["method"] for r in rows] == ["post_ln", "pre_ln"]
    norms = {c.choices["method"]: c.config["norm"]["placement"] for c in sweep.cells}
    assert norms == {"post_ln": "post", "pre_ln": "pre"}
    assert main_report([str(faceted), "--out", str(tmp_path)]) == 0
    heatmaps = sorted(p.name for p in tmp_path.glob("heatmap*.png"))
    assert heatmaps == ["heatmap_method=post_ln.png", "heatmap_method=pre_ln.png"]
    assert len(list(tmp_path.glob("curves_*.png"))) == 2


def test_missing_dir_is_a_one_line_error(tmp_path, capsys):
    assert main_report([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().out


@pytest.mark.parametrize("preset,cells", [("beta2_lr", 15), ("depth", 3), ("table2", 9),
                                          ("ultradeep", 5)])
def test_every_preset_cell_composes_and_validates(preset, cells):
    """Each cell of each preset is a valid config (e.g. no Admin without post-norm), and the
    preset's sweep block names axes the report can read."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from runner.cli.compose import register_schemas
    from runner.run.build import check_config

    register_schemas()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        base = compose(config_name="train", overrides=[f"+sweep={preset}"],
                       return_hydra_config=True)
        params = base.hydra.sweeper.params
        parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
        axes = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] for o in parsed]
        combos = list(itertools.product(*axes))
        assert len(combos) == cells
        # beta2_lr's cells differ only in two floats: its corners stand for the rest
        for combo in combos if len(combos) <= 9 else (combos[0], combos[-1]):
            cfg = compose(config_name="train", overrides=[f"+sweep={preset}", *combo])
            check_config(OmegaConf.to_object(cfg))
            assert cfg.sweep.name == preset
            assert set(cfg.sweep.scientific).isdisjoint(cfg.sweep.nuisance)
    if preset == "beta2_lr":  # Liu et al. 2020, Fig. 10 (Transformer-Clinic nmt-experiments/iwslt14_de-en.md)
        assert (cfg.optim.name, cfg.schedule.name, cfg.warmup.updates) == ("radam", "linear", 0)
        assert cfg.schedule.min_lr == 0.0
    if preset == "ultradeep":
        assert (cfg.init.name, cfg.norm.placement, cfg.model.dim, cfg.model.layers) == \
            ("tfixup", "none", 64, 200)


def test_task_lm_metrics_rank_lower_first_and_the_command_takes_them(tmp_path, capsys):
    from runner.sweep.report import METRICS, Cell

    for name in ("best_valid_bpc", "best_valid_bpt", "valid_ppl"):
        assert METRICS[name] is False  # lower is better
    cell = Cell(path=None, overrides=[], status="ok", result={"best_valid_bpc": 1.52, "valid_ppl": 3.1})
    assert cell.value("best_valid_bpc") == 1.52 and cell.value("best_valid_bpt") is None
    # the option is accepted (argparse would exit on an unknown choice); the folder is then missing
    assert main_report([str(tmp_path / "none"), "--metric", "best_valid_bpc"]) == 2
    assert capsys.readouterr().out.startswith("deepinit report:")
