"""Initialization schemes behind one interface (architecture principle 2).

Each scheme is a module with
    apply(model, cfg, batch) -> dict      writes values into the model's existing slots
                                          (weights, omega, alpha) and returns a report for
                                          init.json; `batch` is the first training batch
                                          (Admin profiles it), or None.
and optionally
    requirements(cfg) -> list[str]        one line per violated requirement, naming the fix
    residual(cfg) -> ResidualSpec         which residual scales train (fixed at construction)
    on_update(model, step, cfg) -> None   called after every optimizer update (alpha ramps)
The registry is this dict literal; nothing registers itself on import.
"""
from __future__ import annotations

from types import ModuleType

from runner.init import (admin, admin_torch, deepnorm, ds_init, lipschitz, rezero, rezero_postln,
                         rezero_ramp, skipinit, tfixup, xavier)
from runner.model.sublayer import ResidualSpec

SCHEMES: dict[str, ModuleType] = {
    "xavier": xavier,
    "tfixup": tfixup,
    "admin": admin,
    "admin_torch": admin_torch,
    "lipschitz": lipschitz,
    "ds_init": ds_init,
    "deepnorm": deepnorm,
    "rezero": rezero,
    "rezero_postln": rezero_postln,
    "skipinit": skipinit,
    "rezero_ramp": rezero_ramp,
}


def get_scheme(name: str) -> ModuleType:
    return SCHEMES[name]


def scheme_requirements(cfg) -> list[str]:
    scheme = get_scheme(cfg.init.name)
    return list(getattr(scheme, "requirements", lambda _: [])(cfg))


def residual_spec(cfg) -> ResidualSpec:
    scheme = get_scheme(cfg.init.name)
    return getattr(scheme, "residual", lambda _: ResidualSpec())(cfg)


def apply(model, cfg, batch=None) -> dict:
    """Initialize `model` in place with the configured scheme; returns the init.json report."""
    report = get_scheme(cfg.init.name).apply(model, cfg, batch)
    return {"scheme": cfg.init.name, **report}


def on_update_hook(cfg):
    """The scheme's per-update hook bound to cfg, or None (the train loop then calls nothing)."""
    hook = getattr(get_scheme(cfg.init.name), "on_update", None)
    return None if hook is None else (lambda model, step: hook(model, step, cfg))
