"""What a user can fix ends in one line on stderr and exit 2, never in a traceback: a mistyped
command, an unknown config key, an output folder that cannot be written, SLURM asked for where
there is none, a corpus that cannot be read; Ctrl-C on a local sweep prints the sweep's table and
no traceback. A bug exits 1 with one line that names a file holding the traceback."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import DEEPINIT, TINY, run_cli, run_cli_all, run_cli_here


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a user error prints on stderr (exit 2, no traceback anywhere)."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("deepinit: error: "), lines[0]
    return lines[0]


UNKNOWN_COMMANDS = [("evaluate", "`deepinit eval`"), ("status", "`deepinit sweep status`"),
                    ("reprt", "`deepinit report`"), ("frobnicate", None)]
BAD_OVERRIDES = [
    ("model.no_such=1", "unknown key model.no_such; model has: preset, dim, ffn_dim"),
    ("max_updates=5", "unknown key max_updates (did you mean trainer.max_updates?)"),
    ("trainer.divergence.patienc=5", "(did you mean trainer.divergence.patience?); trainer.divergence has: loss_bound, patience"),
    ("norm=pree", "norm=pree: no such option (did you mean norm=pre?); norm has: b2t, mix, none"),
    ("trainer.max_updates=abc", "trainer.max_updates=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    ("evaluate", "'evaluate' is neither an override (key=value) nor a command"),
]


@pytest.fixture(scope="module")
def user_error_runs(tmp_path_factory) -> dict:
    """The commands of the two tests below, each in its own folder (the first of each kind in a
    process of its own, at the process boundary; the others in this process):
    `deepinit WORD` {("command", WORD): (FOLDER, process)} and `deepinit train OVERRIDE
    hydra.run.dir=FOLDER/run` {("train", OVERRIDE): (FOLDER, process)}."""
    folders = {**{("command", word): tmp_path_factory.mktemp("command") for word, _ in UNKNOWN_COMMANDS},
               **{("train", override): tmp_path_factory.mktemp("override") for override, _ in BAD_OVERRIDES}}
    commands = {(kind, arg): ([arg] if kind == "command" else ["train", arg, f"hydra.run.dir={folder / 'run'}"],
                              folder)
                for (kind, arg), folder in folders.items()}
    # one command of each kind at the process boundary, the others through the same entry point
    # in this process (run_cli_here: no interpreter start-up each)
    boundary = [next(k for k in commands if k[0] == kind) for kind in ("command", "train")]
    procs = run_cli_all({key: commands[key] for key in boundary})
    for key, (args, folder) in commands.items():
        if key not in procs:
            procs[key] = run_cli_here(args, folder)
    return {key: (folders[key], procs[key]) for key in folders}


@pytest.mark.parametrize("word, hint", UNKNOWN_COMMANDS)
def test_an_unknown_command_names_the_commands(user_error_runs, word, hint):
    tmp_path, proc = user_error_runs[("command", word)]
    line = one_error_line(proc)
    assert f"unknown command '{word}'" in line and "eval, report, sweep" in line
    if hint:
        assert f"did you mean {hint}" in line
    else:
        assert "did you mean" not in line
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("override, expected", BAD_OVERRIDES)
def test_a_bad_override_is_one_line_with_what_is_valid(user_error_runs, override, expected):
    _, proc = user_error_runs[("train", override)]
    assert expected in one_error_line(proc)


# ----------------------------------------------------------------------------- as another user
@pytest.fixture
def shared_dir():
    """A folder every user may enter (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="deepinit-test-"))
    path.chmod(0o777)
    yield path
    for p in path.rglob("*"):  # folders a test made unreadable
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o777)
    shutil.rmtree(path, ignore_errors=True)


