"""deepinit bench: training and decoding throughput, memory and MFU; depth scaling; fairseq side by side.

Every measurement trains with the real train loop (runner/train/loop.py) in a fresh child process
(clean peak memory, no state carried between entries) on the peer's training stream: the
IWSLT'14 de-en BPE sentences (the staged `iwslt14-de-en-fairseq` folder under the data root)
that the fairseq peer script trains on (valid + test lines 501.., decoding on test lines
1..500), with the peer's vocabularies (all types, or the 1000 most frequent per side). Without
that data, Zipf text with IWSLT-like lengths is used.

    deepinit bench                          presets tiny, small, ci (+ base on CUDA) and depth scaling
    deepinit bench --quick                  a few updates of the ci preset and one 2+2-layer depth entry (smoke test)
    deepinit bench --peer --peer-tools DIR  deepinit and fairseq alternating, with ratios (make bench-peer)
    deepinit bench --reference              each preset also in plain PyTorch (torch.nn.Transformer), alternating
    deepinit bench --compile both           each preset eager and compiled
    deepinit bench --presets lm-nanogpt-cpu --depths --reference   task=lm against a plain PyTorch GPT

Throughput counts target tokens (eos included, padding not) per second of wall clock between
log records, after the warm-up updates, as fairseq's wps meter does.

    entries.py    what is measured: the presets, the recipe, the entries of a call
    corpus.py     the peer's training stream as a data=custom folder, fairseq-generate's batches
    machine.py    the machine: other processes' load, memory, its description
    workers.py    one entry in its own process: deepinit's train loop or the plain-PyTorch reference
    compare.py    side by side: fairseq (--peer) and the plain-PyTorch reference (--reference)
    tables.py     the printed and Markdown tables of a report
    run.py        `deepinit bench`: the entries in turn, the JSON report
    reference.py  the plain-PyTorch training step; profile.py: --profile
    lm.py         task=lm's entry (lm-nanogpt-cpu): deepinit's LM step and a plain-PyTorch GPT

Model FLOPs come from runner/model/flops.py and the hardware peaks from runner/run/hardware.py,
which the paper-scale cost estimates (runner/tables/cost.py) use too.
"""
from __future__ import annotations

# loaded now, not on first use: numpy imports it lazily, and a SIGINT that lands inside that
# first import (its Cython module init) is lost, so a bench stopped then would run on
import numpy.random  # noqa: F401
