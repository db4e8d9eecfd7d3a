"""Moses tokenization and detokenization through sacremoses, in one place.

Used by `deepinit data prepare` (fairseq's prepare-iwslt14.sh and prepare-wmt14en2de.sh, and
Multi30k's task1-tokenize.sh),
by `data.tokenize=moses` (raw text tokenized when a corpus is loaded, before the BPE) and by the
BLEU scorer (hypotheses detokenized for sacreBLEU).

Escaping: the tokenizer keeps Moses' default, XML escaping (`'` -> `&apos;`, `"` -> `&quot;`,
`&` -> `&amp;`, `|` `<` `>` `[` `]` likewise), as tokenizer.perl does by default and as fairseq's
prepared IWSLT'14 text has it; `detokenize` always unescapes, so the two are each other's
inverse on these characters. Tokenized BLEU does not depend on the choice (escaping renames
tokens one to one: same n-gram matches, same lengths); the detokenized text does not either.
"""
from __future__ import annotations

import unicodedata
from importlib.metadata import version
from typing import Iterable

# data.tokenize values: none (the text is used as it is) | moses (punctuation normalization and
# the Moses tokenizer, language by language, before the BPE).
TOKENIZERS = ("none", "moses")


def sacremoses_version() -> str:
    """Part of the data cache key: another sacremoses may tokenize differently."""
    return version("sacremoses")


def moses_tokenize(lines: Iterable[str], lang: str, aggressive_dash_splits: bool = False) -> list[str]:
    """tokenizer.perl -l LANG: XML-escaped output (&apos; &quot; ...), no aggressive hyphen
    splitting unless `aggressive_dash_splits` (tokenizer.perl -a: `well-known` becomes
    `well @-@ known`); whitespace-only lines pass through unchanged as in the perl script."""
    from sacremoses import MosesTokenizer  # noqa: PLC0415 (+0.3 s at import; only Moses text needs it)

    tok = MosesTokenizer(lang=lang)
    return [line if not line.strip() else tok.tokenize(line, aggressive_dash_splits=aggressive_dash_splits,
                                                       escape=True, return_str=True)
            for line in lines]


def moses_normalize(lines: Iterable[str], lang: str) -> list[str]:
    """normalize-punctuation.perl -l LANG (quotes, dashes, spaces around punctuation)."""
    from sacremoses import MosesPunctNormalizer  # noqa: PLC0415 (see above)

    norm = MosesPunctNormalizer(lang=lang)
    return [norm.normalize(line) for line in lines]


def remove_non_printing(lines: Iterable[str]) -> list[str]:
    """remove-non-printing-char.perl: every character of Unicode category C (control, format,
    surrogate, private use, unassigned) becomes a space. Lines that are all printable (nearly
    all) are passed through without looking at each character."""
    return [line if line.isprintable() else
            "".join(" " if unicodedata.category(c)[0] == "C" else c for c in line)
            for line in lines]


def tokenize_raw(lines: Iterable[str], lang: str) -> list[str]:
    """data.tokenize=moses: raw text to Moses tokens, the WMT pipeline
    `normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG`."""
    return moses_tokenize(moses_normalize(lines, lang), lang)


def detokenize(lines: Iterable[str], lang: str) -> list[str]:
    """detokenizer.perl -l LANG on each line, XML entities unescaped. Moses detokenization is
    not an exact inverse: a few spacings are guessed (docs/data.md)."""
    from sacremoses import MosesDetokenizer  # noqa: PLC0415 (see above)

    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split(), unescape=True) for line in lines]
