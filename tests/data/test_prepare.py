"""Corpus preparation: Multi30k reproduces the upstream tokenized files; IWSLT'14 runs the whole
prepare-iwslt14.sh path on a small archive in the real format."""
import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from runner.cli.data import main as main_data
from runner.cli.data import main_prepare
from runner.config import DataConfig
from runner.data.corpus import load_translation_data, read_lines
from runner.data.prepare import (
    PrepareError,
    clean_corpus,
    prepare_iwslt14,
    prepare_multi30k,
    split_every,
    xml_segments,
)
from runner.data.subword import remove_bpe
from tests.conftest import needs_staged, staged_data

M30K = staged_data("multi30k")
IWSLT = staged_data("iwslt14-de-en-fairseq")
needs_iwslt = needs_staged("iwslt14-de-en-fairseq", "staged IWSLT'14 data")
needs_m30k = needs_staged("multi30k", "staged Multi30k data")
quiet = dict(progress=lambda msg: None)


@needs_m30k
def test_multi30k_prepare_reproduces_upstream_tokenized_files(tmp_path):
    counts = prepare_multi30k(M30K / "raw", tmp_path / "out", max_lines=400, **quiet)
    assert counts["train"] == counts["valid"] == counts["test"] == 400
    for ours, theirs in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for lang in ("de", "en"):
            expected = read_lines(M30K / "tok" / f"{theirs}.lc.norm.tok.{lang}.gz")[:400]
            assert read_lines(tmp_path / "out" / f"{ours}.{lang}") == expected, (ours, lang)
    data = load_translation_data(DataConfig(name="multi30k", dir=str(tmp_path / "out")),
                                 use_cache=False)
    assert len(data.splits["test"]) == 400


def test_clean_corpus_follows_clean_corpus_n():
    src = ["a b c", "a b", "x " * 175, "x " * 176, "a  b\tc ", "  ", "a"]
    tgt = ["a b", "a b c d", "y " * 175, "y", "d e f", "z", "b"]
    s, t, dropped = clean_corpus(src, tgt, min_len=1, max_len=175, ratio=1.5)
    # kept: 3/2 = 1.5 (not > 1.5); 175 tokens; whitespace squeezed; 1/1.
    assert s == ["a b c", ("x " * 175).strip(), "a b c", "a"]
    assert t == ["a b", ("y " * 175).strip(), "d e f", "b"]
    assert dropped == 3  # ratio 2, 176 tokens, empty source


@needs_iwslt
def test_fairseq_valid_pairs_all_pass_the_clean_step():
    de = read_lines(IWSLT / "tmp" / "valid.de.gz")
    en = read_lines(IWSLT / "tmp" / "valid.en.gz")
    s, t, dropped = clean_corpus(de, en, min_len=1, max_len=175, ratio=1.5)
    assert dropped == 0 and s == de and t == en


def test_split_every_is_awk_nr_mod():
    rest, picked = split_every([str(i) for i in range(1, 50)], 23)
    assert picked == ["23", "46"] and len(rest) == 47 and "22" in rest and "23" not in rest


def test_xml_segments():
    lines = ['<doc docid="1">', '<seg id="1">  Das ist’s. </seg>', '<seg id="12">Ja</seg>  ',
             "</doc>"]
    assert xml_segments(lines) == ["Das ist's.", "Ja"]


# ---- a small de-en.tgz in the WIT3 2014-01 layout --------------------------------------------

PAIRS = [(f"Satz Nummer {i} ist hier.", f"Sentence number {i} is here.") for i in range(1, 47)]
PAIRS[4] = ("Das ist's, sagte er.", "That's it, he said.")
PAIRS[9] = ("Wort " * 180, "Word " * 180)  # > 175 tokens: cleaned away
PAIRS[12] = ("Ja.", "Yes , yes , yes , yes .")  # ratio > 1.5: cleaned away


def _train_tags(lang):
    i = 0 if lang == "de" else 1
    head = ["<url>http://www.ted.com/talks/x.html</url>", "<keywords>talks, x</keywords>",
            "<talkid>1</talkid>", f"<title>{'Ein Titel' if i == 0 else 'A Title'}</title>",
            f"<description>{'Beschreibung' if i == 0 else 'Description'}</description>"]
    return head + [p[i] for p in PAIRS]


def _xml(name, lang):
    text = {"de": f"Test {name} auf Deutsch.", "en": f"Test {name} in English’s words."}[lang]
    return ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", f'<refset setid="{name}">',
            '<doc docid="1">', "<talkid>1</talkid>", f'<seg id="1"> {text} </seg>',
            f'<seg id="2">Zwei {name}</seg>', "</doc>", "</refset>", "</mteval>"]


TEST_SETS = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
             "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012"]


