"""Typed Config from plain data: a checkpoint's "config" entry, a run's .hydra/config.yaml, a
dotted override list on top of a Config. OmegaConf merges onto the schema, so unknown keys and
wrong types fail here as they do at composition."""
from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Callable, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config.schema import Config, InitConfig, NormConfig
from runner.config.validate import ConfigError

# Before each init scheme declared its own options, every config carried all of these under
# `init`; a stored config (a checkpoint's, a run's .hydra/config.yaml) still may. The ones its
# scheme does not read are dropped when it is loaded. Frozen: a new scheme's options never go here.
LEGACY_INIT_KEYS = ("omega", "output_change_scale", "lipschitz_scale", "ds_init_form",
                    "ds_init_gain", "deepnorm_variant", "alpha_ramp_step", "depth_mup_exponent",
                    "depth_mup_base_layers")

# Before each norm placement declared its own options, every config carried these under `norm`.
# Frozen as LEGACY_INIT_KEYS is.
LEGACY_NORM_KEYS = ("b2t_rescale_init", "resi_dual_scale", "resi_dual_alpha", "mix_ratio")

InitOptions = Callable[[str], type[InitConfig]]  # scheme name -> its options class (runner.init.options_class)
# the placements a config's stacks use -> its norm options class (runner.model.sublayer.norm_options_class)
NormOptions = Callable[..., type[NormConfig]]


def config_from_dict(config: dict[str, Any], init_options: InitOptions,
                     norm_options: NormOptions) -> Config:
    """The typed Config of stored data; `init` becomes an instance of its scheme's options class
    and `norm` of its placement's, which the caller's lookups give (runner.init.options_class,
    runner.model.sublayer.norm_options_class: the config layer knows neither registry)."""
    init = dict(config.get("init") or {})
    name = init.get("name", InitConfig.name)
    init_cls = init_options(name)
    init = _without_legacy(init, init_cls, LEGACY_INIT_KEYS)
    norm = dict(config.get("norm") or {})
    norm_cls = norm_options(norm.get("placement", NormConfig.placement),
                            norm.get("encoder_placement"), norm.get("decoder_placement"))
    norm = _without_legacy(norm, norm_cls, LEGACY_NORM_KEYS)
    try:
        schema = OmegaConf.structured(Config(init=init_cls(name=name), norm=norm_cls()))
        return OmegaConf.to_object(OmegaConf.merge(schema, {**config, "init": init, "norm": norm}))
    except OmegaConfBaseException as err:
        raise ConfigError(f"not a deepinit config: {err}") from err


def _without_legacy(group: dict[str, Any], cls: type, legacy: Sequence[str]) -> dict[str, Any]:
    """A stored group's fields less the legacy flat keys its options class does not have (any
    other unknown key stays, and fails the merge)."""
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in group.items() if k in known or k not in legacy}


def config_from_yaml(path: Path, init_options: InitOptions, norm_options: NormOptions) -> Config:
    """A run's composed config (its .hydra/config.yaml)."""
    try:
        raw = OmegaConf.load(path)
    except (OSError, OmegaConfBaseException) as err:
        raise ConfigError(f"{path}: cannot read ({err})") from err
    return config_from_dict(OmegaConf.to_container(raw), init_options, norm_options)


def with_dotlist(cfg: Config, overrides: Sequence[str]) -> Config:
    """`cfg` with `key=value` field overrides applied (no group choices: those need the CLI's
    composition)."""
    if not overrides:
        return cfg
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cfg), OmegaConf.from_dotlist(list(overrides)))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(f"cannot apply {' '.join(overrides)}: {err}") from err


def to_dict(cfg: Config) -> dict[str, Any]:
    return asdict(cfg)
