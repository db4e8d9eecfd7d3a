"""Corpus reading: every bad-corpus case names the file (and line); real-data slices load."""
import gzip
from pathlib import Path

import numpy as np
import pytest

from runner.config import DataConfig
from runner.data.corpus import CorpusError, load_translation_data, read_lines, read_parallel
from runner.data.dictionary import Dictionary
from runner.data.subword import remove_bpe
from tests.conftest import needs_staged, staged_data

IWSLT = staged_data("iwslt14-de-en-fairseq")
M30K = staged_data("multi30k/tok")
needs_iwslt = needs_staged("iwslt14-de-en-fairseq", "staged IWSLT'14 data")
needs_m30k = needs_staged("multi30k/tok", "staged Multi30k tok/ files")


def _write(path: Path, lines, gz=False):
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def _custom(tmp_path, **kw):
    return DataConfig(name="custom", dir=str(tmp_path), cache_dir=str(tmp_path / "cache"), **kw)


def _small_corpus(d: Path):
    src = ["ein hund läuft .", "zwei katzen schlafen .", "der mann isst .", "ein kind spielt ."]
    tgt = ["a dog runs .", "two cats sleep .", "the man eats .", "a child plays ."]
    for split in ("train", "valid", "test"):
        _write(d / f"{split}.de", src)
        _write(d / f"{split}.en", tgt)
    return src, tgt


def test_missing_file_is_named(tmp_path):
    _small_corpus(tmp_path)
    (tmp_path / "test.en").unlink()
    with pytest.raises(CorpusError, match=r"split 'test' \(en\).*test\.en"):
        load_translation_data(_custom(tmp_path), use_cache=False)
    with pytest.raises(CorpusError, match="missing corpus file: .*nothere.de"):
        read_lines(tmp_path / "nothere.de")


def test_custom_without_dir_says_what_to_set():
    with pytest.raises(CorpusError, match="data.dir=PATH"):
        load_translation_data(DataConfig(name="custom"))


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    a = _write(tmp_path / "x.de", ["a", "b", "c"])
    b = _write(tmp_path / "x.en", ["a", "b"])
    with pytest.raises(CorpusError) as e:
        read_parallel(a, b)
    msg = str(e.value)
    assert "x.de has 3 lines" in msg and "x.en has 2" in msg


@pytest.mark.parametrize("gz", [False, True])
def test_non_utf8_names_file_and_line(tmp_path, gz):
    p = tmp_path / "bad.de"
    raw = "eins\nzwei\n".encode() + b"dr\xfcber\n" + b"vier\n"  # latin-1 u-umlaut on line 3
    if gz:
        p = tmp_path / "bad.de.gz"
        p.write_bytes(gzip.compress(raw))
    else:
        p.write_bytes(raw)
    with pytest.raises(CorpusError, match=r"bad\.de(\.gz)?:3: not valid UTF-8 \(byte 0xfc at byte column 3\)"):
        read_lines(p)


def test_empty_lines_skipped_with_a_count(tmp_path):
    _small_corpus(tmp_path)
    _write(tmp_path / "train.de", ["ein hund läuft .", "", "der mann isst .", "ein kind spielt ."])
    _write(tmp_path / "train.en", ["a dog runs .", "two cats sleep .", "   ", "a child plays ."])
    data = load_translation_data(_custom(tmp_path, empty_lines="skip"), use_cache=False)
    assert data.stats["splits"]["train"]["empty_skipped"] == 2
    assert len(data.splits["train"]) == 2
    assert data.src_dict.string(data.splits["train"].source(1)) == "ein kind spielt ."
    assert data.tgt_dict.string(data.splits["train"].target(1)) == "a child plays ."


def test_empty_lines_rejected_name_file_and_line(tmp_path):
    _small_corpus(tmp_path)
    _write(tmp_path / "valid.en", ["a dog runs .", "two cats sleep .", "\t", "a child plays ."])
    with pytest.raises(CorpusError, match=r"valid\.en:3: empty line"):
        load_translation_data(_custom(tmp_path, empty_lines="error"), use_cache=False)


