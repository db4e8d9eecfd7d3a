"""init=tfixup trains without warmup unless the user sets one explicitly (the CLI applies the
scheme's warmup_updates and says so)."""
from __future__ import annotations

import pytest

from runner.cli.compose import compose_run
from runner.cli.train import method_group_options, method_groups_replaced, scheme_warmup
from tests.conftest import compose, run_cli_here


@pytest.mark.parametrize("overrides, choices, expected, changed", [
    (["init=tfixup", "norm=none"], {"warmup": "default"}, 0, True),
    (["init=tfixup", "norm=none", "warmup.updates=300"], {"warmup": "default"}, 300, False),
    (["init=tfixup", "norm=none", "warmup=none"], {"warmup": "none"}, 0, False),
    (["init=xavier"], {"warmup": "default"}, 100, False),
])
def test_tfixup_drops_warmup_unless_set(overrides, choices, expected, changed):
    cfg = compose(overrides)
    note = scheme_warmup(cfg, choices, [o for o in overrides if o.startswith("warmup")])
    assert cfg.warmup.updates == expected
    assert (note is not None) == changed
    if changed:
        assert note == "init=tfixup trains without warmup: warmup.updates=0 (set warmup.updates=N to use one)"


def test_a_preset_value_counts_as_explicit():
    cfg = compose(["init=tfixup", "norm=none"])
    cfg.warmup.updates = 4000  # what a sweep preset writing warmup.updates: 4000 composes to
    assert scheme_warmup(cfg, {"warmup": "default"}, []) is None and cfg.warmup.updates == 4000


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
