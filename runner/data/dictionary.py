"""Token <-> id mapping in fairseq's layout (bos=0, pad=1, eos=2, unk=3) and dict.txt format."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable

BOS, PAD, EOS, UNK = "<s>", "<pad>", "</s>", "<unk>"


class Dictionary:
    def __init__(self, symbols: Iterable[str] = (), counts: Iterable[int] | None = None):
        self.symbols: list[str] = [BOS, PAD, EOS, UNK]
        self.counts: list[int] = [1, 1, 1, 1]
        self._index: dict[str, int] = {s: i for i, s in enumerate(self.symbols)}
        counts = list(counts) if counts is not None else None
        for i, symbol in enumerate(symbols):
            self.add(symbol, counts[i] if counts is not None else 1)

    bos_index, pad_index, eos_index, unk_index = 0, 1, 2, 3

    def add(self, symbol: str, count: int = 1) -> int:
        if symbol in self._index:
            idx = self._index[symbol]
            self.counts[idx] += count
            return idx
        self._index[symbol] = len(self.symbols)
        self.symbols.append(symbol)
        self.counts.append(count)
        return self._index[symbol]

    def __len__(self) -> int:
        return len(self.symbols)

    def __contains__(self, symbol: str) -> bool:
        return symbol in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dictionary) and self.symbols == other.symbols

    def index(self, symbol: str) -> int:
        return self._index.get(symbol, self.unk_index)

    def encode_line(self, line: str, append_eos: bool = True) -> list[int]:
        ids = [self.index(tok) for tok in line.split()]
        if append_eos:
            ids.append(self.eos_index)
        return ids

    def string(self, ids: Iterable[int], bpe_symbol: str | None = None) -> str:
        """Ids to text, stopping at eos and skipping bos/pad; `bpe_symbol="@@ "` removes BPE."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.eos_index:
                break
            if i in (self.bos_index, self.pad_index):
                continue
            words.append(self.symbols[i])
        text = " ".join(words)
        if bpe_symbol:
            text = (text + " ").replace(bpe_symbol, "").rstrip()
        return text

    def pad_to_multiple(self, multiple: int) -> None:
        """fairseq pads the vocabulary to a multiple of 8 (padding_factor) for fast matmuls."""
        i = 0
        while len(self) % multiple:
            self.add(f"madeupword{i:04d}", 0)
            i += 1

    @classmethod
    def build(cls, sentences: Iterable[Iterable[str]], min_count: int = 1,
              padding_factor: int = 8) -> "Dictionary":
        """Symbols sorted by descending count, then alphabetically (fairseq's finalize order)."""
        counter: Counter[str] = Counter()
        for tokens in sentences:
            counter.update(tokens)
        ordered = sorted(((c, s) for s, c in counter.items() if c >= min_count),
                         key=lambda cs: (-cs[0], cs[1]))
        d = cls([s for _, s in ordered], [c for c, _ in ordered])
        if padding_factor > 1:
            d.pad_to_multiple(padding_factor)
        return d

    def save(self, path: str | Path) -> None:
        """fairseq dict.txt: one `symbol count` line per symbol after the 4 specials."""
        lines = [f"{s} {c}\n" for s, c in zip(self.symbols[4:], self.counts[4:])]
        Path(path).write_text("".join(lines), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "Dictionary":
        symbols, counts = [], []
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            symbol, count = line.rsplit(" ", 1)
            symbols.append(symbol)
            counts.append(int(count))
        return cls(symbols, counts)
