"""Compose conf/ into a typed Config, exactly as `deepinit train` does. The only module besides
the Hydra app that talks to Hydra; tools that derive configs from override lists receive
`compose` from their CLI verb."""
from __future__ import annotations

from typing import Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config import Config, ConfigError
from runner.config.paths import config_dir


def register_schemas() -> None:
    """Register the schema with Hydra's ConfigStore (conf/train.yaml extends config_schema)."""
    ConfigStore.instance().store(name="config_schema", node=Config)


def compose_run(overrides: Sequence[str] = ()) -> tuple[Config, dict, list[str]]:
    """The typed Config for these overrides, with Hydra's group choices and task overrides as a
    run sees them (HydraConfig's runtime.choices, overrides.task); a bad override raises
    ConfigError (one line)."""
    register_schemas()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = hydra_compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
        choices, task = dict(cfg.hydra.runtime.choices), list(cfg.hydra.overrides.task)
        del cfg.hydra
        return OmegaConf.to_object(cfg), choices, task
    except (HydraException, OmegaConfBaseException) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"cannot compose {' '.join(overrides) or '(defaults)'}: {first}") from err


def compose(overrides: Sequence[str] = ()) -> Config:
    """The typed Config for these overrides; a bad override raises ConfigError (one line)."""
    return compose_run(overrides)[0]
