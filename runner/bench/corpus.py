"""The bench's text: the peer's training stream (IWSLT'14 de-en BPE, or Zipf text without it) as a
data=custom folder, and the batches fairseq-generate decodes."""
from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path
from typing import Optional

import numpy as np

from runner.data.corpus import default_corpus_dir


def _read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _synthetic_text(seed: int = 1234) -> dict[str, tuple[list[str], list[str]]]:
    """Zipf(1) words over 8000 types per side, lognormal lengths with IWSLT'14's mean (~23
    BPE tokens), the target a word-by-word map of the source: a stand-in when the IWSLT text
    is absent (the sizes of the peer's training split and test set)."""
    rng = np.random.default_rng(seed)
    types = 8000
    p = 1.0 / np.arange(1, types + 1)
    p /= p.sum()
    mapping = rng.permutation(types)
    out = {}
    for split, n in (("train", 13533), ("test", 500)):
        lengths = np.clip(np.rint(rng.lognormal(2.95, 0.62, n)), 1, 175).astype(int)
        src, tgt = [], []
        for length in lengths:
            words = rng.choice(types, size=length, p=p)
            src.append(" ".join(f"s{w}" for w in words))
            tgt.append(" ".join(f"t{w}" for w in mapping[words]))
        out[split] = (src, tgt)
    return out


def _top_types(lines: list[str], n: int) -> set[str]:
    counts = Counter(tok for line in lines for tok in line.split())
    # the order Dictionary.build (and fairseq's finalize) ranks types in: count, then symbol
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {tok for tok, _ in ranked[:n]}


def iwslt_dir() -> Path:
    """The staged IWSLT'14 de-en BPE text under the data root ($DEEPINIT_DATA_ROOT)."""
    return default_corpus_dir("iwslt14")


def write_corpus(root: Path, vocab: Optional[int], source: Optional[Path] = None) -> Path:
    """A data=custom folder with the peer's stream: train = IWSLT'14 valid + test lines 501..,
    valid = test = test lines 1..500. vocab=N keeps the N-4 most frequent types per side and
    writes the rest as <unk> (fairseq-preprocess --nwordssrc/--nwordstgt N). `source` defaults
    to the staged IWSLT'14 folder under the data root; without it, synthetic text."""
    source = iwslt_dir() if source is None else source
    name = f"{'iwslt' if (source / 'valid.de.gz').is_file() else 'synthetic'}-{vocab or 'all'}"
    out = root / name
    if (out / ".done").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    if (source / "valid.de.gz").is_file():
        text = {}
        test = {lang: _read_gz(source / f"test.{lang}.gz") for lang in ("de", "en")}
        valid = {lang: _read_gz(source / f"valid.{lang}.gz") for lang in ("de", "en")}
        text["train"] = (valid["de"] + test["de"][500:], valid["en"] + test["en"][500:])
        text["test"] = (test["de"][:500], test["en"][:500])
    else:
        text = _synthetic_text()
    if vocab is not None:
        keep = [_top_types(text["train"][side], vocab - 4) for side in (0, 1)]
        text = {split: tuple([" ".join(t if t in keep[side] else "<unk>" for t in line.split())
                              for line in lines] for side, lines in enumerate(pair))
                for split, pair in text.items()}
    text["valid"] = text["test"]
    for split, (src, tgt) in text.items():
        (out / f"{split}.de").write_text("\n".join(src) + "\n", encoding="utf-8")
        (out / f"{split}.en").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    (out / ".done").write_text("")
    return out


def fairseq_generate_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                             max_sentences: int, multiple: int = 8) -> list[np.ndarray]:
    """The batches fairseq-generate decodes, so that the decoding benchmark does the peer's work.

    fairseq 0.12 orders sentences by source length (ties by target length), counts a
    sentence as max(source, target) tokens, and grows each batch while rows x its longest
    sentence <= max_tokens and rows <= max_sentences, committing sizes that are multiples of
    `multiple` (--required-batch-size-multiple, 8 by default); a tail that overflows on its own
    is cut off as a batch of its own (fairseq/data/data_utils_fast.pyx, batch_by_size_vec).
    Then it drops the last batch when its size is not such a multiple (data_utils.batch_by_size;
    fairseq issue #5036): on the peer's 500 test sentences the 4 longest are never decoded, and
    fairseq-generate reports 496 sentences."""
    order = np.argsort(tgt_lengths, kind="stable")
    order = order[np.argsort(src_lengths[order], kind="stable")]
    tokens = np.maximum(src_lengths, tgt_lengths)[order]
    ends = [0]  # ends[i]: where batch i ends (so far); ends[-1] belongs to the running batch
    start, batch_max, tail_max = 0, 0, 0
    for pos in range(len(order)):
        tail_max = max(tail_max, int(tokens[pos]))
        rows = pos + 1 - start
        longest = max(batch_max, tail_max)
        if rows > max_sentences or rows * longest > max_tokens:
            if tail_max * (pos + 1 - ends[-1]) > max_tokens:  # the tail alone is too big: cut it
                ends.append(pos)
                tail_max = int(tokens[pos])
            start = ends[-1]
            ends.append(ends[-1])  # a new batch opens at the committed end
            longest = tail_max
            commit = True
        else:
            commit = rows < multiple or rows % multiple == 0
        if commit:
            ends[-1] = pos + 1
            batch_max, tail_max = longest, 0
    if ends[-1] != len(order):
        ends.append(len(order))
    bounds = [0] + ends
    batches = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    if multiple > 1 and batches and len(batches[-1]) % multiple:
        batches = batches[:-1]
    return batches

