"""`init=skipinit`: SkipInit (De & Smith 2020) in its usual definition x + alpha * F(x) with one
alpha per residual branch, alpha = 0 at init and trained, no normalization (methods 8: not
verified against a reference implementation). `rezero` differs only in sharing one alpha across
a layer's sublayers (rztx.py)."""
from __future__ import annotations

from runner.init.common import needs_placement
from runner.init.rezero import alpha_apply, alpha_residual, on_update  # noqa: F401 (the hook)


def requirements(cfg) -> list[str]:
    return needs_placement(cfg, "none", "SkipInit replaces normalization: use norm=none")


def residual(cfg):
    return alpha_residual(cfg, per_layer=False)


def apply(model, cfg, batch=None) -> dict:
    return alpha_apply(model, cfg, "SkipInit: no norm, alpha per residual branch = 0 (methods 8, unverified)")
