"""Subword segmentation in subword-nmt's format (`@@ ` marks a non-final piece).

Two ways in:
- `SubwordNmtCodes`: apply an existing subword-nmt codes file (e.g. fairseq's IWSLT'14 `code`)
  with the `subword-nmt` package itself, which reproduces fairseq's prepared text byte for byte.
- `learn_bpe`: learn merges with HuggingFace `tokenizers` and return them as subword-nmt codes
  (version 0.2, `</w>` on word-final symbols), so the same applier serves both.

Why the learner remaps word-final characters: `tokenizers`' BpeTrainer gives the `c</w>`
symbols ids in hash-map order, and merge ties are broken by id, so two runs on the same text can
learn different merges. Encoding "c at the end of a word" as one private-use character makes every
initial symbol a plain character, whose ids the trainer assigns in sorted order: the learned
merges are then the same on every run, and mean exactly what subword-nmt's `c</w>` merges mean.
"""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from subword_nmt.apply_bpe import BPE as _SubwordNmtBPE

BPE_SYMBOL = "@@ "  # what fairseq's --remove-bpe strips (subword-nmt's separator plus a space)
END_OF_WORD = "</w>"
CODES_HEADER = "#version: 0.2\n"  # the header subword-nmt >= 0.2 writes on its codes files
# Supplementary Private Use Area-A: 65,534 code points, never produced by tokenizers or Moses.
_PUA_START, _PUA_END = 0xF0000, 0xFFFFD


class BPEError(ValueError):
    """A codes file that cannot be used, or a BPE that cannot be learned."""


def _read_text(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        raise BPEError(f"BPE codes file not found: {path}") from None
    except UnicodeDecodeError as e:
        raise BPEError(f"BPE codes file {path} is not UTF-8 ({e.reason})") from None


class SubwordNmtCodes:
    """subword-nmt codes applied with subword-nmt's own `apply_bpe.BPE` (exact reproduction)."""

    def __init__(self, codes: str, source: str = "<codes>"):
        lines = codes.rstrip("\n").split("\n")
        if not lines or not lines[0].startswith("#version:"):
            # Version 0.1 codes mark the end of word differently; fairseq's are 0.2.
            raise BPEError(f"{source}: first line must be a '#version:' header, got {lines[0][:40]!r}"
                           if lines else f"{source}: empty codes file")
        for n, item in enumerate(lines[1:], start=2):
            if len(item.strip("\r\n ").split(" ")) != 2:
                raise BPEError(f"{source}:{n}: a merge line must be two symbols separated by "
                               f"one space, got {item[:60]!r}")
        if len(lines) < 2:
            raise BPEError(f"{source}: no merges after the '#version:' header")
        self.source = source
        self.text = codes if codes.endswith("\n") else codes + "\n"
        self.num_merges = len(lines) - 1
        self._bpe = _SubwordNmtBPE(io.StringIO(self.text), separator=BPE_SYMBOL.strip())

    @classmethod
    def from_file(cls, path: str | Path) -> "SubwordNmtCodes":
        path = Path(path)
        return cls(_read_text(path), source=str(path))

    @property
    def version(self) -> tuple[int, ...]:
        return self._bpe.version

    def apply_line(self, line: str) -> str:
        """One tokenized line to subwords; leading/trailing whitespace kept as subword-nmt does."""
        return self._bpe.process_line(line)

    def apply(self, lines: Iterable[str]) -> list[str]:
        return [self._bpe.process_line(line) for line in lines]

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.text, encoding="utf-8")


def remove_bpe(line: str, symbol: str = BPE_SYMBOL) -> str:
    """fairseq's `--remove-bpe` (post_process 'subword_nmt')."""
    return (line + " ").replace(symbol, "").rstrip()