def test_only_newline_ends_a_line(tmp_path):
    # U+2028 and U+0085 are line breaks for str.splitlines(); here they stay inside the line.
    a = _write(tmp_path / "u.de", ["a\u2028b", "c\x85d", "e"])
    b = _write(tmp_path / "u.en", ["x", "y", "z"])
    pt = read_parallel(a, b)
    assert pt.src == ["a\u2028b", "c\x85d", "e"] and pt.tgt == ["x", "y", "z"]
    (tmp_path / "crlf.de").write_bytes(b"a b\r\nc\r\n")
    assert read_lines(tmp_path / "crlf.de") == ["a b", "c"]


def test_too_long_pairs_are_counted_not_silent(tmp_path):
    src, tgt = _small_corpus(tmp_path)
    _write(tmp_path / "train.de", src + ["w " * 30])
    _write(tmp_path / "train.en", tgt + ["short ."])
    data = load_translation_data(_custom(tmp_path, max_source_positions=10), use_cache=False)
    assert data.stats["splits"]["train"]["too_long"] == 1
    assert len(data.splits["train"]) == 4
    assert data.splits["train"].src_lengths.max() <= 10


def test_gz_and_plain_give_the_same_data(tmp_path):
    (tmp_path / "plain").mkdir()
    src, tgt = _small_corpus(tmp_path / "plain")
    gzdir = tmp_path / "gz"
    gzdir.mkdir()
    for split in ("train", "valid", "test"):
        _write(gzdir / f"{split}.de", src, gz=True)
        _write(gzdir / f"{split}.en", tgt, gz=True)
    a = load_translation_data(_custom(tmp_path / "plain"), use_cache=False)
    b = load_translation_data(_custom(gzdir), use_cache=False)
    assert a.src_dict == b.src_dict
    np.testing.assert_array_equal(a.splits["test"].src_tokens, b.splits["test"].src_tokens)


