"""The cost of SCALE=paper: one H100's GPU-hours for every cell of a target's paper-scale presets,
estimated from model FLOPs (runner/model/flops.py) until a GPU has run the cells
(docs/reproductions.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from runner.config import Config
from runner.model.flops import train_flops
from runner.run.hardware import CUDA_BF16_PEAK_TFLOPS
from runner.sweep.plan import plan_cells
from runner.tables.targets import TARGETS

# GPU-hours of SCALE=paper on one H100 (docs/reproductions.md), estimated from model FLOPs until a
# GPU has run the cells: per cell, max_updates x FLOPs per update / (peak x utilization). FLOPs
# per update = runner/model/flops.py train_flops per target token (3x the forward, attention included)
# x the tokens of an update, taken as data.max_tokens x update_freq x devices (max_tokens counts
# the longer side with padding, which a GPU computes too). Mean lengths and vocabularies: the
# fairseq-preprocess logs of the two corpora (eos included).
H100_PEAK_TFLOPS = CUDA_BF16_PEAK_TFLOPS["H100 SXM"]  # dense bf16/fp16, NVIDIA datasheet
ASSUMED_UTILIZATION = 0.40  # model FLOPs utilization assumed, not measured


@dataclass(frozen=True)
class CorpusShape:
    src_len: float  # mean tokens per training sentence, source side, eos included
    tgt_len: float
    joined_vocab: int  # data.joined_dictionary=true
    tgt_vocab: int  # separate dictionaries: the target side's


PAPER_CORPORA = {
    # IWSLT'14 De-En, joint 10k BPE: 160,239 pairs, 4,035,591 de and 3,949,114 en tokens; joined
    # dictionary 10,152 types, separate en 6,632
    "DEEPINIT_IWSLT14_DIR": CorpusShape(4_035_591 / 160_239, 3_949_114 / 160_239, 10_152, 6_632),
    # WMT'14 En-De, joint 32k BPE: 4,500,966 pairs, 132,886,171 en and 137,628,246 de tokens;
    # dictionary 32,768 types
    "DEEPINIT_WMT14_DIR": CorpusShape(132_886_171 / 4_500_966, 137_628_246 / 4_500_966,
                                      32_768, 32_768),
}
# Seconds per update on one H100, measured (a finished cell's result.json: wall_s / updates), by
# (preset, model.layers); a measured cell replaces the FLOPs estimate. None measured yet.
H100_SECONDS_PER_UPDATE: dict[tuple[str, int], float] = {}
# Cell axes that change neither the model, the data, nor the update count: cells that differ only
# in them cost the same, and one Config is composed for them all (a compose takes ~0.2 s).
COST_FREE_KEYS = frozenset({"trainer.seed", "optim.lr", "optim.beta2"})


def update_flops(cfg: Config, corpus: CorpusShape) -> float:
    """Model FLOPs of one training update of this config on a corpus of this shape."""
    m, t = cfg.model, cfg.trainer
    vocab = corpus.joined_vocab if cfg.data.joined_dictionary else corpus.tgt_vocab
    per_target_token = float(train_flops(m.dim, m.ffn_dim, m.num_encoder_layers,
                                         m.num_decoder_layers, vocab, np.array([corpus.src_len]),
                                         np.array([corpus.tgt_len]))) / corpus.tgt_len
    return per_target_token * cfg.data.max_tokens * t.update_freq * t.devices


@dataclass
class PaperCost:
    target: str
    cells: int
    updates: int  # summed over the cells
    flops: float  # model FLOPs, summed over the cells
    gpu_hours: float
    measured_cells: int  # cells costed from H100_SECONDS_PER_UPDATE rather than FLOPs
    parts: dict[str, tuple[int, float]]  # preset -> (cells, GPU-hours)


def paper_gpu_hours(target: str, compose: Callable[[list[str]], Config],
                    utilization: float = ASSUMED_UTILIZATION,
                    peak_tflops: float = H100_PEAK_TFLOPS) -> PaperCost:
    """One H100's GPU-hours for every cell of a target's paper-scale presets (training only, not
    scoring). `compose` turns overrides into a Config (runner/cli/compose.py)."""
    cost = PaperCost(target, 0, 0, 0.0, 0.0, 0, {})
    for part in TARGETS[target].parts.get("paper", ()):
        hours = 0.0
        cells, _ = plan_cells(part.preset)
        composed: dict[tuple, Config] = {}
        for cell in cells:
            shape = tuple((k, v) for k, v in cell.items() if k not in COST_FREE_KEYS)
            if shape not in composed:
                composed[shape] = compose([f"+sweep={part.preset}", *(f"{k}={v}" for k, v in shape)])
            cfg = composed[shape]
            updates = cfg.trainer.max_updates
            flops = updates * update_flops(cfg, PAPER_CORPORA[part.data_env])
            measured = H100_SECONDS_PER_UPDATE.get((part.preset, cfg.model.layers))
            seconds = (updates * measured if measured is not None
                       else flops / (peak_tflops * 1e12 * utilization))
            cost.measured_cells += measured is not None
            cost.cells += 1
            cost.updates += updates
            cost.flops += flops
            hours += seconds / 3600
        cost.parts[part.preset] = (len(cells), hours)
        cost.gpu_hours += hours
    return cost
