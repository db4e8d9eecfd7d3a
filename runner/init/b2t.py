"""The init step that belongs to the B2T placement (norm=b2t), not to a scheme: after the
scheme has drawn the weights, every branch weight of a B2T stack (q/k/v/out, fc1/fc2; not
biases, norms, omega/alpha or embeddings) is multiplied by (layers of that stack)^-1/2.

This is `rescaling_init` of takase/b2t_connection (fairseq/modules/transformer_layer.py, added in
commit 4d80167 "Modify initialization" and kept at the last revision c8e2ad4, whose README cites
the Findings of ACL 2023 paper): `p *= layer_num ** -0.5` for every layer parameter whose name
contains "weight" and not "layer_norm", with layer_num = encoder_layers for the encoder and
decoder_layers for the decoder. The revision before (860323e) had no rescaling:
norm.b2t_rescale_init=false gives it.
"""
from __future__ import annotations

from typing import Optional

import torch

from runner.init.base import stack_placements
from runner.init.common import branch_linears


@torch.no_grad()
def rescale_b2t(model, cfg) -> Optional[dict]:
    """Scale the B2T stacks' branch weights in place; the init.json entry, or None when no stack
    is B2T or norm.b2t_rescale_init is off."""
    b2t = [side for side, p in stack_placements(cfg).items() if p == "b2t"]
    if not b2t or not cfg.norm.b2t_rescale_init:
        return None
    layers = {"encoder": model.cfg.num_encoder_layers, "decoder": model.cfg.num_decoder_layers}
    factors = {side: layers[side] ** -0.5 for side in b2t}
    for ref in model.sublayers():
        if ref.side in factors:
            for linear in branch_linears(ref).values():
                linear.weight.mul_(factors[ref.side])
    return {"rule": "B2T rescaling_init (takase/b2t_connection@c8e2ad4 "
                    "fairseq/modules/transformer_layer.py): branch weights x layers^-1/2",
            "factor": factors}