def _m30k_slice(root: Path, n_train=400, n_eval=60):
    (root / "tok").mkdir(parents=True)
    for name, n in (("train", n_train), ("val", n_eval), ("test_2016_flickr", n_eval)):
        for lang in ("de", "en"):
            with gzip.open(M30K / f"{name}.lc.norm.tok.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = f.read().split("\n")[:n]
            _write(root / "tok" / f"{name}.lc.norm.tok.{lang}", lines, gz=True)
    return root


@needs_m30k
def test_multi30k_slice_with_learned_bpe(tmp_path):
    root = _m30k_slice(tmp_path / "m30k")
    cfg = DataConfig(name="multi30k", dir=str(root), bpe="tokenizers", bpe_merges=300,
                     cache_dir=str(tmp_path / "cache"))
    data = load_translation_data(cfg)
    assert {k: len(v) for k, v in data.splits.items()} == {"train": 400, "valid": 60, "test": 60}
    assert data.joined and data.src_dict is data.tgt_dict and len(data.src_dict) % 8 == 0
    assert data.bpe_symbol == "@@ " and data.stats["bpe"]["merges"] == 300
    with gzip.open(M30K / "test_2016_flickr.lc.norm.tok.en.gz", "rt", encoding="utf-8") as f:
        expected = [" ".join(line.split()) for line in f.read().split("\n")[:60]]
    assert data.references["test"] == expected
    test = data.splits["test"]
    decoded = [data.tgt_dict.string(test.target(i), bpe_symbol="@@ ") for i in range(len(test))]
    # Words unseen in the 400-line train slice become <unk> pieces; the rest must round-trip.
    exact = sum(d == r for d, r in zip(decoded, expected))
    assert exact >= 30 and all(d == r for d, r in zip(decoded, expected) if "<unk>" not in d)
    assert "train" not in data.references


@needs_m30k
def test_multi30k_separate_dictionaries(tmp_path):
    root = _m30k_slice(tmp_path / "m30k", n_train=200, n_eval=20)
    cfg = DataConfig(name="multi30k", dir=str(root), joined_dictionary=False)
    data = load_translation_data(cfg, use_cache=False)
    assert not data.joined
    assert "männer" in data.src_dict and "männer" not in data.tgt_dict
    assert "men" in data.tgt_dict and len(data.tgt_dict) % 8 == 0
    assert data.bpe_symbol is None  # word-level text without markers


@needs_iwslt
def test_iwslt14_missing_train_is_explained():
    with pytest.raises(CorpusError) as e:
        load_translation_data(DataConfig(name="iwslt14"), use_cache=False)
    msg = str(e.value)
    assert "train" in msg and "only valid and test" in msg
    assert "deepinit data prepare iwslt14 --out DIR" in msg and "--raw PATH/de-en.tgz" in msg


@needs_iwslt
def test_iwslt14_test_references_are_the_pre_bpe_text():
    with gzip.open(IWSLT / "valid.de.gz", "rt", encoding="utf-8") as f:
        de = f.read().split("\n")
    with gzip.open(IWSLT / "valid.en.gz", "rt", encoding="utf-8") as f:
        en = f.read().split("\n")
    dicts = (Dictionary.build(s.split() for s in de), Dictionary.build(s.split() for s in en))
    data = load_translation_data(DataConfig(name="iwslt14"), splits=["test"], dictionaries=dicts,
                                 use_cache=False)
    assert list(data.splits) == ["test"] and len(data.splits["test"]) == 6750
    assert data.bpe_symbol == "@@ "
    with gzip.open(IWSLT / "tmp" / "test.en.gz", "rt", encoding="utf-8") as f:
        pre_bpe = f.read().split("\n")[:-1]
    assert data.references["test"] == pre_bpe
    assert remove_bpe("it &apos;s that pyrami@@ d .") == "it &apos;s that pyramid ."


@needs_m30k
@pytest.mark.parametrize("group", ["multi30k", "iwslt14", "custom"])
def test_conf_data_groups_compose_and_load(tmp_path, group):
    import os

    from hydra import compose, initialize_config_dir

    from runner.cli.compose import register_schemas

    register_schemas()
    conf = Path(__file__).resolve().parents[2] / "conf"
    root = _m30k_slice(tmp_path / "m30k", n_train=150, n_eval=10)
    if group != "multi30k":  # the other groups read {split}.{lang}
        for ours, theirs in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
            for lang in ("de", "en"):
                lines = read_lines(root / "tok" / f"{theirs}.lc.norm.tok.{lang}.gz")
                _write(root / f"{ours}.{lang}", lines)
    with initialize_config_dir(version_base="1.3", config_dir=os.fspath(conf)):
        cfg = compose("train", overrides=[f"data={group}", f"data.dir={root}",
                                          f"data.cache_dir={tmp_path / 'cache'}",
                                          "data.bpe_merges=100"])
    data = load_translation_data(cfg.data)
    assert cfg.data.name == group and len(data.splits["test"]) == 10
    assert data.joined and data.stats["cache"]["status"] == "built"


def test_truncated_gzip_is_named(tmp_path):
    p = tmp_path / "t.de.gz"
    p.write_bytes(gzip.compress(b"eins\nzwei\n" * 100)[:30])
    with pytest.raises(CorpusError, match=r"cannot read .*t\.de\.gz"):
        read_lines(p)


def test_bpe_codes_problems_are_corpus_errors(tmp_path):
    _small_corpus(tmp_path)
    with pytest.raises(CorpusError, match="needs data.bpe_codes"):
        load_translation_data(_custom(tmp_path, bpe="codes"), use_cache=False)
    (tmp_path / "code").write_text("e n</w>\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="#version"):
        load_translation_data(_custom(tmp_path, bpe="codes", bpe_codes=str(tmp_path / "code")),
                              use_cache=False)
    (tmp_path / "code").write_text("#version: 0.2\ne n</w>\nh u\n", encoding="utf-8")
    data = load_translation_data(_custom(tmp_path, bpe="codes", bpe_codes=str(tmp_path / "code")),
                                 use_cache=False)
    assert "hu@@" in data.src_dict and data.references["test"][0] == "a dog runs ."
