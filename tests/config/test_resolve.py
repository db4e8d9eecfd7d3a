"""init=tfixup trains without warmup unless the user sets one explicitly: warmup=auto (the
default) leaves warmup.updates to the init scheme, and the run layer fills it in
(runner/run/build.py resolve_config, runner/config/resolve.py), so every way of building a run
gets the rule, not only `deepinit train`."""
from __future__ import annotations

import pytest

from runner.cli.compose import compose_run
from runner.cli.train import method_group_options, method_groups_replaced
from runner.run.build import check_config, resolve_config
from tests.conftest import TINY, compose, run_cli_here

NOTE = "init=tfixup trains without warmup: warmup.updates=0 (set warmup.updates=N to use one)"


@pytest.mark.parametrize("overrides, expected, changed", [
    (["init=tfixup", "norm=none"], 0, True),
    (["init=tfixup", "norm=none", "warmup.updates=300"], 300, False),
    (["init=tfixup", "norm=none", "warmup.updates=100"], 100, False),  # the default's value, typed
    (["init=tfixup", "norm=none", "warmup=none"], 0, False),
    (["init=tfixup", "norm=none", "warmup=default"], 100, False),
    (["init=tfixup", "norm=none", "warmup.init_lr=1e-7"], 100, False),  # a warmup of one's own
    (["method=tfixup"], 0, True),
    (["init=xavier"], 100, False),
    (["init=xavier", "warmup.init_lr=1e-7"], 100, False),
])
def test_tfixup_drops_warmup_unless_set(overrides, expected, changed):
    cfg = compose(overrides)
    note = resolve_config(cfg)
    assert cfg.warmup.updates == expected
    assert (note is not None) == changed
    if changed:
        assert note == NOTE
    assert resolve_config(cfg) is None and cfg.warmup.updates == expected  # once resolved, it stays


def test_a_preset_value_counts_as_explicit():
    cfg = compose(["init=tfixup", "norm=none"])
    cfg.warmup.updates = 4000  # what a sweep preset writing warmup.updates: 4000 composes to
    assert resolve_config(cfg) is None and cfg.warmup.updates == 4000


def test_the_run_layer_applies_the_rule_without_the_cli(tmp_path, caplog):
    """A caller of the run layer (a tool, a test, `python -m runner.run`) gets the scheme's warmup
    as `deepinit train` does: check_config fills it in, train() trains with it and logs why."""
    import logging

    from runner.run.folder import read_metrics
    from runner.run.train import train

    cfg = compose(["init=tfixup", "norm=none", "optim.lr=1e-3", *(o for o in TINY if not o.startswith("warmup"))])
    assert cfg.warmup.updates is None  # warmup=auto: left to the init scheme
    with caplog.at_level(logging.INFO, logger="deepinit"):
        result = train(cfg, tmp_path / "run")
    assert NOTE in caplog.text
    assert cfg.warmup.updates == 0 and result["status"] == "ok"
    first = next(r for r in read_metrics(tmp_path / "run") if r["split"] == "train")
    assert first["lr"] > 0.5e-3  # inverse_sqrt without warmup: near the peak from the first update
    other = compose(["init=xavier"])
    check_config(other)
    assert other.warmup.updates == 100


@pytest.mark.parametrize("args, note", [
    (["--cfg", "job", "method=tfixup"], True),
    (["-c", "all", "init=tfixup", "norm=none"], True),
    (["--cfg=job", "init=tfixup", "norm=none"], True),
    (["-cjob", "init=tfixup", "norm=none"], True),
    (["--cfg", "job", "init=tfixup", "norm=none", "warmup.updates=300"], False),
    (["--cfg", "job", "init=tfixup", "norm=none", "--package", "warmup"], False),
    (["--cfg", "job", "init=tfixup", "norm=none", "--package=warmup"], False),
    (["--cfg", "hydra", "init=tfixup", "norm=none"], False),
    (["--cfg", "job", "norm=pre"], False),
    (["init=tfixup", "norm=none"], False),
])
def test_cfg_print_says_what_the_run_changes(args, note):
    """`--cfg job` prints the config before the run drops T-Fixup's warmup; a trailing YAML
    comment says that it will."""
    import yaml

    from runner.cli.train import cfg_print_note

    line = cfg_print_note(args)
    assert (line is not None) == note
    if note:
        assert line.startswith("# when the run starts: init=tfixup trains without warmup: warmup.updates=0")
        assert yaml.safe_load("a: 1\n" + line) == {"a": 1}  # a comment: the printed YAML stays valid


@pytest.mark.slow
def test_cfg_job_ends_with_the_note_and_a_bad_override_prints_none(tmp_path):
    run = ["train", "--cfg", "job"]
    ok = run_cli_here(run + ["method=tfixup"], cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.rstrip().splitlines()[-1].startswith("# when the run starts: init=tfixup")
    bad = run_cli_here(run + ["method=tfixup", "model.no_such_key=1"], cwd=tmp_path)
    assert bad.returncode == 2 and "when the run starts" not in bad.stdout + bad.stderr


@pytest.mark.parametrize("overrides, line", [
    (["method=post_ln_sgd"], None),
    (["method=admin"], None),
    ([], None),
    # table2's preset picks Adam after the method: the run would be Post-LN with Adam
    (["+sweep=reproduce_table2_real", "method=post_ln_sgd"],
     "method=post_ln_sgd sets optim=sgd, but this run has optim=adam (a sweep preset or override, "
     "merged after the method)"),
    (["method=tfixup", "norm=pre", "init=admin"],
     "method=tfixup sets norm=none, init=tfixup, but this run has norm=pre, init=admin (a sweep "
     "preset or override, merged after the method)"),
])
def test_a_group_replaced_after_the_method_is_named(overrides, line):
    assert method_groups_replaced(compose_run(overrides)[1]) == line


def test_method_group_options_reads_every_spelling_of_a_defaults_entry():
    defaults = ["_self_", {"override /optim": "sgd"}, {"optional override /norm@model": "post"},
                {"init": "xavier"}, {"a": 1, "b": 2}]
    assert method_group_options(defaults) == {"optim": "sgd", "norm": "post", "init": "xavier"}
    assert method_group_options(None) == {}


@pytest.mark.slow
def test_python_m_runner_run_trains_a_prepared_folder_with_the_rule(tmp_path):
    """The run layer's own entry (what the paper tables' suites start for each cell): the caller
    writes the composed config, `python -m runner.run RUN_DIR` trains it, fills in the scheme's
    warmup, says so in train.log and rewrites .hydra/config.yaml with what ran."""
    import subprocess
    import sys

    import yaml

    from runner.run.folder import read_result, write_config

    run_dir = tmp_path / "run"
    overrides = ["init=tfixup", "norm=none", "optim.lr=1e-3", "trainer.progress=false",
                 *(o for o in TINY if not o.startswith("warmup"))]
    write_config(run_dir, compose(overrides), overrides)
    assert yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["warmup"]["updates"] is None
    proc = subprocess.run([sys.executable, "-m", "runner.run", str(run_dir)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_result(run_dir)["status"] == "ok"
    assert NOTE in (run_dir / "train.log").read_text()
    assert yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["warmup"]["updates"] == 0
    assert yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) == overrides
    again = subprocess.run([sys.executable, "-m", "runner.run", str(run_dir)], capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and "already finished" in again.stdout + again.stderr
    bad = subprocess.run([sys.executable, "-m", "runner.run", str(tmp_path / "nothing")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no such file" in bad.stderr
