"""What a composed config leaves to the run, filled in before the run is checked.

`warmup=auto` (conf/warmup/auto.yaml, the default) leaves warmup.updates null: the init scheme's
warmup. A scheme that trains without warmup (T-Fixup: `InitScheme.warmup_updates`) gets its own
value unless the user picked a warmup: another warmup option (warmup=default|none), a value for
warmup.updates (on the command line or in a sweep preset), or a warmup.init_lr other than auto's.
Every other run gets warmup=default's updates (conf/warmup/default.yaml). The run layer calls
`resolve_warmup` with the scheme's value (runner/run/build.py `resolve_config`), so every way of
building a run (`deepinit train`, a tool, a test calling the run layer) trains with the same
warmup.
"""
from __future__ import annotations

from typing import Optional

from omegaconf import OmegaConf

from runner.config.paths import config_dir
from runner.config.schema import Config


def is_resolved(cfg: Config) -> bool:
    """Whether the config leaves nothing to the run (warmup.updates is set)."""
    return cfg.warmup.updates is not None


def _option(name: str):
    return OmegaConf.load(config_dir() / "warmup" / f"{name}.yaml")


def resolve_warmup(cfg: Config, scheme_updates: Optional[int]) -> Optional[str]:
    """Fill in warmup.updates when warmup=auto left it null (in place). `scheme_updates`: the init
    scheme's warmup, None when it has no opinion. Returns the line that says what the scheme chose
    when that differs from the default, else None."""
    if is_resolved(cfg):
        return None
    default = _option("default").updates
    picked = cfg.warmup.init_lr != _option("auto").init_lr  # warmup.init_lr=X: a warmup of one's own
    if scheme_updates is None or picked:
        cfg.warmup.updates = default
        return None
    cfg.warmup.updates = scheme_updates
    if scheme_updates == default:
        return None
    return (f"init={cfg.init.name} trains without warmup: warmup.updates={scheme_updates} (set "
            "warmup.updates=N to use one)")
