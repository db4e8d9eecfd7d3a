"""BLEU: the papers' tokenized BLEU must equal multi-bleu / fairseq BLEU-4, computed by hand."""
import math

import pytest

from runner.decode.scoring import bleu_scores, detok_sacrebleu, detokenize, remove_bpe, tokenized_bleu

HYPS = ["the cat sat on the mat", "a dog runs"]
REFS = ["the cat sat on a mat .", "the dog runs fast"]


def test_tokenized_bleu_equals_hand_computed_multi_bleu():
    # Clipped n-gram matches / hypothesis n-grams, summed over both sentences:
    #   1-grams: sent1 the(clipped to 1) cat sat on mat = 5/6, sent2 dog runs = 2/3   -> 7/9
    #   2-grams: "the cat" "cat sat" "sat on" = 3/5, "dog runs" = 1/2                 -> 4/7
    #   3-grams: "the cat sat" "cat sat on" = 2/4, none of 1                           -> 2/5
    #   4-grams: "the cat sat on" = 1/3, sentence 2 has no 4-gram                      -> 1/3
    # Brevity penalty: hypothesis length c = 9, reference length r = 11 -> exp(1 - 11/9).
    expected = 100 * math.exp(1 - 11 / 9) * (7 / 9 * 4 / 7 * 2 / 5 * 1 / 3) ** 0.25
    assert expected == pytest.approx(39.51, abs=0.01)
    assert tokenized_bleu(HYPS, REFS) == pytest.approx(expected, abs=1e-9)


def test_zero_precision_gives_zero_like_multi_bleu():
    # No 4-gram matches anywhere: multi-bleu/fairseq give 0 (no smoothing); sacrebleu's default
    # 'exp' smoothing would give a positive score.
    assert tokenized_bleu(["a b c d e"], ["a b c x e"]) == 0.0


def test_no_brevity_penalty_when_longer_and_perfect_match():
    assert tokenized_bleu(["a b c d", "e f g h"], ["a b c d", "e f g h"]) == pytest.approx(100.0)


def test_tokens_are_not_retokenized():
    # With tokenize='none', "mat." is one token and does not match "mat ."
    assert tokenized_bleu(["the cat sat on the mat."], ["the cat sat on the mat ."]) < \
        tokenized_bleu(["the cat sat on the mat ."], ["the cat sat on the mat ."])


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        tokenized_bleu(["a", "b"], ["a"])


def test_detok_sacrebleu_detokenizes_and_signs():
    hyps = ["it &apos;s a &quot; test &quot; ."]
    refs = ["it &apos;s a &quot; test &quot; ."]
    score, sig = detok_sacrebleu(hyps, refs, "en")
    assert score == pytest.approx(100.0)
    assert "tok:13a" in sig and "nrefs:1" in sig
    # Detokenized differently from the reference -> below 100.
    low, _ = detok_sacrebleu(["it s a test ."], refs, "en")
    assert low < 100.0
    both = bleu_scores(HYPS, REFS, "en")
    assert both["bleu_tokenized"] == pytest.approx(tokenized_bleu(HYPS, REFS))
    assert set(both) == {"bleu_tokenized", "sacrebleu_detok", "sacrebleu_signature"}


def test_remove_bpe_matches_fairseq():
    assert remove_bpe("pyrami@@ de is a wor@@ d") == "pyramide is a word"
    # fairseq appends a space first, so a dangling final marker is removed too.
    assert remove_bpe("end@@") == "end"
    assert remove_bpe("a@@b c") == "a@@b c"


def _multi_bleu(hyps, refs):
    """multi-bleu.perl / fairseq's BLEU-4 written out independently: clipped n-gram counts summed
    over the corpus, geometric mean of the four precisions, BP = min(1, exp(1 - r/c))."""
    from collections import Counter

    match, total = [0] * 4, [0] * 4
    c = r = 0
    for h, ref in zip(hyps, refs):
        h, ref = h.split(), ref.split()
        c, r = c + len(h), r + len(ref)
        for n in range(1, 5):
            hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rc = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
            match[n - 1] += sum(min(k, rc[g]) for g, k in hc.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    if min(match) == 0:
        return 0.0
    logp = sum(math.log(m / t) for m, t in zip(match, total)) / 4
    return 100 * min(1.0, math.exp(1 - r / c)) * math.exp(logp)


def test_tokenized_bleu_matches_multi_bleu_on_random_corpora():
    import random

    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(12)] + [",", ".", "&apos;s"]
    for _ in range(20):
        refs = [" ".join(rng.choices(vocab, k=rng.randint(1, 25))) for _ in range(30)]
        hyps = []
        for ref in refs:  # noisy copies: substitutions, deletions, insertions
            words = [w for w in ref.split() if rng.random() > 0.15]
            words = [rng.choice(vocab) if rng.random() < 0.2 else w for w in words]
            words += rng.choices(vocab, k=rng.randint(0, 3))
            hyps.append(" ".join(words))
        expected = _multi_bleu(hyps, refs)
        assert 10 < expected < 90  # a realistic range, not a degenerate 0 or 100
        assert tokenized_bleu(hyps, refs) == pytest.approx(expected, abs=1e-9)


# --------------------------------------------------------------------------------------------
# sacreBLEU's case: case:lc on lowercased references, case:mixed on cased ones

# Multi30k-style tokenized, lowercased text (tok/*.lc.norm.tok.en) and a cased counterpart.
LC_REFS = ["a man in an orange hat starring at something .", "a boston terrier is running on "
           "lush green grass in front of a white fence .", "two young , white males are outside "
           "near many bushes .", "a girl &apos;s \" über \" dress , isn &apos;t it ?"]