def as_unprivileged(args: list[str], home: Path) -> tuple[list[str], dict]:
    """`deepinit args` as a user whom file permissions bind (root ignores them: then as nobody)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "HOME": str(home),
           "XDG_CACHE_HOME": str(home / "cache"), "DEEPINIT_CACHE": str(home / "cache")}
    cmd = [str(DEEPINIT), *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: no user whom permissions bind")
        cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", *cmd]
    return cmd, env


def run_unprivileged(args: list[str], home: Path) -> subprocess.CompletedProcess:
    cmd, env = as_unprivileged(args, home)
    return subprocess.run(cmd, cwd=home, env=env, capture_output=True, text=True, timeout=300)


def test_an_output_folder_that_cannot_be_written_is_one_line(shared_dir):
    locked = shared_dir / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    proc = run_unprivileged(["train", *TINY, f"hydra.run.dir={locked / 'run'}"], shared_dir)
    line = one_error_line(proc)
    assert f"cannot write {locked / 'run'}" in line and "hydra.run.dir=PATH" in line
    proc = run_unprivileged(["-m", *TINY, "optim.lr=1e-3,1e-4", f"hydra.sweep.dir={locked / 'sweep'}"],
                            shared_dir)
    line = one_error_line(proc)
    assert f"cannot write {locked / 'sweep'}" in line and "hydra.sweep.dir=PATH" in line


@pytest.mark.parametrize("locked", ["file", "folder"])
def test_a_corpus_that_cannot_be_read_is_one_line_and_exit_2(shared_dir, locked):
    corpus = shared_dir / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            (corpus / f"{split}.{lang}").write_text("ein haus\n" if lang == "de" else "a house\n")
    (corpus / "train.de").chmod(0o000) if locked == "file" else corpus.chmod(0o000)
    proc = run_unprivileged(["train", "data=custom", f"data.dir={corpus}", "model=ci", "warmup=none",
                             "trainer.max_updates=2", f"hydra.run.dir={shared_dir / 'run'}"], shared_dir)
    line = one_error_line(proc)
    where = corpus / "train.de" if locked == "file" else corpus
    assert f"cannot read {where}" in line or f"cannot read the corpus folder {where}" in line
    assert "permission denied" in line


def test_slurm_without_slurm_is_one_line(tmp_path):
    """A machine without SLURM, also where SLURM is installed (the CI's): the command's PATH holds
    only deepinit's own bin folder, so submitit finds no `srun`."""
    bin_dir = DEEPINIT.parent
    assert not (bin_dir / "srun").exists()
    env = {**os.environ, "PATH": str(bin_dir)}
    proc = run_cli(["-m", "hydra/launcher=slurm", *TINY, "optim.lr=1e-3,1e-4",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=env)
    line = one_error_line(proc)
    assert "hydra/launcher=slurm needs SLURM" in line and "hydra/launcher=local" in line


# ----------------------------------------------------------------------------- Ctrl-C, bugs
@pytest.mark.slow
def test_ctrl_c_on_a_local_sweep_prints_the_table_and_no_traceback(tmp_path):
    """Ctrl-C in a terminal signals every process of the sweep (its process group): the driver,
    submitit's controllers, the cells. Only the sweep's table and one line come back."""
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=local", "hydra.launcher.cpu_parallelism=2", "hydra.launcher.gpus=[]",
            *TINY, "trainer.max_updates=100000", "trainer.save_interval=1000", "trainer.valid_interval=1000",
            "optim.lr=1e-3,1e-4", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.Popen([str(DEEPINIT), *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    def training() -> list[Path]:
        return [p.parent for p in sweep.glob("*/metrics.jsonl") if p.read_text().strip()]

    deadline = time.time() + 240
    while time.time() < deadline and len(training()) < 2:
        time.sleep(0.2)  # both cells have logged their first window
    try:
        assert len(training()) == 2, "the cells did not start"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, err
    assert "2 interrupted" in out
    assert err.strip().splitlines()[-1].startswith("deepinit: stopped by SIGINT")
    # each cell finished its update and saved it before it stopped (nothing lost)
    for cell in training():
        marker = json.loads((cell / "interrupted.json").read_text())
        assert marker["resume_update"] is not None and marker["resume_update"] >= 5, marker


def test_a_bug_is_one_line_naming_the_traceback_file(monkeypatch, capsys):
    import importlib

    import runner.cli as cli

    def broken(name, *args, **kwargs):
        raise RuntimeError("something deepinit did not expect")

    monkeypatch.setattr(importlib, "import_module", broken)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("DEEPINIT_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["eval", "somewhere"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("deepinit: internal error: RuntimeError: something deepinit did not expect")
    path = Path(err.split("traceback in ")[1].split(";")[0])
    try:
        text = path.read_text()
        assert "Traceback (most recent call last)" in text and "something deepinit did not expect" in text
    finally:
        path.unlink()
