"""`init=tfixup`: T-Fixup (Huang et al., ICML 2020) exactly as layer6ai-labs/T-Fixup implements it
(fixup_initialization in fairseq/modules/transformer_layer.py): the default Xavier model, then
in-place scaling of v/out/fc and the token tables. LayerNorm is removed (norm=none) and no warmup
is needed."""
from __future__ import annotations

import math

import torch

from runner.init.base import InitScheme
from runner.init.common import branch_linears, fairseq_xavier, is_ntk


def factors(encoder_layers: int, decoder_layers: int) -> dict[str, float]:
    """Huang et al. 2020 (Improving Transformer Optimization Through Better Initialization), Sec. 3.2:
    encoder 0.67*N^-1/4, decoder and embeddings (9M)^-1/4 / (9N)^-1/4, each stack with its own
    depth as the T-Fixup code has it (the paper writes one N)."""
    return {
        "encoder": 0.67 * encoder_layers ** -0.25,
        "decoder": (9 * decoder_layers) ** -0.25,
        "encoder_embedding": (9 * encoder_layers) ** -0.25,
        "decoder_embedding": (9 * decoder_layers) ** -0.25,
    }


# Scaled per sublayer: v/out of every attention (self and cross) and fc1/fc2; q/k stay at the
# baseline's Xavier gain 1/sqrt(2), as in T-Fixup's code (the paper's rule says plain Xavier for all).
SCALED = ("v", "out", "fc1", "fc2")


class TFixup(InitScheme):
    name = "tfixup"
    # q/k and an untied output matrix keep the baseline
    changes = ("*.v", "*.out", "*.fc1", "*.fc2", "embedding.encoder", "embedding.decoder")
    task_hint = ("T-Fixup (Huang et al. 2020, Sec. 3) states factors for an encoder and for an "
                 "encoder-decoder's decoder (with cross-attention), not for a decoder-only stack")
    placements = ("none",)
    placement_hint = "T-Fixup removes layer normalization"
    warmup_updates = 0  # T-Fixup trains without warmup (Huang et al. 2020, Sec. 3)

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        return apply_tfixup(model, cfg)


def apply_tfixup(model, cfg) -> dict:
    fairseq_xavier(model, cfg)
    f = factors(model.cfg.num_encoder_layers, model.cfg.num_decoder_layers)
    for ref in model.sublayers():
        for role, linear in branch_linears(ref).items():
            if role not in SCALED:
                continue
            scale = f[ref.side]
            # T-Fixup's code multiplies v by sqrt(2) to undo fairseq's 1/sqrt(2) gain (gain-1 Xavier, then
            # scaled). Under NTK the baseline has no such gain, so there is nothing to undo.
            if role == "v" and not is_ntk(linear):
                scale *= math.sqrt(2)
            linear.weight.mul_(scale)
    tables = model.embedding_tables()
    tables["encoder"].mul_(f["encoder_embedding"])
    # --share-all-embeddings: the decoder re-scaling is skipped, the shared table carries only
    # the encoder factor (T-Fixup fairseq/models/transformer.py). With decoder_io the output
    # projection is this table.
    if tables["decoder"] is not tables["encoder"]:
        tables["decoder"].mul_(f["decoder_embedding"])
    return {"rule": "T-Fixup (Huang et al. 2020, Sec. 3.2) as layer6ai-labs/T-Fixup "
                    "fairseq/modules/transformer_layer.py fixup_initialization", "factors": f,
            "embedding_factor_applied_to_decoder":
                tables["decoder"] is not tables["encoder"]}
