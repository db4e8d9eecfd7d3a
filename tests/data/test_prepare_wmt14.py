"""`deepinit data prepare wmt14-en-de` on tiny archives with the real member names and layout of
the five archives of fairseq's prepare-wmt14en2de.sh (europarl-v7, commoncrawl, news-commentary-v12,
dev, test-full): from a --raw folder (fairseq recipe), and downloaded from a local 127.0.0.1
server (admin recipe); then a 2-update `deepinit train data=custom` on the prepared folder."""
import contextlib
import io
import json
import random
from collections import Counter

import pytest
from subword_nmt.learn_bpe import learn_bpe as snmt_learn

import runner.data.download as dl
from runner.cli.data import main as main_data
from runner.data.corpus import read_lines
from runner.data.download import RemoteCorpus, RemoteFile
from runner.data.moses import moses_normalize, moses_tokenize, remove_non_printing
from runner.data.prepare import PrepareError, prepare_wmt14
from runner.data.subword import learn_bpe, learn_bpe_from_counts, remove_bpe
from tests.conftest import run_cli_here
from tests.data.http_files import FileServer, sha256, tgz

quiet = dict(progress=lambda msg: None)

# Word-for-word pairs, so that a sentence has as many tokens on both sides (and, once the BPE
# has merged every frequent word whole, as many BPE tokens): only the pairs below are cleaned.
WORDS = [("the", "die"), ("cat", "Katze"), ("dog", "Hund"), ("house", "Haus"), ("sees", "sieht"),
         ("likes", "mag"), ("big", "grosse"), ("small", "kleine"), ("red", "rote"), ("old", "alte"),
         ("new", "neue"), ("car", "Auto"), ("tree", "Baum"), ("city", "Stadt"), ("today", "heute"),
         ("very", "sehr"), ("and", "und"), ("with", "mit"), ("garden", "Garten"), ("water", "Wasser")]
HYPHEN = ("a state-of-the-art car", "ein hoch-modernes Auto")  # -a: `state @-@ of @-@ the @-@ art`
QUOTES = ('he says " hello " today', "er sagt „ hallo “ heute")  # normalized to " then &quot;
ZERO_WIDTH = ("the big\u200bdog", "die grosse\u200bHund")  # remove-non-printing-char: a space
OVER_LONG = 10            # europarl line (1-based) with 260 tokens a side: cleaned away
RATIO = 125               # global line: 2 English tokens, 20 German ones (ratio 10): cleaned away
SIZES = {"europarl": 120, "commoncrawl": 60, "nc": 30}  # 210 lines: valid = lines 100 and 200
ARCHIVES = ("training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
            "training-parallel-nc-v12.tgz", "dev.tgz", "test-full.tgz")
TEST_EN = ["Gutach: Increased safety for pedestrians", "It’s a well-known fact.",
           "The cat sees the old tree."]
TEST_DE = ["Gutach: Noch mehr Sicherheit für Fußgänger", "„Donaudampfschifffahrtsgesellschaft“ ist lang.",
           "Die Katze sieht den alten Baum."]


def _pairs(rng: random.Random, n: int, first: int) -> list[tuple[str, str]]:
    """n sentence pairs; `first` is the global (1-based) number of the first line."""
    out = []
    for i in range(first, first + n):
        idx = [rng.randrange(len(WORDS)) for _ in range(rng.randint(5, 10))]
        en, de = " ".join(WORDS[j][0] for j in idx) + ".", " ".join(WORDS[j][1] for j in idx) + "."
        if i % 7 == 0:
            en, de = f"{en} {HYPHEN[0]}.", f"{de} {HYPHEN[1]}."
        elif i % 11 == 0:
            en, de = f"{QUOTES[0]} {en}", f"{QUOTES[1]} {de}"
        elif i % 13 == 0:
            en, de = f"{ZERO_WIDTH[0]} {en}", f"{ZERO_WIDTH[1]} {de}"
        if i == OVER_LONG:
            en, de = " ".join([en] * 40), " ".join([de] * 40)
        if i == RATIO:
            en, de = "Yes.", " ".join(WORDS[j % len(WORDS)][1] for j in range(19)) + "."
        out.append((en, de))
    return out


def _text(lines, not_utf8_at: int | None = None) -> bytes:
    """Lines as UTF-8; the line at index `not_utf8_at` gets a byte that is not UTF-8 (0xff)."""
    rows = [line.encode("utf-8") for line in lines]
    if not_utf8_at is not None:
        rows[not_utf8_at] += b" \xff"
    return b"".join(row + b"\n" for row in rows)


