"""`init=skipinit`: SkipInit (De & Smith, NeurIPS 2020) in its usual definition x + alpha * F(x) with one
alpha per residual branch, alpha = 0 at init and trained, no normalization (not
verified against a reference implementation). `rezero` differs only in sharing one alpha across
a layer's sublayers (rztx.py)."""
from __future__ import annotations

from runner.init.rezero import AlphaScheme


class SkipInit(AlphaScheme):
    # one alpha per residual branch whatever the stack, so the LM's one stack gets it unchanged
    tasks = ("translation", "lm")
    name = "skipinit"
    placements = ("none",)
    placement_hint = "SkipInit replaces normalization"
    alpha_per_layer = False
    rule = ("SkipInit (De & Smith 2020; not checked against a reference implementation): no norm, "
            "alpha per residual branch = 0")
