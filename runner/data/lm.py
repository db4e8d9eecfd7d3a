"""Language-model corpora: one stream of token ids per split, read as fixed-length blocks.

`data=shakespeare_char` is nanoGPT's character-level corpus (karpathy/nanoGPT
data/shakespeare_char/prepare.py): the vocabulary is the sorted set of characters of the whole
text, the first 90% of the characters train and the last 10% validate.

Training batches are `batch_size` blocks of `block_size + 1` consecutive tokens at offsets drawn
uniformly (nanoGPT train.py get_batch); the offsets of update u come from a generator seeded by
(seed, u), so a resumed run draws the batches an uninterrupted one draws. Validation reads the
whole split as consecutive non-overlapping blocks: every position of every block is scored once,
which estimates the same per-position average as nanoGPT's random blocks without sampling noise.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from runner.data.corpus import CorpusError, default_data_root

TRAIN_FRACTION = 0.9  # nanoGPT data/shakespeare_char/prepare.py: train_data = data[:int(n*0.9)]
# The corpus file as karpathy/char-rnn publishes it (data/tinyshakespeare/input.txt)
SHAKESPEARE_FILE = "input.txt"
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_FOLDER = "tinyshakespeare"  # under the data root, or under its downloads/ folder


@dataclass
class CharVocab:
    """Characters <-> ids: id i is the i-th character in sorted order (nanoGPT's stoi/itos)."""

    chars: str

    def __post_init__(self) -> None:
        self.index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def of(cls, text: str) -> "CharVocab":
        return cls("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise CorpusError(f"characters not in the vocabulary: {''.join(unknown)!r}")
        return np.fromiter((self.index[c] for c in text), dtype=np.int64, count=len(text))

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


@dataclass
class LMData:
    """Everything an LM run needs from a corpus: one id stream per split and the vocabulary."""

    vocab: CharVocab
    splits: dict[str, np.ndarray]  # split -> int64 ids
    stats: dict[str, Any] = field(default_factory=dict)
    unit: str = "character"  # what one token is, for bits per {unit}

    def __len__(self) -> int:
        return len(self.vocab)


def shakespeare_file(data_dir: Optional[str]) -> Path:
    """input.txt in data.dir, else DATA_ROOT/tinyshakespeare, else where `deepinit data download
    tinyshakespeare` puts it (DATA_ROOT/downloads/tinyshakespeare); a one-line CorpusError naming
    the places looked at when none has it."""
    if data_dir:
        folders = [Path(data_dir).expanduser()]
    else:
        root = default_data_root()
        folders = [root / SHAKESPEARE_FOLDER, root / "downloads" / SHAKESPEARE_FOLDER]
    for folder in folders:
        if (folder / SHAKESPEARE_FILE).is_file():
            return folder / SHAKESPEARE_FILE
    looked = " or ".join(str(f / SHAKESPEARE_FILE) for f in folders)
    raise CorpusError(f"data=shakespeare_char: no {looked}; run `deepinit data download "
                      "tinyshakespeare` or set data.dir to the folder holding input.txt")


def load_shakespeare_char(data_cfg) -> LMData:
    path = shakespeare_file(data_cfg.dir)
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise CorpusError(f"{path}: SHA-256 {digest[:12]}... is not tinyshakespeare's "
                          f"{SHAKESPEARE_SHA256[:12]}... (the file is changed or truncated)")
    text = raw.decode("utf-8")
    vocab = CharVocab.of(text)
    ids = vocab.encode(text)
    cut = int(len(ids) * TRAIN_FRACTION)
    splits = {data_cfg.train_split: ids[:cut], data_cfg.valid_split: ids[cut:]}
    stats = {"corpus": str(path), "sha256": digest, "characters": len(ids), "vocab": len(vocab),
             "train_tokens": cut, "valid_tokens": len(ids) - cut}
    return LMData(vocab, splits, stats)


def training_block_offsets(split_length: int, block_size: int, batch_size: int, seed: int,
                           update: int, stream: int = 0) -> np.ndarray:
    """The start offsets of update `update`'s blocks: uniform in [0, n - block - 1], a pure
    function of (seed, update, stream) so that resuming draws the same batches; `stream` tells
    apart the micro-batches and DDP ranks of one update."""
    high = split_length - block_size - 1
    if high <= 0:
        raise CorpusError(f"a training split of {split_length} tokens is shorter than "
                          f"data.block_size + 1 = {block_size + 1}")
    rng = np.random.default_rng([seed, update, stream])
    return rng.integers(0, high + 1, size=batch_size)


def blocks_at(ids: np.ndarray, offsets: np.ndarray, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each (B, block): targets are the inputs shifted by one token."""
    index = offsets[:, None] + np.arange(block_size + 1)[None, :]
    chunk = torch.from_numpy(ids[index])
    return chunk[:, :-1], chunk[:, 1:]


def training_batch(ids: np.ndarray, block_size: int, batch_size: int, seed: int,
                   update: int, stream: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return blocks_at(ids, training_block_offsets(len(ids), block_size, batch_size, seed, update, stream),
                     block_size)


def validation_batches(ids: np.ndarray, block_size: int, batch_size: int,
                       max_batches: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The split as consecutive non-overlapping blocks (the tail shorter than a block is left
    out), `batch_size` blocks per batch; `max_batches` > 0 keeps the first ones."""
    blocks = (len(ids) - 1) // block_size
    starts = np.arange(blocks) * block_size
    batches = [blocks_at(ids, starts[i:i + batch_size], block_size)
               for i in range(0, blocks, batch_size)]
    return batches[:max_batches] if max_batches else batches


def unigram_nll(train: np.ndarray, valid: np.ndarray, vocab: int) -> float:
    """Per-token NLL of `valid` under the add-one unigram distribution of `train` (the stall line)."""
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    return float(-np.log(counts / counts.sum())[valid].mean())


def bits_per_token(nll_nats: float) -> float:
    return nll_nats / math.log(2.0)
