"""Language-model corpora: one stream of token ids per split, read as fixed-length blocks.

`data=shakespeare_char` is nanoGPT's character-level corpus (karpathy/nanoGPT
data/shakespeare_char/prepare.py): the vocabulary is the sorted set of characters of the whole
text, the first 90% of the characters train and the last 10% validate.

`data=text` is any folder of plain-text files (`*.txt`, searched recursively, read in sorted
path order): the first 90% of their lines train and the last 10% validate, and a byte-level BPE
(HuggingFace `tokenizers`: 256 byte symbols plus data.bpe_merges merges) learned on the
training lines encodes both. Byte-level pieces round-trip any text exactly, spaces and newlines
included, so a sample decodes to the characters the model chose.

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


class BPEVocab:
    """A byte-level BPE (HuggingFace `tokenizers`): text <-> ids, saved as the tokenizer's JSON."""

    def __init__(self, tokenizer_json: str):
        from tokenizers import Tokenizer  # noqa: PLC0415 (+1.4 s at import; only data=text needs it)

        self.json = tokenizer_json
        self.tokenizer = Tokenizer.from_str(tokenizer_json)

    @classmethod
    def learn(cls, lines: list[str], merges: int) -> "BPEVocab":
        """256 byte symbols plus up to `merges` merges learned on `lines` (fewer when the text has
        no more pairs to merge). Deterministic: every initial symbol is a byte character, which
        the trainer numbers in sorted order, so ties between merges break the same way on every
        run (runner/data/subword.py says why that matters)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + merges, min_frequency=2,
                                      initial_alphabet=alphabet, show_progress=False, special_tokens=[])
        tokenizer.train_from_iterator(lines, trainer=trainer, length=len(lines))
        return cls(tokenizer.to_str())

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)

    def encode_lines(self, lines: list[str]) -> np.ndarray:
        """The ids of the lines' concatenation (each line keeps its newline), in one pass."""
        parts = [np.asarray(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch(lines)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])


@dataclass
class LMData:
    """Everything an LM run needs from a corpus: one id stream per split and the vocabulary."""

    vocab: CharVocab | BPEVocab
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


def text_files(data_dir: Optional[str]) -> list[Path]:
    """The `*.txt` files under data.dir, in sorted path order; a one-line CorpusError naming the
    key and the folder when there is no such folder or no such file."""
    if not data_dir:
        raise CorpusError("data=text needs data.dir=DIR: a folder of plain-text .txt files")
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise CorpusError(f"data.dir={data_dir}: no such folder (data=text expects a folder of .txt files)")
    files = sorted(p for p in folder.rglob("*.txt") if p.is_file())
    if not files:
        anything = any(folder.iterdir())
        raise CorpusError(f"data.dir={data_dir}: {'no .txt files' if anything else 'the folder is empty'} "
                          "(data=text reads the *.txt files under it)")
    return files


def load_text(data_cfg) -> LMData:
    """data=text: the lines of every .txt file under data.dir (sorted path order), the first
    TRAIN_FRACTION of them for training and the rest for validation, encoded with a byte-level
    BPE of data.bpe_merges merges learned on the training lines."""
    files = text_files(data_cfg.dir)
    lines: list[str] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{path}: not UTF-8 text (byte {exc.start}); data=text reads UTF-8 .txt files")
        if text and not text.endswith("\n"):
            text += "\n"  # the next file starts on a line of its own
        lines += text.splitlines(keepends=True)
    cut = int(len(lines) * TRAIN_FRACTION)
    train_lines, valid_lines = lines[:cut], lines[cut:]
    block = data_cfg.block_size
    if data_cfg.bpe_merges < 0:
        raise CorpusError(f"data.bpe_merges={data_cfg.bpe_merges}: expected a number of merges >= 0")
    if not any(line.strip() for line in train_lines) or not valid_lines:
        raise CorpusError(f"data.dir={data_cfg.dir}: {len(lines)} line(s) of text; data=text needs at least "
                          "2 lines with text to train on (the first 90% train, the last 10% validate)")
    vocab = BPEVocab.learn(train_lines, data_cfg.bpe_merges)
    train, valid = vocab.encode_lines(train_lines), vocab.encode_lines(valid_lines)
    for split, ids in (("training", train), ("validation", valid)):
        if len(ids) < block + 1:
            raise CorpusError(f"data.dir={data_cfg.dir}: the {split} text is {len(ids)} tokens, shorter than "
                              f"data.block_size + 1 = {block + 1}; add text or lower data.block_size")
    stats = {"corpus": str(Path(data_cfg.dir).expanduser()), "files": len(files), "lines": len(lines),
             "train_lines": len(train_lines), "valid_lines": len(valid_lines),
             "characters": sum(len(line) for line in lines), "vocab": len(vocab),
             "train_tokens": len(train), "valid_tokens": len(valid)}
    return LMData(vocab, {data_cfg.train_split: train, data_cfg.valid_split: valid}, stats, unit="token")


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


def bits_key(unit: str) -> str:
    """The name of the NLL in bits in records and result.json: bits per character ("bpc") where a
    token is a character, bits per token ("bpt") otherwise."""
    return "bpc" if unit == "character" else "bpt"


def bits_per_token(nll_nats: float) -> float:
    return nll_nats / math.log(2.0)
