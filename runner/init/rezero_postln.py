"""`init=rezero_postln`: rezero_postln of LiyuanLucasLiu/Transformer-Clinic
(fairseq/fairseq/modules/transformer_layer.py): x <- LN(x + alpha * F(x)), alpha one scalar per
layer, 0 at init, trained. See runner/init/rezero.py."""
from __future__ import annotations

from runner.init.rezero import AlphaScheme


class ReZeroPostLN(AlphaScheme):
    name = "rezero_postln"
    # the rule (one alpha per layer, 0 at init, with Post-LN; Transformer-Clinic rezero_postln)
    # needs nothing of the encoder-decoder, so the LM's one stack gets it unchanged
    tasks = ("translation", "lm")
    placements = ("post",)
    placement_hint = "rezero_postln is ReZero with Post-LN"
    rule = "ReZero with Post-LN (Transformer-Clinic rezero_postln), alpha per layer = 0"
