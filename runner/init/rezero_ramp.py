"""`init=rezero_ramp`: seed 004's variant of ReZero/SkipInit: no norm, alpha starts at 0 and rises
by the fixed step init.alpha_ramp_step after every update until it reaches 1, then stays; alpha is
not trained. See runner/init/rezero.py."""
from __future__ import annotations

from runner.init.rezero import NO_NORM, alpha_apply, alpha_residual, on_update  # noqa: F401


def requirements(cfg) -> list[str]:
    problems = []
    if cfg.norm.placement != "none":
        problems.append(NO_NORM)
    if cfg.init.alpha_ramp_step <= 0:
        problems.append("rezero_ramp needs a positive ramp step: use init.alpha_ramp_step=0.001")
    return problems


def residual(cfg):
    return alpha_residual(cfg)


def apply(model, cfg, batch=None) -> dict:
    return alpha_apply(model, cfg, "fixed-step alpha ramp (seed 004): no norm, alpha 0 -> 1")
