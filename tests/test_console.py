"""What a run prints: a short start summary (parameters, data sizes, device, run folder), the full
config only in train.log (and on the console at DEBUG), progress rows that nest into the
training bar."""
from __future__ import annotations

import io
import json

from rich.console import Console

from runner import console as console_module
from runner.console import Overview, overview_text, progress_bar, track
from tests.conftest import TINY, run_cli_here

MAX_LINE = 200


def test_start_summary_and_config_placement(tiny_run):
    run_dir, proc = tiny_run  # conftest: deepinit train *TINY (TensorBoard on, 2 checkpoints kept)
    out = proc.stdout
    result = json.loads((run_dir / "result.json").read_text())
    start = out[:out.index("run folder")]
    assert f"{result['parameters']:,} parameters" in start
    assert "50 valid / 50 test pairs" in start and "vocab" in start
    assert "cpu" in start and "fp32" in start
    assert str(run_dir) in out[out.index("run folder"):].splitlines()[0]
    assert all(len(line) <= MAX_LINE for line in out.splitlines()), max(out.splitlines(), key=len)
    assert "{'" not in out  # no dict dumps (the data statistics are in env.json)
    # the full config: in train.log, not on the console
    log = (run_dir / "train.log").read_text()
    assert "qk_norm_temperature: 12.32" in log and "qk_norm_temperature" not in out
    assert "parameters" in log and str(run_dir) in log  # the summary is in train.log too
    assert "qk_norm_temperature: 12.32" in (run_dir / ".hydra" / "config.yaml").read_text()


def test_full_config_on_the_console_at_debug(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli_here(["train", *TINY, "trainer.max_updates=5", "trainer.save_interval=5",
                         "hydra.verbose=deepinit", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "qk_norm_temperature" in proc.stdout
    assert (run_dir / "train.log").read_text().count("qk_norm_temperature: 12.32") == 1


def test_overview_wraps_to_the_console_width():
    rows = [("model", "1,234 parameters: " + "word " * 30), ("run folder", "/x/" + "a" * 150)]
    out = io.StringIO()
    Console(file=out, width=60).print(Overview("deepinit train", rows))
    lines = out.getvalue().splitlines()
    assert lines[0] == "deepinit train"
    assert all(len(line) <= 60 and line == line.rstrip() for line in lines)
    assert "".join(line.strip() for line in lines[-4:]).endswith("a" * 150)
    text = overview_text("deepinit train", rows)
    assert text.splitlines()[1].startswith("  model       1,234 parameters")


def test_track_nests_into_the_shown_bar():
    seen = []
    with progress_bar(True) as progress:
        progress.add_task("train", total=10)
        for item in track([[1, 2], [3]], "decode", advance=len):
            seen.append([t.description for t in progress.tasks])
            assert console_module._live[-1] is progress
        assert [t.description for t in progress.tasks] == ["train"]  # the row is gone
    assert seen == [["train", "decode"], ["train", "decode"]]
    assert console_module._live == []
    # on its own (no terminal): iterates everything, shows nothing
    assert list(track(range(3), "valid")) == [0, 1, 2]


def test_help_piped_into_a_reader_that_exits_early_stops_quietly():
    """`deepinit --help | head`: the reader closes the pipe before deepinit writes; deepinit
    exits with SIGPIPE's status (141, as Unix tools do) and prints no traceback."""
    import subprocess

    from tests.conftest import DEEPINIT

    for args in (["--help"], ["reproduce", "list"]):
        proc = subprocess.Popen([str(DEEPINIT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()  # the reader is gone before the first write
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141, err
        assert err == "", err


def test_ctrl_c_while_the_verb_loads_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C during the seconds that torch and Hydra take to import (before any verb's own
    handler exists): one line and SIGINT's status, no traceback."""
    import importlib

    import pytest

    import runner.cli as cli

    def interrupted_import(name, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", interrupted_import)
    try:
        cli.main(["train", "--help"])
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt reached the user as a traceback")
    except SystemExit as exit_:
        assert exit_.code == 130
    else:
        pytest.fail("main() returned")
    assert capsys.readouterr().err == "deepinit: interrupted\n"


def test_one_number_format_for_every_table():
    from runner.console import fmt, format_duration

    nan, inf = float("nan"), float("inf")
    # the run summary: None is missing, nan and inf are shown (a diverged run's loss)
    assert [fmt(None), fmt(1.5), fmt(nan), fmt(inf, ".2f")] == ["-", "1.5000", "nan", "inf"]
    # the suites' tables: anything not finite is missing; the bench tables: NaN (not measured) only
    assert [fmt(v, ".3f", show_nan=False, show_inf=False) for v in (nan, inf, -inf, 2)] == ["-", "-", "-", "2.000"]
    assert [fmt(v, ".1f", show_nan=False) for v in (nan, inf)] == ["-", "inf"]
    assert fmt(None, ".1f", missing="n/a") == "n/a"
    # small values in e-notation (the sweep report; the evidence's signed differences); 0 stays fixed
    assert [fmt(v, ".3f", small=1e-3) for v in (0.0004, 0, -0.0012, nan)] == ["4.00e-04", "0.000", "-0.001", "nan"]
    assert [fmt(v, "+.2f", small=0.01, small_spec="+.2e") for v in (0.005, -0.0, 0.25)] == ["+5.00e-03", "-0.00", "+0.25"]
    assert [format_duration(s) for s in (95, 750, 11520)] == ["95 s", "12.5 min", "3.2 h"]
    assert [format_duration(s, short=True) for s in (95, 750, 11520)] == ["95s", "12.5m", "3.2h"]
