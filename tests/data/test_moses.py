"""data.tokenize=moses: raw text is Moses-tokenized before the BPE, the tokenized BLEU is the
papers' (Moses-tokenized hypotheses vs Moses-tokenized references) and sacreBLEU scores the
detokenized hypotheses against the raw references. The expected scores are recomputed here with
sacremoses and sacrebleu directly, not through runner's helpers."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import sacrebleu
import torch
from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from runner.config import ConfigError, DataConfig
from runner.data import moses, prepare
from runner.data.corpus import load_translation_data
from runner.run.build import check_config
from runner.run.evaluate import evaluate_run
from runner.run.train import train
from tests.conftest import compose, run_cli

# --------------------------------------------------------------------------------------------
# A raw German-English corpus: sentences with punctuation, apostrophes, quotes, numbers.

SUBJECTS = [("der Mann", "the man"), ("die Frau", "the woman"), ("das Kind", "the child"),
            ("mein Freund", "my friend"), ("Peters Schwester", "Peter's sister"),
            ("die Lehrerin", "the teacher"), ("unser Nachbar", "our neighbour")]
VERBS = [("sieht", "sees", "see"), ("kauft", "buys", "buy"), ("liest", "reads", "read"),
         ("mag", "likes", "like"), ("sucht", "looks for", "look for")]
OBJECTS = [("das Buch", "the book"), ("ein Haus", "a house"), ("die Zeitung", "the newspaper"),
           ("das rote Auto", "the red car"), ("einen Brief", "a letter"),
           ("das alte Fahrrad", "the old bike")]
ADJECTIVES = [("gut", "good"), ("neu", "new"), ("teuer", "expensive"), ("klein", "small")]


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _pair(rng: random.Random) -> tuple[str, str]:
    (sd, se), (vd, ve, vb), (od, oe) = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)
    ad, ae = rng.choice(ADJECTIVES)
    n, euro = rng.randint(2, 9), rng.randint(3, 40)
    form = rng.randrange(7)
    if form == 0:
        return f"{_cap(sd)} {vd} {od}.", f"{_cap(se)} {ve} {oe}."
    if form == 1:
        return f"Sie sagte: „{_cap(sd)} {vd} {od}.“", f'She said: "{_cap(se)} {ve} {oe}."'
    if form == 2:
        return f"{_cap(sd)} {vd} {od} nicht.", f"{_cap(se)} doesn't {vb} {oe}."
    if form == 3:
        return f"{_cap(vd)} {sd} {od}?", f"Does {se} {vb} {oe}?"
    if form == 4:
        return (f"Ist {od} {ad}? Ja, es ist sehr {ad}!",
                f"Is {oe} {ae}? Yes, it's very {ae}!")
    if form == 5:
        return (f"{_cap(sd)} {vd} {n} Bücher für {euro},50 Euro (ca. 20 % mehr).",
                f"{_cap(se)} {ve} {n} books for {euro}.50 euros (about 20% more).")
    return (f"„{_cap(od)} ist {ad}“, meint {sd} – oder?",
            f'"{_cap(oe)} is {ae}," says {se} - isn\'t it?')


def write_raw_corpus(folder: Path, sizes=(("train", 600), ("valid", 30), ("test", 40))) -> None:
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        pairs = [_pair(rng) for _ in range(n)]
        for lang, side in (("de", 0), ("en", 1)):
            (folder / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs),
                                                   encoding="utf-8")


def raw_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def moses_by_hand(lines: list[str], lang: str) -> list[str]:
    """normalize-punctuation.perl | tokenizer.perl, with sacremoses directly."""
    norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tok.tokenize(norm.normalize(line), escape=True, return_str=True) for line in lines]


# --------------------------------------------------------------------------------------------
# A short training on the raw corpus, scored by deepinit eval

RUN = ["data=custom", "data.tokenize=moses", "data.bpe=tokenizers", "data.bpe_merges=200",
       "data.max_tokens=1024", "model=ci", "optim.lr=5e-3", "warmup.updates=10",
       "trainer.max_updates=150", "trainer.log_interval=10", "trainer.valid_interval=0",
       "trainer.save_interval=50", "trainer.tensorboard=false", "trainer.progress=false",
       "trainer.device=cpu"]


@pytest.fixture(scope="module")
def tokenized_run(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("rawtext")
    corpus = root / "corpus"
    write_raw_corpus(corpus)
    run = root / "run"
    cfg = compose(RUN + [f"data.dir={corpus}", f"data.cache_dir={root / 'cache'}"])
    assert train(cfg, run)["status"] == "ok"
    record = evaluate_run(run, split="test", beam=2, average_last=0, max_len_a=1.2, max_len_b=10,
                          echo=lambda *_: None)
    return corpus, run, record


def test_tokenized_bleu_is_bleu_on_moses_tokenized_text(tokenized_run):
    corpus, run, record = tokenized_run
    hyps = raw_lines(run / "eval" / "test.hyp")
    refs = moses_by_hand(raw_lines(corpus / "test.en"), "en")
    # the references the run scored are the Moses-tokenized raw references
    assert raw_lines(run / "eval" / "test.ref") == refs
    assert any("&quot;" in r for r in refs) and any("&apos;" in r for r in refs)
    assert len(hyps) == len(refs) == 40
    expected = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none",
                                     force=True).score
    assert record["bleu"] == pytest.approx(expected, abs=1e-9)
    assert record["bleu"] > 5.0  # a trained model, not an empty match


def test_sacrebleu_is_detokenized_hypotheses_against_raw_references(tokenized_run):
    corpus, run, record = tokenized_run
    raw = raw_lines(corpus / "test.en")
    detok = MosesDetokenizer(lang="en")
    hyps = [detok.detokenize(h.split(), unescape=True) for h in raw_lines(run / "eval" / "test.hyp")]
    bleu = sacrebleu.BLEU()  # the defaults: 13a tokenization, exp smoothing, mixed case
    assert record["sacrebleu"] == pytest.approx(bleu.corpus_score(hyps, [raw]).score, abs=1e-9)
    assert record["sacrebleu_signature"] == str(bleu.get_signature())
    assert "tok:13a" in record["sacrebleu_signature"]
    assert record["sacrebleu_references"] == "raw"
    # the files hold what was scored: the raw references, not detokenized tokens
    assert raw_lines(run / "eval" / "test.detok.ref") == raw
    assert raw_lines(run / "eval" / "test.detok.hyp") == hyps
    assert any("„" in line for line in raw_lines(corpus / "test.de"))  # normalized only for training


def test_cache_key_follows_tokenize_and_keeps_raw_references(tmp_path):
    write_raw_corpus(tmp_path / "corpus", sizes=(("train", 80), ("valid", 10), ("test", 10)))

    def cfg(tokenize):
        return DataConfig(name="custom", dir=str(tmp_path / "corpus"), bpe="tokenizers",
                          bpe_merges=50, tokenize=tokenize, cache_dir=str(tmp_path / "cache"))

    plain = load_translation_data(cfg("none"))
    built = load_translation_data(cfg("moses"))
    again = load_translation_data(cfg("moses"))
    assert plain.stats["cache"]["status"] == built.stats["cache"]["status"] == "built"
    assert again.stats["cache"]["status"] == "hit"
    assert plain.stats["cache"]["path"] != built.stats["cache"]["path"]
    raw = raw_lines(tmp_path / "corpus" / "test.en")
    assert built.raw_references["test"] == again.raw_references["test"] == raw
    assert built.references["test"] == again.references["test"] == moses_by_hand(raw, "en")
    assert plain.raw_references == {} and plain.references["test"] == raw
    assert built.src_dict.symbols == again.src_dict.symbols != plain.src_dict.symbols
    assert built.stats["tokenize"] == "moses"


# --------------------------------------------------------------------------------------------
# Tokenize -> detokenize

ROUND_TRIP = {
    "en": ['He said: "It\'s fine."', "The students' books aren't here, are they?",
           "Rock 'n' roll -- isn't it great?", "It costs $3.50, i.e. 20% more!",
           "We'll meet at 5 p.m. in New York.", 'She asked, "Why?" and left...',
           "Peter's dog didn't bark; the cat's did.", "Tom & Jerry, cats | dogs [sic]."],
    "de": ["Sie sagte: „Das ist gut.“", "Wir haben 1.000 Euro, oder?", "Geht es dir gut? Ja!",
           'Er fragte: "Kommst du mit?"', "Das kostet 3,50 Euro (ca. 20 % mehr)."],
}


@pytest.mark.parametrize("lang", sorted(ROUND_TRIP))
def test_tokenize_detokenize_round_trip(lang):
    lines = ROUND_TRIP[lang]
    tokens = moses.tokenize_raw(lines, lang)
    assert tokens == moses_by_hand(lines, lang)
    # escaped on the way in (Moses' default), unescaped on the way out
    assert all("'" not in t and '"' not in t and "|" not in t for t in tokens)
    assert moses.detokenize(tokens, lang) == moses.moses_normalize(lines, lang)


def test_round_trip_limits_are_moses_own():
    """What Moses detokenization cannot restore (documented in docs/data.md): spacing it must
    guess, and German rules, which split the apostrophe off on both sides."""
    assert moses.detokenize(moses.tokenize_raw(["mail info@example.com"], "en"), "en") == [
        "mail info @ example.com"]
    assert moses.detokenize(moses.tokenize_raw(["Geht's?"], "de"), "de") == ["Geht 's?"]
    assert moses.detokenize(moses.tokenize_raw(["3 € (ca.)"], "de"), "de") == ["3 €(ca.)"]


def test_prepare_uses_the_shared_helpers():
    assert prepare.moses_tokenize is moses.moses_tokenize
    assert prepare.moses_normalize is moses.moses_normalize


# --------------------------------------------------------------------------------------------
# Validation

@pytest.mark.parametrize("overrides, needle", [
    (["data=custom", "data.dir=x", "data.tokenize=spacy"],
     "data.tokenize='spacy': expected one of none, moses"),
    (["data=iwslt14", "data.tokenize=moses"], "data.tokenize=moses is for raw text"),
    (["data=toy", "data.tokenize=moses"], "data.tokenize=moses is for raw text"),
])
def test_bad_tokenize_is_one_line_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        check_config(compose(overrides))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_cli_bad_tokenize_exit_2(tmp_path):
    proc = run_cli(["train", "data=custom", f"data.dir={tmp_path}", "data.tokenize=spacy",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr + proc.stdout
    assert "data.tokenize" in proc.stderr and "none, moses" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_config_records_tokenize():
    cfg = compose(["data=custom", "data.dir=x", "data.tokenize=moses"])
    assert cfg.data.tokenize == "moses"
    assert compose(["data=custom", "data.dir=x"]).data.tokenize == "none"


def test_starting_deepinit_does_not_import_sacremoses():
    """sacremoses is imported where Moses text is tokenized or detokenized: at every start of
    `deepinit` (a run, a sweep cell, --help) importing it would add about 0.3 s."""
    import subprocess
    import sys

    code = ("import sys, runner.cli.train, runner.run.train, runner.decode.scoring, runner.data.prepare; "
            "print('sacremoses' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
