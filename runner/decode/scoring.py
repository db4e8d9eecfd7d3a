"""The two BLEU scores deepinit reports, labelled so they are never confused.

- `tokenized_bleu`: the papers' number (what `fairseq-generate --remove-bpe` prints): corpus
  BLEU-4 on the tokenized, lowercased text with BPE removed, as multi-bleu.perl and fairseq's
  internal scorer compute it: no tokenization, no smoothing (a zero n-gram precision gives 0),
  brevity penalty exp(1 - r/c).
- `detok_sacrebleu`: hypotheses and references detokenized with sacremoses, then standard
  sacreBLEU (13a tokenization); comes with its signature.
"""
from __future__ import annotations

from typing import Sequence

from sacrebleu.metrics import BLEU
from sacremoses import MosesDetokenizer

from runner.data.subword import BPE_SYMBOL, remove_bpe

__all__ = ["tokenized_bleu", "detok_sacrebleu", "bleu_scores", "remove_bpe", "BPE_SYMBOL"]


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    for name, lines in (("hypothesis", hyps), ("reference", refs)):
        for i, line in enumerate(lines):
            if "\n" in line:
                raise ValueError(f"{name} {i + 1} contains a newline")


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus BLEU-4 in 0..100 on already tokenized text (one reference per hypothesis)."""
    _check(hyps, refs)
    # smooth_method='none': multi-bleu and fairseq's scorer give 0 when any precision is 0
    # (sacrebleu's default 'exp' smoothing would not).
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    return float(bleu.corpus_score(list(hyps), [list(refs)]).score)


def detokenize(lines: Sequence[str], lang: str) -> list[str]:
    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split(), unescape=True) for line in lines]


def detok_sacrebleu(hyps: Sequence[str], refs: Sequence[str], lang: str) -> tuple[float, str]:
    """Detokenize (Moses rules for `lang`, XML entities unescaped) then score with sacreBLEU's
    defaults. Returns (score, signature). When the references were lowercased (IWSLT'14,
    Multi30k tok), the score is on lowercased text; the signature still says case:mixed because
    sacreBLEU did not lowercase anything itself."""
    _check(hyps, refs)
    bleu = BLEU()
    score = bleu.corpus_score(detokenize(hyps, lang), [detokenize(refs, lang)])
    return float(score.score), str(bleu.get_signature())


def bleu_scores(hyps: Sequence[str], refs: Sequence[str], lang: str) -> dict[str, object]:
    """Both scores as result.json fields."""
    detok, signature = detok_sacrebleu(hyps, refs, lang)
    return {"bleu_tokenized": tokenized_bleu(hyps, refs), "sacrebleu_detok": detok,
            "sacrebleu_signature": signature}
