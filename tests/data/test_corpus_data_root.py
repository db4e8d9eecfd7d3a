"""Where data=multi30k|iwslt14 look with data.dir unset: $DEEPINIT_DATA_ROOT, else the per-user
$XDG_CACHE_HOME/deepinit/data, read at each call; a missing folder is one clear error line."""
import gzip
from pathlib import Path

import pytest

from runner.cli.data import main_prepare
from runner.config import DataConfig
from runner.data.corpus import CorpusError, corpus_dir, default_data_root, load_translation_data
from runner.data.prepare import default_multi30k_raw
from tests.conftest import run_cli


@pytest.fixture
def no_data_root(monkeypatch, tmp_path):
    """DEEPINIT_DATA_ROOT unset and XDG_CACHE_HOME pointing at a fresh folder."""
    monkeypatch.delenv("DEEPINIT_DATA_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "deepinit" / "data"


def test_default_is_the_per_user_xdg_cache(no_data_root, tmp_path):
    assert default_data_root() == no_data_root == tmp_path / "xdg" / "deepinit" / "data"
    assert corpus_dir(DataConfig(name="multi30k")) == no_data_root / "multi30k"
    assert corpus_dir(DataConfig(name="iwslt14")) == no_data_root / "iwslt14-de-en-fairseq"


def test_without_xdg_cache_home_the_default_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("DEEPINIT_DATA_ROOT", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_root() == tmp_path / "home" / ".cache" / "deepinit" / "data"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as XDG says
    assert default_data_root() == tmp_path / "home" / ".cache" / "deepinit" / "data"


def test_deepinit_data_root_wins_and_is_read_at_each_call(no_data_root, monkeypatch, tmp_path):
    for name in ("a", "b"):
        monkeypatch.setenv("DEEPINIT_DATA_ROOT", str(tmp_path / name))
        assert default_data_root() == tmp_path / name
        assert corpus_dir(DataConfig(name="multi30k")) == tmp_path / name / "multi30k"
        assert default_multi30k_raw() == tmp_path / name / "multi30k" / "raw"
    # data.dir wins over both.
    assert corpus_dir(DataConfig(name="multi30k", dir=str(tmp_path / "mine"))) == tmp_path / "mine"


def _one_line_error(cfg) -> str:
    with pytest.raises(CorpusError) as e:
        load_translation_data(cfg, use_cache=False)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_multi30k_folder_is_one_line_naming_folder_and_remedies(no_data_root):
    msg = _one_line_error(DataConfig(name="multi30k"))
    assert f"corpus folder not found: {no_data_root / 'multi30k'} " in msg
    assert "DEEPINIT_DATA_ROOT is not set" in msg
    assert "set DEEPINIT_DATA_ROOT" in msg and "data.dir=PATH" in msg
    assert "`deepinit data prepare multi30k --out DIR`" in msg


def test_missing_folder_under_deepinit_data_root_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("DEEPINIT_DATA_ROOT", str(tmp_path / "root"))
    (tmp_path / "root").mkdir()
    msg = _one_line_error(DataConfig(name="multi30k"))
    assert f"{tmp_path / 'root' / 'multi30k'} ($DEEPINIT_DATA_ROOT/multi30k)" in msg
    assert "data.dir=PATH" in msg and "deepinit data prepare multi30k --out DIR" in msg
    msg = _one_line_error(DataConfig(name="iwslt14"))
    assert str(tmp_path / "root" / "iwslt14-de-en-fairseq") in msg
    assert "deepinit data prepare iwslt14 --out DIR" in msg
    msg = _one_line_error(DataConfig(name="multi30k", dir=str(tmp_path / "nothere")))
    assert msg == f"corpus folder not found: {tmp_path / 'nothere'} (data.dir)"


def test_multi30k_under_the_data_root_is_found(no_data_root):
    src = ["ein hund läuft .", "zwei katzen schlafen ."]
    tgt = ["a dog runs .", "two cats sleep ."]
    folder = no_data_root / "multi30k"
    folder.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (folder / f"{split}.de").write_text("\n".join(src) + "\n", encoding="utf-8")
        (folder / f"{split}.en").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    data = load_translation_data(DataConfig(name="multi30k", bpe="none"), use_cache=False)
    assert data.stats["dir"] == str(folder) and len(data.splits["test"]) == 2


def test_prepare_multi30k_defaults_to_raw_under_the_data_root(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DEEPINIT_DATA_ROOT", str(tmp_path / "root"))
    out = tmp_path / "out"
    # no raw/ there yet: prepare tries to download it (here from a closed local port) and says
    # how to supply the files by hand
    assert main_prepare(["multi30k", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "could not download" in err and "--raw" in err
    raw = tmp_path / "root" / "multi30k" / "raw"
    raw.mkdir(parents=True)
    for theirs in ("train", "val", "test_2016_flickr"):
        for lang, line in (("de", "Ein Hund."), ("en", "A dog.")):
            (raw / f"{theirs}.{lang}.gz").write_bytes(gzip.compress((line + "\n").encode()))
    assert main_prepare(["multi30k", "--out", str(out)]) == 0
    assert (out / "test.en").read_text(encoding="utf-8") == "a dog .\n"


def test_cli_reports_the_missing_folder_in_one_line(monkeypatch, tmp_path):
    env_root = tmp_path / "root"
    monkeypatch.setenv("DEEPINIT_DATA_ROOT", str(env_root))
    r = run_cli(["train", "data=multi30k", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(env_root / "multi30k") in lines[0] and "DEEPINIT_DATA_ROOT" in lines[0]


def test_no_machine_path_in_the_data_modules():
    data = Path(__file__).resolve().parents[2] / "runner" / "data"
    for name in ("corpus.py", "prepare.py"):
        source = (data / name).read_text(encoding="utf-8")
        assert "/work/" not in source and "shared/data" not in source, name
