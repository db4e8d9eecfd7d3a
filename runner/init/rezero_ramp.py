"""`init=rezero_ramp`: a variant of ReZero/SkipInit proposed in a blog post, not in a paper
(Su 2021, kexue.fm/archives/8620, "Residual Connections"): no norm, alpha starts at 0 and rises by
the fixed step init.alpha_ramp_step after every update until it reaches 1, then stays; alpha is not
trained. See runner/init/rezero.py."""
from __future__ import annotations

from dataclasses import dataclass

from runner.init.rezero import AlphaOptions, AlphaScheme


@dataclass
class ReZeroRampOptions(AlphaOptions):
    alpha_ramp_step: float = 0.001  # the ramp needs a positive step (conf/init/rezero_ramp.yaml)


class ReZeroRamp(AlphaScheme):
    # the ramp is per branch and per update whatever the stack, so the LM's one stack gets it
    tasks = ("translation", "lm")
    name = "rezero_ramp"
    options = ReZeroRampOptions
    placements = ("none",)
    placement_hint = "ReZero removes layer normalization"
    rule = "fixed-step alpha ramp (Su 2021, kexue.fm/archives/8620, not from a paper): no norm, alpha 0 -> 1"

    def requirements(self, cfg) -> list[str]:
        if cfg.init.alpha_ramp_step <= 0:
            return ["init=rezero_ramp needs a positive ramp step: use init.alpha_ramp_step=0.001"]
        return []
