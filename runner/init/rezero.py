"""`init=rezero`: ReZero (Bachlechner et al. 2020) as rztx.py / CLN `rezero` have it (methods 8):
no norm anywhere, every branch multiplied by its layer's scalar alpha (shared by the layer's
sublayers), alpha = 0 at init and trained. Weights are the default Xavier.

The variants share this module's machinery:
- rezero_postln (CLN, methods 4.8): the same alpha with Post-LN;
- skipinit (De & Smith 2020, unverified here): one alpha per residual branch instead of per layer;
- rezero_ramp (seed 004): alpha is not trained but rises by init.alpha_ramp_step per update
  until it reaches 1. Any of the schemes above ramps when init.alpha_ramp_step > 0."""
from __future__ import annotations

from runner.init.common import fairseq_xavier, fill_alpha, needs_placement
from runner.model.sublayer import ResidualSpec

NO_NORM = "ReZero removes layer normalization: use norm=none"


def ramping(cfg) -> bool:
    return cfg.init.alpha_ramp_step > 0


def alpha_residual(cfg, per_layer: bool = True) -> ResidualSpec:
    return ResidualSpec(alpha_trainable=not ramping(cfg), alpha_per_layer=per_layer)


def alpha_apply(model, cfg, rule: str) -> dict:
    fairseq_xavier(model, cfg)
    fill_alpha(model, 0.0)
    report = {"rule": rule, "alpha_init": 0.0, "alpha_trained": not ramping(cfg)}
    if ramping(cfg):
        report["alpha_ramp_step"] = cfg.init.alpha_ramp_step
    return report


def on_update(model, step: int, cfg) -> None:
    """Seed 004's fixed-step ramp: after update `step`, alpha = min(1, step * r). A function of
    the step alone, so a resumed run continues exactly. A no-op when alpha is trained."""
    if not ramping(cfg) or (step - 1) * cfg.init.alpha_ramp_step >= 1.0:
        return  # trained alpha, or alpha already reached 1 at the previous update
    fill_alpha(model, min(1.0, step * cfg.init.alpha_ramp_step))


def requirements(cfg) -> list[str]:
    return needs_placement(cfg, "none", NO_NORM)


def residual(cfg) -> ResidualSpec:
    return alpha_residual(cfg)


def apply(model, cfg, batch=None) -> dict:
    return alpha_apply(model, cfg, "ReZero: no norm, alpha per layer = 0 (methods 8)")
