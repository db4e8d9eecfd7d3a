"""`deepinit analyze` end to end: a finished run folder's checkpoints, files written, user
errors exit 2."""
from __future__ import annotations

import json

import pytest
import torch

from runner.cli.analyze import main as main_analyze
from tests.conftest import TINY, run_cli_here
from tests.method_helpers import one_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")  # every test on one torch thread


def test_dependency_on_a_run_folder(tiny_run, tmp_path):
    run_dir, _ = tiny_run  # conftest: deepinit train *TINY trainer.keep_checkpoints=2 (TensorBoard on)
    out = tmp_path / "dep"
    proc = run_cli_here(["analyze", "dependency", str(run_dir), "--out", str(out), "--threads", "1",
                         "--sentences", "8"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "dependency.json").read_text())
    (entry,) = result["settings"]
    assert [s["stage"] for s in entry["stages"]] == ["init", "update 10", "update 20"]
    assert (out / "dependency.png").stat().st_size > 1000
    assert "layer dependency" in proc.stdout
    betas = [s["encoder"]["beta"] for s in entry["stages"]]
    assert betas[0] != betas[2]  # training moved the dependencies


def test_an_override_beside_a_run_folder_is_refused_in_one_line(tiny_run, tmp_path, capsys):
    """A run folder keeps the config it trained with: `RUN_DIR model.layers=4` would measure
    another model than the run's, so the override is refused, not dropped."""
    run_dir, _ = tiny_run
    assert main_analyze(["grad-norms", str(run_dir), "model.layers=4", "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("deepinit: error: 'model.layers=4'") and str(run_dir) in err
    assert "Traceback" not in err and not (tmp_path / "g").exists()


def test_output_change_command(tmp_path, capsys):
    out = tmp_path / "oc"
    code = main_analyze(["output-change", "--config", "norm=post", "--config", "norm=pre",
                         "--depths", "1,2", "--seeds", "1", "--sentences", "4", "--out", str(out),
                         "model=ci"])
    assert code == 0
    assert "least-squares fits" in capsys.readouterr().out
    result = json.loads((out / "output_change.json").read_text())
    assert [e["label"] for e in result["settings"]] == ["norm=post", "norm=pre"]
    assert result["command"][:3] == ["deepinit", "analyze", "output-change"]
    assert (out / "output_change.png").is_file()


@pytest.mark.parametrize("args", [
    ["grad-norms", "--config", "norm=sideways", "model=ci"],
    ["grad-norms", "model=ci", "not-an-override"],
    ["grad-norms", "model=ci", "model.nonsense=1"],
    ["output-change", "--depths", "2,x", "model=ci"],
    ["dependency", "--config", "norm=post init=rezero", "model=ci"],
])
def test_user_errors_exit_2(tmp_path, capsys, args):
    assert main_analyze([*args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("deepinit: error:") and "Traceback" not in err, err


def test_mode_gap_of_a_checkpoint(tmp_path, capsys):
    """`deepinit analyze mode-gap CHECKPOINT [BATCHES]`: the JSON on stdout and in mode_gap.json,
    the same bytes (the file results/table2/real/postln-no-warmup-mode-gap.json quotes)."""
    from runner.config import config_from_dict
    from runner.init import options_class
    from runner.model.sublayer import norm_options_class
    from runner.run.train import train
    from tests.conftest import compose

    run_dir = tmp_path / "run"
    train(compose([*TINY, "model.dropout=0.3", "trainer.progress=false"]), run_dir)
    checkpoint = run_dir / "checkpoint_last.pt"
    capsys.readouterr()
    out = tmp_path / "gap"
    assert main_analyze(["mode-gap", str(checkpoint), "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (out / "mode_gap.json").read_text() == printed
    result = json.loads(printed)
    assert result["checkpoint"] == str(checkpoint) and result["batches"] == 2
    losses = result["loss_per_token"]
    assert sorted(losses) == ["train/eval", "train/train", "valid/eval", "valid/train"]
    assert losses["train/train"] != losses["train/eval"]  # dropout changes the loss
    assert config_from_dict(torch.load(checkpoint, weights_only=True)["config"], options_class, norm_options_class).model.dropout == 0.3
    assert main_analyze(["mode-gap", str(tmp_path / "none.pt")]) == 2