def learn_bpe(lines: Iterable[str], num_merges: int, min_frequency: int = 2) -> SubwordNmtCodes:
    """Learn `num_merges` joint BPE merges with HuggingFace `tokenizers` from tokenized text
    (words are whitespace-separated). Deterministic; no network. `min_frequency=2` is
    subword-nmt's default stopping rule, so fewer merges are learned when pairs run out."""
    if num_merges < 1:
        raise BPEError(f"bpe_merges must be >= 1, got {num_merges}")
    lines = lines if isinstance(lines, list) else list(lines)
    finals: set[str] = set()
    chars: set[str] = set()
    for line in lines:
        for word in line.split():
            finals.add(word[-1])
            chars.update(word)
    to_pua, from_pua = _final_marks(finals, chars)

    def mark(line: str) -> str:
        return " ".join(w[:-1] + to_pua[w[-1]] for w in line.split())

    def marked() -> Iterator[str]:
        for line in lines:
            yield mark(line)

    # Initial symbols: characters seen before the end of a word plus the marked finals.
    initial = {c for line in lines for w in line.split() for c in w[:-1]} | set(to_pua.values())
    return _train_codes(marked(), len(lines), len(initial), from_pua, num_merges, min_frequency,
                        f"{len(lines)} training lines, so no BPE can be learned (use data.bpe=none)")


def learn_bpe_from_counts(counts: Mapping[str, int], num_merges: int, min_frequency: int = 2,
                          repeat: int = 1024) -> SubwordNmtCodes:
    """`learn_bpe` on a word-frequency table instead of the text: the same merges (they depend
    only on how often each word occurs), without holding millions of lines (WMT'14). Each word
    is marked once; the trainer gets it `count` times, at most `repeat` copies per string."""
    if num_merges < 1:
        raise BPEError(f"bpe_merges must be >= 1, got {num_merges}")
    words = [w for w, n in counts.items() if w and n > 0]
    chars: set[str] = set()
    for w in words:
        chars.update(w)
    to_pua, from_pua = _final_marks({w[-1] for w in words}, chars)
    initial = {c for w in words for c in w[:-1]} | set(to_pua.values())

    def repeated() -> Iterator[str]:
        for w in words:
            marked, n = w[:-1] + to_pua[w[-1]] + " ", counts[w]
            while n > 0:
                k = min(n, repeat)
                yield marked * k
                n -= k

    return _train_codes(repeated(), None, len(initial), from_pua, num_merges, min_frequency,
                        f"{len(words)} distinct training words, so no BPE can be learned")


def _final_marks(finals: set[str], chars: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Word-final characters to private-use stand-ins (so the trainer learns end-of-word merges)
    and back to subword-nmt's "c</w>"; rejects text that already uses those code points."""
    clash = [c for c in chars if _PUA_START <= ord(c) <= _PUA_END]
    if clash:
        raise BPEError(f"text contains private-use characters (e.g. U+{ord(clash[0]):05X}) "
                       "that the BPE learner reserves")
    if len(finals) > _PUA_END - _PUA_START + 1:
        raise BPEError("too many distinct word-final characters for the BPE learner")
    to_pua = {c: chr(_PUA_START + i) for i, c in enumerate(sorted(finals))}
    return to_pua, {p: c + END_OF_WORD for c, p in to_pua.items()}


def _train_codes(texts: Iterator[str], length: int | None, initial: int, from_pua: Mapping[str, str],
                 num_merges: int, min_frequency: int, empty: str) -> SubwordNmtCodes:
    """Learn merges with the tokenizers trainer on marked text; subword-nmt codes of the first
    `num_merges`. `empty` ends the error when no pair is frequent enough."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: PLC0415 (+1.4 s at import; only learning a BPE needs it)

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=initial + num_merges, min_frequency=min_frequency,
                                  show_progress=False, special_tokens=[])
    tokenizer.train_from_iterator(texts, trainer, length=length)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]

    def unmark(symbol: str) -> str:
        return symbol[:-1] + from_pua[symbol[-1]] if symbol and symbol[-1] in from_pua else symbol

    if not merges:
        raise BPEError(f"no symbol pair occurs {min_frequency} or more times in the {empty}")
    out = [CODES_HEADER]
    for merge in merges[:num_merges]:
        a, b = merge if isinstance(merge, list) else merge.split(" ")
        out.append(f"{unmark(a)} {unmark(b)}\n")
    return SubwordNmtCodes("".join(out), source=f"<learned {len(out) - 1} merges>")
