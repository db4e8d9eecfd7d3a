"""`init=xavier`: the baseline every paper compares against (fairseq's default init, see
runner/init/common.py)."""
from __future__ import annotations

from runner.init.base import InitScheme
from runner.init.common import fairseq_xavier


class Xavier(InitScheme):
    # a rule per matrix (fan-in and fan-out only), so the LM's one stack gets it unchanged
    tasks = ("translation", "lm")
    name = "xavier"

    def apply(self, model, cfg, batch=None) -> dict:
        fairseq_xavier(model, cfg)
        return {"rule": "fairseq default Xavier as in the layer6ai-labs/T-Fixup and "
                        "LiyuanLucasLiu/Transformer-Clinic forks (fairseq/modules/multihead_attention.py)"}
