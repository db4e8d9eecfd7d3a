"""Token-bucketed batches (fairseq's batch_by_size): sentences of similar length share a batch
so padding stays low; batch order is reshuffled every epoch from the seed."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from runner.data.dataset import TokenizedSplit


@dataclass
class Batch:
    src_tokens: torch.Tensor  # (B, S) right-padded, each row ends with eos
    prev_tokens: torch.Tensor  # (B, T) decoder input: eos + target[:-1]
    target: torch.Tensor  # (B, T) right-padded
    ntokens: int  # real target tokens (the loss normaliser)
    nsentences: int
    src_has_pad: bool  # lets the encoder skip its mask (flash attention on CUDA)
    padded_cells: int  # padding cells in src + target (for the padding fraction)
    total_cells: int
    # target[target != pad] in row-major order, built on the host (no device sync): the labels
    # of unpadded training's logits (trainer.unpad)
    real_target: torch.Tensor

    def _map(self, fn) -> "Batch":
        return replace(self, src_tokens=fn(self.src_tokens), prev_tokens=fn(self.prev_tokens),
                       target=fn(self.target), real_target=fn(self.real_target))

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        return self._map(torch.Tensor.pin_memory)


def filter_by_length(split: TokenizedSplit, max_source: int, max_target: int) -> np.ndarray:
    """Indices of pairs within the position limits (the caller reports how many were dropped)."""
    keep = (split.src_lengths <= max_source) & (split.tgt_lengths <= max_target)
    return np.flatnonzero(keep)


def make_batches(split: TokenizedSplit, max_tokens: int, indices: np.ndarray | None = None,
                 seed: int = 0, shuffle: bool = True) -> list[np.ndarray]:
    """Group sentence indices into batches whose padded size (rows x longest side) stays within
    max_tokens. Sorting is by (target length, source length) after a seeded shuffle, so ties are
    broken randomly but reproducibly. (fairseq's ordered_indices sorts the other way round,
    source length first; with trainer.unpad the padding either order leaves costs little.)"""
    if indices is None:
        indices = np.arange(len(split))
    src_len, tgt_len = split.src_lengths[indices], split.tgt_lengths[indices]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(indices)) if shuffle else np.arange(len(indices))
    order = order[np.lexsort((src_len[order], tgt_len[order]))]
    longest = np.maximum(src_len, tgt_len)[order]
    batches, start, width = [], 0, 0
    for pos in range(len(order)):
        width_if_added = max(width, int(longest[pos]))
        if pos > start and width_if_added * (pos - start + 1) > max_tokens:
            batches.append(indices[order[start:pos]])
            start, width_if_added = pos, int(longest[pos])
        width = width_if_added
    if start < len(order):
        batches.append(indices[order[start:]])
    return batches


def epoch_order(batches: list[np.ndarray], seed: int, epoch: int) -> list[np.ndarray]:
    """The batch sequence of one epoch: a permutation of the buckets drawn from (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    return [batches[i] for i in rng.permutation(len(batches))]


def collate(split: TokenizedSplit, indices: np.ndarray, pad: int, eos: int) -> Batch:
    srcs = [split.source(i) for i in indices]
    tgts = [split.target(i) for i in indices]
    b, s, t = len(indices), max(len(x) for x in srcs), max(len(x) for x in tgts)
    src = np.full((b, s), pad, dtype=np.int64)
    tgt = np.full((b, t), pad, dtype=np.int64)
    prev = np.full((b, t), pad, dtype=np.int64)
    for row, (x, y) in enumerate(zip(srcs, tgts)):
        src[row, :len(x)] = x
        tgt[row, :len(y)] = y
        prev[row, 0] = eos  # fairseq feeds eos as the start symbol
        prev[row, 1:len(y)] = y[:-1]
    src_real = sum(len(x) for x in srcs)
    tgt_real = sum(len(y) for y in tgts)
    return Batch(torch.from_numpy(src), torch.from_numpy(prev), torch.from_numpy(tgt),
                 ntokens=tgt_real, nsentences=b, src_has_pad=src_real < b * s,
                 padded_cells=b * s + b * t - src_real - tgt_real, total_cells=b * s + b * t,
                 real_target=torch.from_numpy(np.concatenate(tgts).astype(np.int64)))
