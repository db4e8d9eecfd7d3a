"""End-to-end behaviour of a run: folder contents, exact resume after SIGKILL, divergence,
sweeps that skip finished cells, and a short run of every norm, placement and scaling method."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from runner.run.train import train
from tests.conftest import DEEPINIT, TINY, compose, run_cli_here
from tests.method_helpers import one_thread  # noqa: F401 (a fixture)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_folder_contents(tiny_run):
    run_dir, proc = tiny_run  # conftest: deepinit train *TINY trainer.tensorboard=true, 2 checkpoints kept
    names = {p.name for p in run_dir.iterdir()}
    for expected in (".hydra", "train.log", "metrics.jsonl", "checkpoint_last.pt", "env.json",
                     "result.json", "init.json"):
        assert expected in names
    assert any(n.startswith("events.out.tfevents") for n in names)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["updates"] == 20
    for key in ("train_loss", "valid_loss", "wall_s", "tokens_per_s"):
        assert isinstance(result[key], float) and result[key] > 0
    # result.json is written last
    assert (run_dir / "result.json").stat().st_mtime >= max(
        (run_dir / n).stat().st_mtime for n in ("metrics.jsonl", "checkpoint_last.pt", "env.json"))
    env = json.loads((run_dir / "env.json").read_text())
    assert env["torch"] and env["device"] == "cpu" and "git_commit" in env
    for line in read_metrics(run_dir):
        assert {"step", "loss", "lr"} <= set(line)
    assert "summary" in proc.stdout  # the end-of-run summary table


def test_default_run_name_comes_from_overrides(tmp_path):
    proc = run_cli_here(["train", *TINY, "trainer.max_updates=10"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(runs) == 1 and "trainer.max_updates=10" in runs[0].name and "model=ci" in runs[0].name
    again = run_cli_here(["train", *TINY, "trainer.max_updates=10"], cwd=tmp_path)
    assert again.returncode == 0 and "already finished" in again.stdout + again.stderr


def test_resume_after_sigkill_is_exact(tmp_path):
    # 120 updates: ~12 epochs of the 2,000 pairs; the kill comes after update 40 (a checkpoint and
    # 4 log lines), so the resumed run crosses epochs, saves and validations
    args = [*TINY, "trainer.max_updates=120", "trainer.save_interval=20", "trainer.valid_interval=60",
            "trainer.log_interval=10", "data.toy.train_size=2000", "model.dropout=0.1"]
    reference = tmp_path / "reference"
    proc = run_cli_here(["train", *args, f"hydra.run.dir={reference}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    killed = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([str(DEEPINIT), "train", *args, f"hydra.run.dir={killed}"], cwd=tmp_path,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        metrics = killed / "metrics.jsonl"
        if (killed / "checkpoint_last.pt").exists() and metrics.exists() and \
                len(metrics.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not (killed / "result.json").exists(), "the run finished before it could be killed"

    proc = run_cli_here(["train", *args, f"hydra.run.dir={killed}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in (killed / "train.log").read_text()
    a = json.loads((reference / "result.json").read_text())
    b = json.loads((killed / "result.json").read_text())
    assert b["resumed"] is True
    for key in ("status", "updates", "train_loss", "valid_loss", "best_valid_loss", "train_tokens"):
        assert a[key] == b[key], key
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "wall_s")} for r in rows]  # noqa: E731
    assert strip(read_metrics(reference)) == strip(read_metrics(killed))


def tiny_cfg(extra):
    return compose([*TINY, *extra])


def test_divergence_on_nan(tmp_path):
    cfg = tiny_cfg(["optim=sgd", "optim.lr=1e6", "optim.momentum=0.9", "warmup=none",
                    "schedule=constant", "trainer.max_updates=100", "trainer.divergence.check_interval=5"])
    result = train(cfg, tmp_path)
    assert result["status"] == "diverged"
    assert "non-finite" in result["reason"]
    assert result["diverged_step"] < 100 and result["diverged_step"] % 5 == 0
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "diverged"


def test_divergence_on_bound(tmp_path):
    cfg = tiny_cfg(["trainer.divergence.loss_bound=0.5", "trainer.divergence.patience=7",
                    "trainer.divergence.check_interval=1", "trainer.max_updates=50"])
    result = train(cfg, tmp_path)
    assert result["status"] == "diverged"
    assert result["diverged_step"] == 7  # the loss never drops below 0.5 in 7 updates
    assert "above 0.5" in result["reason"]


def test_multirun_sweep_skips_finished_cells(tmp_path):
    args = ["-m", "optim.lr=1e-4,5e-4", "norm=post,pre", *TINY, "trainer.max_updates=10"]
    proc = run_cli_here(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweeps = list((tmp_path / "outputs" / "multirun").iterdir())
    assert len(sweeps) == 1
    cells = [p for p in sweeps[0].iterdir() if (p / "result.json").exists()]
    assert len(cells) == 4
    assert sum("norm=post" in c.name for c in cells) == sum("norm=pre" in c.name for c in cells) == 2
    stamps = {c: (c / "result.json").stat().st_mtime for c in cells}
    (cells[0] / "result.json").unlink()  # an unfinished cell: resumed from its checkpoint
    proc = run_cli_here(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (cells[0] / "result.json").exists()
    for cell in cells[1:]:
        assert (cell / "result.json").stat().st_mtime == stamps[cell]  # skipped, untouched


def test_a_run_that_learns_nothing_is_stalled_not_diverged(tmp_path):
    """The unigram plateau (deep Post-LN without warmup): status ok, but labelled stalled."""
    import collections
    import math

    from runner.data import build_data

    cfg = tiny_cfg(["optim=sgd", "optim.lr=1e-12", "warmup=none", "schedule=constant",
                    "trainer.max_updates=20", "trainer.valid_interval=10"])
    result = train(cfg, tmp_path)
    assert result["status"] == "ok" and result["stalled"] is True
    # the plateau, recomputed here: add-one unigram of the training targets, scored on valid
    data = build_data(cfg.data)
    train_split, valid = data.splits[cfg.data.train_split], data.splits[cfg.data.valid_split]
    counts = collections.Counter(train_split.tgt_tokens.tolist())
    vocab = len(data.tgt_dict)
    total = len(train_split.tgt_tokens) + vocab
    want = -sum(math.log((counts[t] + 1) / total) for t in valid.tgt_tokens.tolist()) / len(valid.tgt_tokens)
    assert result["valid_unigram_nll"] == pytest.approx(want, rel=1e-9)
    assert result["best_valid_nll"] > want - cfg.trainer.divergence.stall_margin


def test_a_run_that_learns_is_not_stalled(tmp_path):
    result = train(tiny_cfg(["trainer.max_updates=200", "trainer.valid_interval=100", "optim.lr=3e-3",
                             "trainer.save_interval=100", "data.toy.train_size=2000"]), tmp_path)
    assert result["status"] == "ok" and result["stalled"] is False
    assert result["best_valid_nll"] < result["valid_unigram_nll"] - 0.1


def test_sweep_cell_with_a_rejected_config_is_failed_and_the_sweep_goes_on(tmp_path):
    from runner.sweep.report import read_cell

    sweep = tmp_path / "sweep"
    proc = run_cli_here(["-m", "init=admin", "norm=pre,post", *TINY, "trainer.max_updates=10",
                    f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # a sweep with a failed cell exits 1, after every cell ran
    assert "Traceback" not in proc.stderr
    bad, good = (next(p for p in sweep.iterdir() if f"norm={n}" in p.name) for n in ("pre", "post"))
    result = json.loads((bad / "result.json").read_text())
    assert result["status"] == "failed" and result["reason"].startswith("config: ")
    assert "norm=post" in result["reason"]  # the fix is named
    assert read_cell(bad).status == "failed"  # not "running" or "pending" in reports
    assert json.loads((good / "result.json").read_text())["status"] == "ok"


def test_unpadded_training_follows_the_padded_run(tmp_path):
    """trainer.unpad (on by default on CPU) changes the cost, not the training: without dropout
    (whose masks depend on the tensor shapes) the loss curve is that of the padded model."""
    no_dropout = ["model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0"]
    curves = {}
    for unpad in ("null", "false"):
        cfg = tiny_cfg([*no_dropout, f"trainer.unpad={unpad}", "trainer.max_updates=6",
                        "trainer.log_interval=1"])
        train(cfg, tmp_path / unpad)
        curves[unpad] = [r["loss"] for r in read_metrics(tmp_path / unpad) if r["split"] == "train"]
        assert json.loads((tmp_path / unpad / "env.json").read_text())["unpad"] is (unpad == "null")
    assert len(curves["null"]) == 6 and curves["null"][-1] < curves["null"][0]
    assert curves["null"] == pytest.approx(curves["false"], rel=1e-4)


# One short run per method on the toy task, through runner.run.train.train: (updates, overrides).
METHODS = {
    # norm placements (runner/model/sublayer.py; tests/model/test_sublayer.py)
    "mix": (20, ["norm=mix", "norm.mix_ratio=0.5", "model.layers=4"]),
    "peri": (20, ["norm=peri", "optim=radam", "warmup=none"]),
    "layernorm_scaling": (20, ["norm=pre", "norm.layernorm_scaling=true", "model.layers=3"]),
    # norms (runner/model/norms.py; tests/model/test_norms.py)
    "b2t": (20, ["norm=b2t", "optim=radam", "warmup=none", "model.encoder_layers=3"]),
    "resi_dual": (20, ["norm=resi_dual", "norm.resi_dual_scale=0.05", "optim=sgd", "optim.lr=0.05",
                       "optim.momentum=0.9", "schedule=constant", "model.activation_checkpointing=true"]),
    "dyt": (20, ["norm=pre", "norm.kind=dyt", "optim=adam", "warmup.updates=10"]),
    "scalenorm_fixnorm": (20, ["norm=pre", "norm.kind=scalenorm", "model.fixnorm=true", "trainer.update_freq=2"]),
    # QK-norm, sigma-reparam (tests/model/test_attention_qk_norm.py, test_linear.py),
    # LayerScale and Depth-muP/CompleteP (tests/init/test_layerscale_depth_mup.py)
    "qk_l2": (10, ["model.qk_norm=l2"]),
    "qk_ln_radam_nowarmup": (10, ["model.qk_norm=layernorm", "norm=pre", "optim=radam", "warmup.updates=0"]),
    "sigma_one_admin": (10, ["model.sigma_reparam=true", "model.sigma_reparam_gamma_init=one", "init=admin"]),
    "layerscale": (10, ["init=layerscale", "norm=pre", "model.qk_norm=rmsnorm"]),
    "completep": (10, ["init=depth_mup", "norm=pre", "init.depth_mup_base_layers=1", "init.depth_mup_exponent=1.0"]),
    "depth_mup_sgd_sigma": (10, ["init=depth_mup", "norm=pre", "init.depth_mup_base_layers=4", "optim=sgd",
                                 "optim.lr=0.05", "model.sigma_reparam=true"]),
}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_trains(method, tmp_path):
    """A short run ends ok, after the updates asked for, with finite losses."""
    updates, overrides = METHODS[method]
    result = train(compose([*TINY, "trainer.progress=false", f"trainer.max_updates={updates}", *overrides]),
                   tmp_path)
    assert result["status"] == "ok" and result["updates"] == updates
    assert math.isfinite(result["train_loss"]) and math.isfinite(result["valid_loss"])
