"""`init=rezero_postln`: CLN's rezero_postln (methods 4.8): x <- LN(x + alpha * F(x)), alpha one
scalar per layer, 0 at init, trained. See runner/init/rezero.py."""
from __future__ import annotations

from runner.init.rezero import AlphaScheme


class ReZeroPostLN(AlphaScheme):
    name = "rezero_postln"
    placements = ("post",)
    placement_hint = "rezero_postln is ReZero with Post-LN"
    rule = "ReZero with Post-LN, alpha per layer = 0 (methods 4.8)"
