"""The two BLEU scores deepinit reports, labelled so they are never confused.

- `tokenized_bleu`: the papers' number (what `fairseq-generate --remove-bpe` prints): corpus
  BLEU-4 on the tokenized, lowercased text with BPE removed, as multi-bleu.perl and fairseq's
  internal scorer compute it: no tokenization, no smoothing (a zero n-gram precision gives 0),
  brevity penalty exp(1 - r/c).
- `detok_sacrebleu`: hypotheses detokenized with sacremoses, then standard sacreBLEU (13a
  tokenization) against the raw references when the corpus was tokenized on loading
  (data.tokenize=moses), else against the references detokenized the same way; comes with its
  signature. When those references are lowercased (IWSLT'14, Multi30k's tok/ files,
  data.lowercase=true), sacreBLEU lowercases too (lowercase=True), so the signature says
  `case:lc`: the score is case-insensitive, as it always was on such text.

Records scored before sacreBLEU lowercased on lowercased references say `case:mixed` for a
score that is case-insensitive all the same: runner/decode/signature.py gives their signature as
it is written now.
"""
from __future__ import annotations

from typing import Sequence

from sacrebleu.metrics import BLEU

from runner.data.moses import detokenize
from runner.data.subword import BPE_SYMBOL, remove_bpe

__all__ = ["tokenized_bleu", "detok_sacrebleu", "bleu_scores", "detokenize", "remove_bpe",
           "BPE_SYMBOL", "is_lowercased"]

CASE_MIXED, CASE_LC = "case:mixed", "case:lc"


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


def is_lowercased(lines: Sequence[str]) -> bool:
    """Whether text has been lowercased: it has letters that have a case, and none of them is
    upper case (str.lower changes nothing). Text in a script without case (Chinese, say) is not
    "lowercased": sacreBLEU keeps case:mixed there."""
    cased = False
    for line in lines:
        if line != line.lower():
            return False
        cased = cased or line != line.upper()
    return cased


def detok_sacrebleu(hyps: Sequence[str], refs: Sequence[str], lang: str,
                    raw_refs: Sequence[str] | None = None,
                    lowercase: bool | None = None) -> tuple[float, str]:
    """Detokenize the hypotheses (Moses rules for `lang`, XML entities unescaped) then score
    them with sacreBLEU's defaults against `raw_refs`, the untokenized references, when given
    (data.tokenize=moses), else against `refs` detokenized the same way. Returns (score,
    signature). `lowercase` None: sacreBLEU lowercases (signature case:lc) when the references
    it scores against are lowercased (IWSLT'14, Multi30k tok, data.lowercase=true), and scores
    case-sensitively (case:mixed) otherwise."""
    _check(hyps, refs)
    if raw_refs is not None:
        _check(hyps, raw_refs)
    references = list(raw_refs) if raw_refs is not None else detokenize(refs, lang)
    bleu = BLEU(lowercase=is_lowercased(references) if lowercase is None else lowercase)
    score = bleu.corpus_score(detokenize(hyps, lang), [references])
    return float(score.score), str(bleu.get_signature())


def bleu_scores(hyps: Sequence[str], refs: Sequence[str], lang: str,
                raw_refs: Sequence[str] | None = None) -> dict[str, object]:
    """Both scores as result.json fields: tokenized BLEU of `hyps` against `refs` (both
    tokenized), sacreBLEU of the detokenized `hyps` against `raw_refs` (else `refs`
    detokenized)."""
    detok, signature = detok_sacrebleu(hyps, refs, lang, raw_refs)
    return {"bleu_tokenized": tokenized_bleu(hyps, refs), "sacrebleu_detok": detok,
            "sacrebleu_signature": signature}
