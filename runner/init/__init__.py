"""Initialization schemes behind one interface (runner/init/base.py: InitScheme).

The registry is the dict literal below: adding a scheme is one file (an InitScheme subclass and,
when it reads options, their dataclass: `options`), one line here and conf/init/<name>.yaml (the
`init=<name>` option, naming its options' schema). Nothing registers itself on import: the CLI
stores every scheme's options in Hydra's ConfigStore from this dict (runner/cli/compose.py), and
a stored config is rebuilt with `options_class` (runner.config.config_from_dict). The run assembly calls, in order,
`check_requirements(cfg)` (config time), `residual_spec(cfg)` (handed to the model builder),
`apply(model, cfg, batch)` (after the model is built; it ends with the model's `after_init()`),
`param_groups(model, cfg)` (handed to the optimizer builder) and `update_hook(cfg)` (per update).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from runner.config import Config, ConfigError, InitConfig
from runner.config.options import recast
from runner.init.admin import Admin
from runner.init.admin_torch import AdminTorch
from runner.init.b2t import rescale_b2t
from runner.init.base import InitScheme, ModelSurface, ParamGroup, placement_problems, task_problems
from runner.init.deepnorm import DeepNorm
from runner.init.depth_mup import DepthMuP
from runner.init.ds_init import DSInit
from runner.init.gpt2 import GPT2
from runner.init.layerscale import LayerScale
from runner.init.lipschitz import Lipschitz
from runner.init.rezero import ReZero
from runner.init.rezero_postln import ReZeroPostLN
from runner.init.rezero_ramp import ReZeroRamp
from runner.init.skipinit import SkipInit
from runner.init.tfixup import TFixup
from runner.init.xavier import Xavier
from runner.model.sublayer import ResidualSpec

SCHEMES: dict[str, InitScheme] = {
    "xavier": Xavier(),
    "tfixup": TFixup(),
    "admin": Admin(),
    "admin_torch": AdminTorch(),
    "lipschitz": Lipschitz(),
    "ds_init": DSInit(),
    "deepnorm": DeepNorm(),
    "rezero": ReZero(),
    "rezero_postln": ReZeroPostLN(),
    "skipinit": SkipInit(),
    "rezero_ramp": ReZeroRamp(),
    "layerscale": LayerScale(),
    "depth_mup": DepthMuP(),
    "gpt2": GPT2(),
}


def get_scheme(name: str) -> InitScheme:
    try:
        return SCHEMES[name]
    except KeyError:
        raise ConfigError(f"init={name}: unknown init scheme; expected one of "
                          f"{', '.join(sorted(SCHEMES))}") from None


def options_class(name: str) -> type[InitConfig]:
    """The options dataclass of scheme `name` (InitConfig for a scheme that reads none)."""
    return get_scheme(name).options


def options_for(name: str, **fields: Any) -> InitConfig:
    """The scheme's options with these fields set, the others at their defaults."""
    return options_class(name)(name=name, **fields)


def with_scheme_options(cfg: Config) -> Config:
    """cfg with `cfg.init` an instance of its scheme's options class. Composition gives the class
    the chosen conf/init option names; `init.name=<scheme>` over another option (a scheme without
    a YAML of its own) keeps the fields the two classes share and drops the others, which came
    from the other option's YAML."""
    cls = options_class(cfg.init.name)
    return cfg if type(cfg.init) is cls else dataclasses.replace(cfg, init=recast(cfg.init, cls))


def check_requirements(cfg) -> None:
    """Raise ConfigError with one line naming the override to change when the scheme does not
    define this combination (both stacks' placements are checked)."""
    scheme = get_scheme(cfg.init.name)
    for problem in task_problems(scheme, cfg) + placement_problems(scheme, cfg) + scheme.requirements(cfg):
        raise ConfigError(problem)


def residual_spec(cfg) -> ResidualSpec:
    return get_scheme(cfg.init.name).residual(cfg)


def apply(model: ModelSurface, cfg, batch=None) -> dict:
    """Initialize `model` in place with the configured scheme; returns the init.json report."""
    report = {"scheme": cfg.init.name, **get_scheme(cfg.init.name).apply(model, cfg, batch)}
    b2t = rescale_b2t(model, cfg)  # norm=b2t's own init step, after any scheme (runner/init/b2t.py)
    if b2t is not None:
        report["b2t_rescale"] = b2t
    # The weights are final: the model sets what depends on them (sigma-reparam's gamma =
    # sigma(W_0) and power-iteration vectors; a no-op otherwise, no random numbers).
    model.after_init()
    return report


def param_groups(model: ModelSurface, cfg) -> Optional[list[ParamGroup]]:
    """The scheme's optimizer parameter groups (lr and eps multipliers), or None for one group."""
    return get_scheme(cfg.init.name).param_groups(model, cfg)


def update_hook(cfg) -> Optional[Callable[[ModelSurface, int], None]]:
    """The scheme's per-update hook bound to cfg, or None (the train loop then calls nothing)."""
    scheme = get_scheme(cfg.init.name)
    if not scheme.updates_during_training(cfg):
        return None
    return lambda model, step: scheme.on_update(model, step, cfg)
