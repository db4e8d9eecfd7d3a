"""BLEU: the papers' tokenized BLEU must equal multi-bleu / fairseq BLEU-4, computed by hand."""
import math

import pytest

from runner.bleu import bleu_scores, detok_sacrebleu, remove_bpe, tokenized_bleu

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