LC_HYPS = ["a man in an orange hat looks at something .", "a terrier runs on the green grass "
           "in front of a white fence .", "two young men are outside near bushes .",
           "a girl &apos;s \" über \" dress , isn &apos;t it ?"]


def test_is_lowercased():
    from runner.decode.scoring import is_lowercased

    assert is_lowercased(LC_REFS) and is_lowercased(["ä ö ü", "1 2 3"])
    assert not is_lowercased(LC_REFS + ["A man ."]) and not is_lowercased(["Über"])
    assert not is_lowercased(["1 2 3", "中文"]) and not is_lowercased([])  # nothing has a case


def test_sacrebleu_on_lowercased_references_says_case_lc_and_keeps_its_number():
    import sacrebleu

    score, signature = detok_sacrebleu(LC_HYPS, LC_REFS, "en")
    assert "|case:lc|" in signature and "case:mixed" not in signature
    # the claim that lets the committed records keep their numbers: on text that is lowercase
    # already, sacreBLEU's lowercase=True gives exactly the case-sensitive score
    hyps, refs = detokenize(LC_HYPS, "en"), detokenize(LC_REFS, "en")
    mixed = sacrebleu.BLEU().corpus_score(hyps, [refs]).score
    lc = sacrebleu.BLEU(lowercase=True).corpus_score(hyps, [refs]).score
    assert 20 < mixed < 90 and lc == mixed == score
    for h, r in zip(hyps, refs):  # sentence by sentence too
        assert (sacrebleu.BLEU(lowercase=True).sentence_score(h, [r]).score
                == sacrebleu.BLEU().sentence_score(h, [r]).score)
    # against the raw references of a tokenized-on-loading corpus: the same rule
    assert "|case:lc|" in detok_sacrebleu(LC_HYPS, LC_REFS, "en", raw_refs=refs)[1]


def test_sacrebleu_on_cased_references_stays_case_mixed():
    import sacrebleu

    refs = ["A man in an orange hat staring at something.", "Two young, White males are outside."]
    hyps = ["a man in an orange hat looks at something .", "two young white men are outside ."]
    score, signature = detok_sacrebleu(hyps, ["x"] * 2, "en", raw_refs=refs)
    assert "|case:mixed|" in signature
    assert score == sacrebleu.BLEU().corpus_score(detokenize(hyps, "en"), [refs]).score
    # asked for, a case-insensitive score on cased references says so
    lc, signature = detok_sacrebleu(hyps, ["x"] * 2, "en", raw_refs=refs, lowercase=True)
    assert "|case:lc|" in signature and lc > score


def test_a_records_signature_is_case_lc_when_its_corpus_is_lowercased():
    from runner.decode.signature import (
        data_settings,
        references_lowercased,
        sacrebleu_signature,
        signature_note,
        true_signature,
    )

    old = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    lc = "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0"
    assert true_signature(old, True) == lc and true_signature(old, False) == old
    assert true_signature(lc, True) == lc and true_signature(None, True) is None

    def signature(*overrides):
        return sacrebleu_signature({"overrides": list(overrides), "sacrebleu_signature": old})

    # Multi30k's tok/ files and IWSLT'14 are lowercased; so is any corpus with data.lowercase=true
    assert signature("+sweep=reproduce_table2_real", "method=admin", "trainer.seed=1") == lc
    assert signature("+sweep=reproduce_table2_iwslt14") == lc
    assert signature("data=iwslt14") == lc
    assert signature("data=custom", "data.tokenize=moses", "data.lowercase=true") == lc
    # cased corpora keep case:mixed: raw WMT'14, Multi30k's raw files read as they are
    assert signature("+sweep=reproduce_table2_wmt14") == old
    assert signature("data=multi30k", "data.tokenize=moses") == old
    assert signature("data=custom") == old
    assert data_settings(["+sweep=reproduce_table2_real"])["name"] == "multi30k"
    assert references_lowercased(data_settings(["data=multi30k", "data.lowercase=true",
                                                "data.tokenize=moses"]))
    assert sacrebleu_signature({"overrides": ["data=iwslt14"]}) is None
    assert signature_note([{"overrides": ["data=custom"]}]) is None
    assert lc in signature_note([{"overrides": ["data=iwslt14"], "sacrebleu_signature": old}])


def test_the_committed_records_signatures_read_case_lc():
    """Every committed real-tier record is Multi30k (tok/, lowercased): each signature it has
    reads case:lc."""
    import json
    from pathlib import Path

    from runner.decode.signature import sacrebleu_signature

    signed = 0
    for path in (Path(__file__).resolve().parents[2] / "results").glob("*/*/records.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("sacrebleu_signature"):
                assert "|case:lc|" in sacrebleu_signature(record), path
                signed += 1
    assert signed > 100


def test_a_report_gives_its_sacrebleu_columns_true_signature():
    """The table2 report rendered from the committed records says case:lc under its table, not
    the case:mixed its records.jsonl holds."""
    from runner.tables.plan import real_suite
    from runner.tables.report import render
    from runner.tables.targets import TARGETS

    target = TARGETS["table2"]
    real = real_suite(target)
    page = render("table2", target.title, real.part.preset, real.cells)
    line, = [line for line in page.splitlines() if line.startswith("sacreBLEU: ")]
    assert "lowercased references" in line and "|case:lc|" in line and "case:mixed" not in page
