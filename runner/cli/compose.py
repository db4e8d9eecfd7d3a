"""Compose conf/ into a typed Config, exactly as `deepinit train` does. The only module besides
the Hydra app that talks to Hydra; tools that derive configs from override lists receive
`compose` from their CLI verb."""
from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Iterator, Optional, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from runner.config import Config, ConfigError
from runner.config.paths import config_dir
from runner.init import SCHEMES, with_scheme_options
from runner.model.sublayer import PLACEMENT_OPTIONS, own_option_names, with_placement_options
from runner.run.folder import folder_name

# The ConfigStore group of the init schemes' option schemas: conf/init/<scheme>.yaml starts with
# `defaults: [/init_options/<scheme>@_here_, _self_]`.
INIT_OPTIONS_GROUP = "init_options"
# The same for the norm placements that read options of their own (conf/norm/mix.yaml, ...).
NORM_OPTIONS_GROUP = "norm_options"


# What register_schemas stored last: the registries it read (storing builds every schema's node,
# about a fifth of a compose's time, so a process that composes many configs stores them once).
_registered: Optional[tuple] = None


def register_schemas() -> None:
    """Register the schemas with Hydra's ConfigStore: the Config (conf/train.yaml extends
    config_schema), every init scheme's options, from the registry (runner.init.SCHEMES), and
    the options of every norm placement that has its own (runner.model.sublayer.PLACEMENT_OPTIONS).
    Once per process, and again when a registry has changed since."""
    global _registered
    store = ConfigStore.instance()
    registries = (tuple(SCHEMES.items()), tuple(PLACEMENT_OPTIONS.items()))
    if registries == _registered and "config_schema.yaml" in store.repo:
        return
    store.store(name="config_schema", node=Config)
    for name, scheme in SCHEMES.items():
        store.store(group=INIT_OPTIONS_GROUP, name=name, node=scheme.options(name=name))
    for name, cls in PLACEMENT_OPTIONS.items():
        store.store(group=NORM_OPTIONS_GROUP, name=name, node=cls(placement=name))
    _registered = registries


def with_option_classes(cfg: Config) -> Config:
    """cfg with `init` an instance of its scheme's options class and `norm` of its placement's
    (what a composed config's chosen options give, or what a key override switched to)."""
    return with_scheme_options(dataclasses.replace(cfg, norm=with_placement_options(cfg.norm)))


def register_resolvers() -> None:
    """conf/train.yaml names run and sweep-cell folders with these: runner.run.folder.folder_name
    of the task's overrides as Hydra recorded them (the driver names runs and sweeps with it
    too). Registered when this module is imported, so that every process that composes conf/
    has them, a sweep cell's worker included (it imports the Hydra app, which imports this)."""
    for name, cell in (("deepinit_folder", False), ("deepinit_cell_folder", True)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(
                name, lambda task, cell=cell: folder_name([str(o) for o in task], "default", cell=cell))


register_resolvers()


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
        typed = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"cannot compose {' '.join(overrides) or '(defaults)'}: "
                          f"{describe_error(err)}") from err
    return with_option_classes(typed), choices, task


def compose(overrides: Sequence[str] = ()) -> Config:
    """The typed Config for these overrides; a bad override raises ConfigError (one line)."""
    return compose_run(overrides)[0]


# ----------------------------------------------------------------------------- Hydra's errors
def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _dotted_keys(schema: type = Config, prefix: str = "") -> Iterator[str]:
    """Every settable key of a dataclass schema, dotted ("trainer.divergence.patience")."""
    for f in dataclasses.fields(schema):
        name = f"{prefix}{f.name}"
        nested = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(nested, type) and dataclasses.is_dataclass(nested):
            yield from _dotted_keys(nested, f"{name}.")
        else:
            yield name


def _suggest(wrong: str, choices: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(wrong, list(choices), n=3, cutoff=0.6)


def _unknown_key(err: OmegaConfBaseException) -> Optional[str]:
    """"unknown key K (did you mean ...?); P has: ..." for a key the schema does not have."""
    full_key = str(getattr(err, "full_key", "") or "")
    schema = getattr(err, "object_type", None)
    if not full_key or not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return None
    parent, _, leaf = full_key.rpartition(".")
    siblings = [f.name for f in dataclasses.fields(schema)]
    # the same name elsewhere (max_updates=... for trainer.max_updates), else a near spelling
    elsewhere = [] if full_key.startswith("hydra.") else \
        [k for k in _dotted_keys() if k.rsplit(".", 1)[-1] == leaf and k != full_key]
    near = elsewhere or [f"{parent}.{m}" if parent else m for m in _suggest(leaf, siblings)]
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    owners = [name for name, scheme in SCHEMES.items()
              if parent == "init" and leaf in {f.name for f in dataclasses.fields(scheme.options)}]
    if owners:  # another scheme's option (init.omega=scalar without init=admin)
        hint = f" (an option of {' and '.join(f'init={o}' for o in owners)}: choose that scheme first)"
    placements = [name for name in PLACEMENT_OPTIONS if parent == "norm" and leaf in own_option_names(name)]
    if placements:  # a placement's option (norm.mix_ratio=0.5 without norm=mix)
        hint = (f" (an option of norm={placements[0]}: choose that placement first; for one "
                "stack, set the other's with norm.encoder_placement or norm.decoder_placement)")
    where = parent or "the config"
    return f"unknown key {full_key}{hint}; {where} has: {', '.join(siblings)}"


def describe_error(err: BaseException) -> str:
    """One line for an error Hydra or OmegaConf raised while composing the config: what is wrong
    with which override and what would be accepted (the valid keys or options)."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file:
        group, _, option = str(err.missing_cfg_file).rpartition("/")
        options = [str(o) for o in err.options or []]
        if group and options:
            near = _suggest(option, options)
            hint = f" (did you mean {' or '.join(f'{group}={n}' for n in near)}?)" if near else ""
            return f"{group}={option}: no such option{hint}; {group} has: {', '.join(options)}"
        return _first_line(err)
    if isinstance(err, OverrideParseException):
        text = str(err.override or "")
        if text and "=" not in text and not text.startswith("~"):
            return (f"'{text}' is neither an override (key=value) nor a command "
                    "(deepinit --help lists both)")
        lines = [line.strip() for line in str(err.message or err).splitlines() if line.strip()]
        detail = next((line for line in lines if not line.startswith(("Error parsing", "See "))),
                      lines[0] if lines else "")
        return f"cannot parse the override '{text}': {detail} (override syntax: key=value, " \
               "key=a,b for a sweep; quote values with spaces or brackets)"
    cause = err.__cause__
    for candidate in (err, cause):
        if isinstance(candidate, (ConfigAttributeError, ConfigKeyError)):
            line = _unknown_key(candidate)
            if line:
                return line
    first = re.sub(r"^Error merging override |\.$", "", _first_line(err))
    if isinstance(cause, OmegaConfBaseException) and _first_line(cause) not in first:
        return f"{first}: {_first_line(cause)}"
    return first
