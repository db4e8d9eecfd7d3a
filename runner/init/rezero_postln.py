"""`init=rezero_postln`: CLN's rezero_postln (methods 4.8): x <- LN(x + alpha * F(x)), alpha one
scalar per layer, 0 at init, trained. See runner/init/rezero.py."""
from __future__ import annotations

from runner.init.common import needs_placement
from runner.init.rezero import alpha_apply, alpha_residual, on_update  # noqa: F401 (the hook)


def requirements(cfg) -> list[str]:
    return needs_placement(cfg, "post", "rezero_postln is ReZero with Post-LN: use norm=post")


def residual(cfg):
    return alpha_residual(cfg)


def apply(model, cfg, batch=None) -> dict:
    return alpha_apply(model, cfg, "ReZero with Post-LN, alpha per layer = 0 (methods 4.8)")
