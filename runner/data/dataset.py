"""Tokenized parallel data held as flat id arrays plus offsets (cheap to cache and to index)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from runner.data.dictionary import Dictionary


@dataclass
class TokenizedSplit:
    """One split: sentence i's source ids are src_tokens[src_offsets[i]:src_offsets[i+1]]
    (each sentence ends with eos)."""

    src_tokens: np.ndarray
    src_offsets: np.ndarray
    tgt_tokens: np.ndarray
    tgt_offsets: np.ndarray

    @classmethod
    def from_lists(cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> "TokenizedSplit":
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source sentences but {len(tgt)} target sentences")

        def flatten(seqs):
            lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
            offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            flat = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
            return flat, offsets

        s, so = flatten(src)
        t, to = flatten(tgt)
        return cls(s, so, t, to)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def source(self, i: int) -> np.ndarray:
        return self.src_tokens[self.src_offsets[i]:self.src_offsets[i + 1]]

    def target(self, i: int) -> np.ndarray:
        return self.tgt_tokens[self.tgt_offsets[i]:self.tgt_offsets[i + 1]]

    def subset(self, indices: np.ndarray) -> "TokenizedSplit":
        return TokenizedSplit.from_lists([self.source(i) for i in indices],
                                         [self.target(i) for i in indices])

    def arrays(self) -> dict[str, np.ndarray]:
        return {"src_tokens": self.src_tokens, "src_offsets": self.src_offsets,
                "tgt_tokens": self.tgt_tokens, "tgt_offsets": self.tgt_offsets}


def unigram_nll(train: TokenizedSplit, split: TokenizedSplit, vocab: int) -> float:
    """Per-token NLL of `split`'s targets (eos included) under the add-one unigram distribution
    of the training targets: what a model that ignores the source and the prefix reaches, the
    plateau a deep Post-LN model stalls on."""
    counts = np.bincount(train.tgt_tokens, minlength=vocab).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(-log_p[split.tgt_tokens].mean())


@dataclass
class TranslationData:
    """Everything training and evaluation need from a corpus."""

    src_dict: Dictionary
    tgt_dict: Dictionary
    splits: dict[str, TokenizedSplit]
    # Reference text per split as the papers score it (tokenized, BPE removed), when known.
    references: dict[str, list[str]] = field(default_factory=dict)
    # How to turn decoded subword text back into words (e.g. "@@ " for subword-nmt).
    bpe_symbol: str | None = None
    stats: dict[str, object] = field(default_factory=dict)
    # Per split, the target text as read (after data.lowercase) before data.tokenize=moses
    # tokenized it; sacreBLEU scores detokenized hypotheses against it. Empty when nothing was
    # tokenized (then `references` are the only reference text).
    raw_references: dict[str, list[str]] = field(default_factory=dict)

    @property
    def joined(self) -> bool:
        return self.src_dict is self.tgt_dict or self.src_dict == self.tgt_dict