def _fake_tgz(path: Path) -> Path:
    files = {}
    for lang in ("de", "en"):
        files[f"de-en/train.tags.de-en.{lang}"] = _train_tags(lang)
        for name in reversed(TEST_SETS):  # archive order must not matter
            files[f"de-en/{name}.de-en.{lang}.xml"] = _xml(name, lang)
    with tarfile.open(path, "w:gz") as tar:
        for name, lines in files.items():
            data = ("\n".join(lines) + "\n").encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_iwslt14_prepare_whole_path_on_a_small_archive(tmp_path):
    raw = _fake_tgz(tmp_path / "de-en.tgz")
    out = tmp_path / "prep"
    counts = prepare_iwslt14(raw, out, bpe_merges=40, **quiet)
    tmp = out / "tmp"
    # 46 sentences + title + description lines; tag lines dropped; 2 pairs cleaned away.
    assert counts["train_tags_lines"] == 48 and counts["clean_dropped"] == 2
    cleaned_en = read_lines(tmp / "train.en") + read_lines(tmp / "valid.en")
    assert len(cleaned_en) == 46
    # Cleaned lines: title, description, sentences 1-9, 11, 12, 14-46; so lines 23 and 46 are
    # sentences 23 and 46.
    assert read_lines(tmp / "valid.en") == ["sentence number 23 is here .",
                                            "sentence number 46 is here ."]
    train_en = read_lines(tmp / "train.en")
    assert train_en[0] == "a title" and train_en[1] == "description"
    assert "that &apos;s it , he said ." in train_en  # Moses escaping, -l en, lowercased
    assert "das ist &apos; s , sagte er ." in read_lines(tmp / "train.de")  # -l de splits both sides
    assert not any("<" in line or "url" in line for line in train_en)
    test_en = read_lines(tmp / "test.en")
    assert [line for line in test_en if line.startswith("test ")] == \
        [f"test {n.lower()} in english &apos;s words ." for n in TEST_SETS]
    assert len(test_en) == 10 and counts["test"] == 10
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            bpe = read_lines(out / f"{split}.{lang}")
            assert [remove_bpe(x) for x in bpe] == read_lines(tmp / f"{split}.{lang}")
    assert any("@@ " in x for x in read_lines(out / "train.de"))
    assert read_lines(out / "code")[0] == "#version: 0.2"
    assert json.loads((out / "prepare.json").read_text())["valid"] == 2
    # The prepared folder is what data=iwslt14 data.dir=OUT reads.
    data = load_translation_data(DataConfig(name="iwslt14", dir=str(out)), use_cache=False)
    assert len(data.splits["train"]) == 44 and data.bpe_symbol == "@@ "
    assert data.references["test"] == test_en


def test_iwslt14_prepare_with_subword_nmt_learner_and_given_codes(tmp_path):
    raw = _fake_tgz(tmp_path / "de-en.tgz")
    prepare_iwslt14(raw, tmp_path / "a", bpe_merges=30, bpe_learner="subword-nmt", **quiet)
    codes = read_lines(tmp_path / "a" / "code")
    assert codes[0] == "#version: 0.2" and len(codes) == 31
    prepare_iwslt14(raw, tmp_path / "b", codes=tmp_path / "a" / "code", **quiet)
    assert read_lines(tmp_path / "b" / "train.en") == read_lines(tmp_path / "a" / "train.en")


def test_missing_raw_says_what_to_supply(tmp_path):
    with pytest.raises(PrepareError, match=r"de-en\.tgz.*--raw PATH"):
        prepare_iwslt14(None, tmp_path, **quiet)
    with pytest.raises(PrepareError, match=r"does not exist.*--raw PATH"):
        prepare_iwslt14(tmp_path / "nope.tgz", tmp_path, **quiet)
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(PrepareError, match="not a readable tar"):
        prepare_iwslt14(bad, tmp_path, **quiet)
    with pytest.raises(PrepareError, match="multi30k.*--raw PATH"):
        prepare_multi30k(None, tmp_path, **quiet)


def test_cli_entry_points(tmp_path, capsys):
    assert main_prepare(["iwslt14", "--raw", str(tmp_path / "nope.tgz"), "--out",
                         str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--raw PATH" in err and "Traceback" not in err
    assert main_data(["prepare", "nosuchcorpus"]) == 2
    assert main_data([]) == 2
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        for lang, line in (("de", "Ein Hund läuft."), ("en", "A dog's run.")):
            (raw / f"{split}.{lang}.gz").write_bytes(gzip.compress((line + "\n").encode()))
    assert main_data(["prepare", "multi30k", "--raw", str(raw), "--out", str(tmp_path / "m")]) == 0
    assert read_lines(tmp_path / "m" / "test.en") == ["a dog &apos;s run ."]
    assert "data.dir=" in capsys.readouterr().out