def _sgm(kind: str, lang: str, segs: list[str]) -> bytes:
    head = f'<{kind}set setid="newstest2014" srclang="any" trglang="{lang}">'
    body = [head, '<doc sysid="ref" docid="1012-bbc" genre="news" origlang="en">', "<p>"]
    body += [f'<seg id="{i}">{s}</seg>' for i, s in enumerate(segs, start=1)]
    return _text(body + ["</p>", "</doc>", f"</{kind}set>"])


def fake_archives() -> dict[str, bytes]:
    """The five archives, by file name, with the members prepare-wmt14en2de.sh reads (and a few
    it does not). The test set's -src.de / -ref.en files hold text that must not be used."""
    rng = random.Random(14)
    europarl = _pairs(rng, SIZES["europarl"], 1)
    crawl = _pairs(rng, SIZES["commoncrawl"], 1 + SIZES["europarl"])
    nc = _pairs(rng, SIZES["nc"], 1 + SIZES["europarl"] + SIZES["commoncrawl"])
    dev = _pairs(rng, 8, 1000)
    wrong = [f"WRONG side {i}" for i in range(len(TEST_EN))]
    return {
        "training-parallel-europarl-v7.tgz": tgz({
            "training/europarl-v7.de-en.en": _text(p[0] for p in europarl),
            "training/europarl-v7.de-en.de": _text(p[1] for p in europarl),
            "training/europarl-v7.fr-en.en": _text(["Not this pair."])}),
        "training-parallel-commoncrawl.tgz": tgz({
            "commoncrawl.de-en.en": _text((p[0] for p in crawl), not_utf8_at=2),
            "commoncrawl.de-en.de": _text(p[1] for p in crawl),
            "commoncrawl.de-en.annotation": _text(["x"] * len(crawl))}),
        "training-parallel-nc-v12.tgz": tgz({
            "training/news-commentary-v12.de-en.en": _text(p[0] for p in nc),
            "training/news-commentary-v12.de-en.de": _text(p[1] for p in nc)}),
        "dev.tgz": tgz({"dev/newstest2013.en": _text(p[0] for p in dev),
                        "dev/newstest2013.de": _text(p[1] for p in dev),
                        "dev/newstest2012.en": _text(["Not this year."])}),
        "test-full.tgz": tgz({"test-full/newstest2014-deen-src.en.sgm": _sgm("src", "en", TEST_EN),
                              "test-full/newstest2014-deen-ref.de.sgm": _sgm("ref", "de", TEST_DE),
                              "test-full/newstest2014-deen-src.de.sgm": _sgm("src", "de", wrong),
                              "test-full/newstest2014-deen-ref.en.sgm": _sgm("ref", "en", wrong)}),
    }


@pytest.fixture(scope="module")
def archives() -> dict[str, bytes]:
    return fake_archives()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPINIT_DATA_ROOT", str(tmp_path / "root"))


def _tokenized_test(lang: str, segs: list[str]) -> list[str]:
    """The script's test pipeline, spelled out: ’ -> ', tokenizer -a (no normalization)."""
    return moses_tokenize([s.replace("’", "'") for s in segs], lang, aggressive_dash_splits=True)


# ---- the pieces ------------------------------------------------------------------------------


def test_moses_options_and_remove_non_printing():
    assert moses_tokenize(["a well-known fact"], "en") == ["a well-known fact"]  # default unchanged
    assert moses_tokenize(["a well-known fact"], "en", aggressive_dash_splits=True) == \
        ["a well @-@ known fact"]
    assert remove_non_printing(["a\tb\u200bc\u00a0d\ufeff", "plain"]) == ["a b c\u00a0d ", "plain"]


def test_learn_bpe_from_counts_equals_learn_bpe():
    lines = [" ".join(random.Random(i).choice(["lower", "lowest", "newer", "wider", "new", "low"])
                      for _ in range(6)) for i in range(200)]
    counts = Counter(w for line in lines for w in line.split())
    expected = learn_bpe(lines, 25).text
    assert learn_bpe_from_counts(counts, 25).text == expected
    assert learn_bpe_from_counts(counts, 25, repeat=3).text == expected  # however it is fed


# ---- the fairseq recipe from a --raw folder ---------------------------------------------------


