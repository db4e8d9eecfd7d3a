"""Typed Config from plain data: a checkpoint's "config" entry, a run's .hydra/config.yaml, a
dotted override list on top of a Config. OmegaConf merges onto the schema, so unknown keys and
wrong types fail here as they do at composition."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config.schema import Config
from runner.config.validate import ConfigError


def config_from_dict(config: dict[str, Any]) -> Config:
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), config))
    except OmegaConfBaseException as err:
        raise ConfigError(f"not a deepinit config: {err}") from err


def config_from_yaml(path: Path) -> Config:
    """A run's composed config (its .hydra/config.yaml)."""
    try:
        raw = OmegaConf.load(path)
    except (OSError, OmegaConfBaseException) as err:
        raise ConfigError(f"{path}: cannot read ({err})") from err
    return config_from_dict(OmegaConf.to_container(raw))


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