def test_fairseq_recipe_from_raw_archives_then_train_2_updates(archives, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, data in archives.items():
        (raw / name).write_bytes(data)
    out = tmp_path / "wmt14"
    ticks, messages = [], []
    counts = prepare_wmt14(raw, out, bpe_merges=500, workers=2, chunk_lines=16,
                           progress=messages.append, tick=lambda *a: ticks.append(a))
    tmp = out / "tmp"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{s}.{lang}" for s in ("train", "valid", "test") for lang in ("en", "de")]
        + ["code", "prepare.json", "tmp"])
    # Unpacked next to the archives, as `deepinit data download` does (stamped with the hash).
    assert (raw / "training-parallel-commoncrawl" / "commoncrawl.de-en.de").is_file()
    assert dl.unpacked_from(raw / "test-full") == sha256(archives["test-full.tgz"])

    # 1. Training text: the three corpora in order, normalized, non-printing removed, tokenizer -a.
    tags = {lang: read_lines(tmp / f"train.tags.en-de.tok.{lang}") for lang in ("en", "de")}
    assert len(tags["en"]) == len(tags["de"]) == counts["train_tags_lines"] == 210
    assert "a state @-@ of @-@ the @-@ art car ." in " ".join(tags["en"])
    assert "ein hoch @-@ modernes Auto ." in " ".join(tags["de"])
    assert any(line.startswith("er sagt &quot; hallo &quot; heute") for line in tags["de"])
    assert not any("„" in line or "\u200b" in line for line in tags["de"])
    assert any(line.startswith("die grosse Hund ") for line in tags["de"])
    assert "\ufffd" in tags["en"][SIZES["europarl"] + 2].split()  # the byte: replaced, counted
    assert counts["not_utf8_lines"] == 1
    # 2. Test: newstest2014's <seg> lines in order, -src.en and -ref.de, not normalized.
    assert read_lines(tmp / "test.en") == _tokenized_test("en", TEST_EN)
    assert read_lines(tmp / "test.de") == _tokenized_test("de", TEST_DE)
    assert read_lines(tmp / "test.en")[1] == "It &apos;s a well @-@ known fact ."
    assert "„" in read_lines(tmp / "test.de")[1]
    # 3. Valid: every 100th tokenized training line; train: the rest.
    for lang in ("en", "de"):
        assert read_lines(tmp / f"valid.{lang}") == [tags[lang][99], tags[lang][199]]
        assert read_lines(tmp / f"train.{lang}") == [x for i, x in enumerate(tags[lang], 1) if i % 100]
    # 4./5. A joint BPE, applied to every split; train and valid cleaned after it.
    assert read_lines(out / "code")[0] == "#version: 0.2"
    assert counts["bpe"] == {"learner": "tokenizers", "merges": len(read_lines(out / "code")) - 1}
    assert counts["train_clean_dropped"] == 2 and counts["valid_clean_dropped"] == 0
    assert counts["train"] == 206 and counts["valid"] == 2 and counts["test"] == 3
    train_en = [remove_bpe(x) for x in read_lines(out / "train.en")]
    kept = [x for i, x in enumerate(tags["en"], 1) if i % 100 and i not in (OVER_LONG, RATIO)]
    assert train_en == kept  # exactly the over-long and the ratio-10 pair are gone
    assert [remove_bpe(x) for x in read_lines(out / "valid.de")] == read_lines(tmp / "valid.de")
    test_de = read_lines(out / "test.de")
    assert any("@@ " in x for x in test_de)  # the unseen long word is split
    assert [remove_bpe(x) for x in test_de] == read_lines(tmp / "test.de")
    assert not any("WRONG" in x for x in read_lines(out / "test.en") + test_de)
    # prepare.json: counts and the archives' hashes (computed: a --raw folder has no manifest).
    prep = json.loads((out / "prepare.json").read_text())
    assert prep["recipe"] == "fairseq" and prep["raw"] == str(raw) and prep["train"] == 206
    assert {r["file"]: r["sha256"] for r in prep["downloads"]} == {n: sha256(d) for n, d in archives.items()}
    assert not any(r["verified"] for r in prep["downloads"])  # not the real archives
    # Progress: one bar per stage, each ending complete.
    last = {stage: (done, total) for stage, done, total in ticks}
    assert last["tokenize train.en"] == (210, 210) and last["BPE train"] == (208, 208)

    # A second run (another BPE) reuses the tokenized training text.
    messages.clear()
    again = prepare_wmt14(raw, out, bpe_merges=40, workers=1, progress=messages.append)
    assert any("reusing the tokenized training text" in m for m in messages)
    assert again["train_tags_lines"] == 210 and again["bpe"]["merges"] == 40
    assert again["not_utf8_lines"] == 1  # remembered from the first run

    # The folder is what data=custom (and the paper presets, DEEPINIT_WMT14_DIR) read.
    prepare_wmt14(raw, out, bpe_merges=500, workers=1, **quiet)
    run_dir = tmp_path / "run"
    proc = run_cli_here(["train", "data=custom", f"data.dir={out}", "data.source_lang=en", "data.target_lang=de",
                         "data.bpe=none", "model=ci", "trainer.max_updates=2", "trainer.device=cpu",
                         "trainer.precision=fp32", "trainer.final_bleu=false", "trainer.valid_interval=0",
                         "trainer.save_interval=0", "trainer.keep_checkpoints=0", "trainer.log_interval=1",
                         "trainer.tensorboard=false", "trainer.progress=false", "warmup.updates=1",
                         f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] in ("ok", "diverged") and result["updates"] == 2  # finished


# ---- the admin recipe, downloaded from a local server -----------------------------------------


def test_admin_recipe_downloads_the_archives_first(archives, tmp_path, monkeypatch):
    server = FileServer()
    try:
        files = []
        for name, data in archives.items():
            server.files[f"/{name}"] = data
            files.append(RemoteFile(name, (f"http://example.invalid/{name}",), sha256(data), unpack=True))
        monkeypatch.setitem(dl.CORPORA, "wmt14-en-de",
                            RemoteCorpus("wmt14-en-de", tuple(files), about="test", manual="pass --raw"))
        monkeypatch.setenv(dl.MIRROR_ENV, server.url)
        out = tmp_path / "wmt14"
        assert main_data(["prepare", "wmt14-en-de", "--out", str(out), "--recipe", "admin",
                          "--bpe-merges", "300", "--bpe-learner", "subword-nmt", "--workers", "1",
                          "--no-progress"]) == 0
    finally:
        server.close()
    folder = tmp_path / "root" / "downloads" / "wmt14-en-de"
    assert (folder / "dev" / "dev" / "newstest2013.de").is_file()
    prep = json.loads((out / "prepare.json").read_text())
    assert prep["recipe"] == "admin" and prep["raw"] == str(folder)
    assert [(r["file"], r["url"], r["sha256"], r["verified"]) for r in prep["downloads"]] == \
        [(n, f"{server.url}/{n}", sha256(d), True) for n, d in archives.items()]
    # Cleaned before the BPE (1-80 tokens, ratio 9): the same two pairs go; valid = newstest2013.
    assert prep["clean_dropped"] == 2 and prep["train"] == 208 and prep["valid"] == 8
    tmp = out / "tmp"
    for lang in ("en", "de"):  # newstest2013 through the training text's pipeline
        dev = read_lines(folder / "dev" / "dev" / f"newstest2013.{lang}")
        expected = moses_tokenize(remove_non_printing(moses_normalize(dev, lang)), lang,
                                  aggressive_dash_splits=True)
        assert read_lines(tmp / f"valid.{lang}") == expected and len(expected) == 8
        assert [remove_bpe(x) for x in read_lines(out / f"valid.{lang}")] == expected
    assert read_lines(tmp / "test.en") == _tokenized_test("en", TEST_EN)
    assert len(read_lines(out / "train.de")) == 208
    # subword-nmt's learner, fed word counts, learns what learn_bpe.py learns on `cat train.en train.de`.
    text = (tmp / "train.en").read_text(encoding="utf-8") + (tmp / "train.de").read_text(encoding="utf-8")
    codes = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()):
        snmt_learn(io.StringIO(text), codes, 300)
    assert (out / "code").read_text(encoding="utf-8") == codes.getvalue()
    assert prep["bpe"] == {"learner": "subword-nmt", "merges": len(codes.getvalue().splitlines()) - 1}


def test_missing_archive_says_what_to_supply(archives, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "training-parallel-europarl-v7.tgz").write_bytes(archives["training-parallel-europarl-v7.tgz"])
    with pytest.raises(PrepareError, match=r"has neither training-parallel-commoncrawl\.tgz nor "
                                           r"training-parallel-commoncrawl/commoncrawl\.de-en\.en.*--raw PATH"):
        prepare_wmt14(raw, tmp_path / "out", workers=1, **quiet)
    with pytest.raises(PrepareError, match="not a folder"):
        prepare_wmt14(raw / "training-parallel-europarl-v7.tgz", tmp_path / "out", **quiet)
    with pytest.raises(PrepareError, match="--recipe"):
        prepare_wmt14(raw, tmp_path / "out", recipe="icml17", **quiet)
