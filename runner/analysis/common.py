"""What every analysis command shares: configurations from overrides or a run folder, the
fixed input batch, a freshly initialized model built by the run assembly exactly as
`deepinit train` builds it, and the JSON/PNG/summary output."""
from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from runner.config import Config, ConfigError, config_from_yaml, with_dotlist
from runner.data import build_data
from runner.data.batching import Batch, collate
from runner.data.dataset import TranslationData
from runner.init import options_class
from runner.model.loss import label_smoothed_nll
from runner.model.sublayer import norm_options_class
from runner.run import build, folder
from runner.run.build import check_config


@dataclass
class Setting:
    """One configuration to analyse: a label, its overrides and how to make its Config with
    extra overrides on top (`make_config`, from the CLI's composition or a run folder's config).
    `run_dir` is set when it comes from a finished run folder (its checkpoints can then be
    analysed)."""

    label: str
    overrides: list[str]
    make_config: Callable[[list[str]], Config]
    run_dir: Optional[Path] = None
    checkpoints: list[Path] = field(default_factory=list)


def is_run_dir(path: str) -> bool:
    p = Path(path)
    return p.is_dir() and (p / ".hydra" / "config.yaml").is_file()


def load_run(run_dir: Path) -> tuple[Config, list[Path]]:
    """A finished run's typed Config (from .hydra/config.yaml) and its checkpoints in step
    order (numbered ones, then checkpoint_last.pt when its step is not among them)."""
    cfg = config_from_yaml(run_dir / ".hydra" / "config.yaml", options_class, norm_options_class)
    check_config(cfg)
    paths = list(folder.numbered_checkpoints(run_dir))
    last = run_dir / folder.LAST
    if last.is_file():
        steps = {_step_of(p) for p in paths}
        if int(folder.load_checkpoint(last)["step"]) not in steps:
            paths.append(last)
    return cfg, paths


def _step_of(path: Path) -> Optional[int]:
    stem = path.stem.rsplit("_", 1)[-1]
    return int(stem) if stem.isdigit() else None


def settings_from(configs: list[str], common: list[str], defaults: list[str],
                  compose: Callable[[list[str]], Config]) -> list[Setting]:
    """--config strings (each a space-separated override list, or a run folder) with the
    common overrides appended (refused beside a run folder); `defaults` when no --config was
    given. `compose` makes a Config from overrides (the CLI's composition)."""
    runs = [text for text in configs if is_run_dir(text)]
    if runs and common:
        # a run folder's config is the one it trained with: an override would analyse another
        # model than its checkpoints hold
        raise ConfigError(f"{common[0]!r}: key=value overrides apply to --config configurations, "
                          f"not to a run folder ({runs[0]}), which keeps the config it trained with")
    out = []
    for text in (configs or defaults):
        if is_run_dir(text):
            run_dir = Path(text)
            cfg, ckpts = load_run(run_dir)
            out.append(Setting(run_dir.name, [], _from_run(run_dir, cfg), run_dir, ckpts))
            continue
        overrides = shlex.split(text) + list(common)
        out.append(Setting(text or "defaults", overrides, _from_overrides(overrides, compose)))
    return out


def _from_overrides(overrides: list[str], compose) -> Callable[[list[str]], Config]:
    def make(extra: list[str]) -> Config:
        cfg = compose(overrides + list(extra))
        check_config(cfg)
        return cfg
    return make


def _from_run(run_dir: Path, cfg: Config) -> Callable[[list[str]], Config]:
    def make(extra: list[str]) -> Config:
        try:
            out = with_dotlist(cfg, extra)
        except ConfigError as err:
            raise ConfigError(f"{run_dir}: {err}") from err
        check_config(out)
        return out
    return make


def for_depth(setting: Setting, extra: list[str]) -> Config:
    """The setting's Config with `extra` overrides (e.g. model.layers=N) applied on top."""
    return setting.make_config(extra)


_DATA_CACHE: dict[str, Any] = {}


def data_for(cfg: Config) -> TranslationData:
    """Built once per data config: the toy generator takes seconds per call."""
    key = repr(cfg.data)
    if key not in _DATA_CACHE:
        _DATA_CACHE[key] = build_data(cfg.data)
    return _DATA_CACHE[key]


def input_batch(cfg: Config, sentences: int, seed: int = 0) -> Batch:
    """A fixed input x0: `sentences` training pairs drawn with `seed` (same for every depth and
    configuration that shares the data config), right-padded as in training."""
    data = data_for(cfg)
    split = data.splits[cfg.data.train_split]
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(split), size=min(sentences, len(split)), replace=False)
    return collate(split, np.sort(idx), data.tgt_dict.pad_index, data.tgt_dict.eos_index)


def _without_checkpointing(cfg: Config, seed: Optional[int] = None) -> Config:
    """Activation checkpointing off, so forward hooks fire once per forward."""
    cfg = copy.deepcopy(cfg)
    cfg.model.activation_checkpointing = False
    if seed is not None:
        cfg.trainer.seed = seed
    return cfg


def fresh_model(cfg: Config, seed: Optional[int] = None):
    """The model `deepinit train` would start from with trainer.seed = seed (the run
    assembly's own build: seed, model, init scheme on the first training batch)."""
    cfg = _without_checkpointing(cfg, seed)
    model, _ = build.fresh_model(cfg, data_for(cfg))
    return model


def model_from_checkpoint(cfg: Config, path: Path):
    cfg = _without_checkpointing(cfg)
    data = data_for(cfg)
    model = build.model_for(cfg, len(data.src_dict), len(data.tgt_dict), data.tgt_dict.pad_index)
    state = folder.load_checkpoint(path)
    model.load_state_dict(state["model"])
    return model, int(state.get("step", 0))


def loss_of(model, cfg: Config, batch: Batch) -> torch.Tensor:
    """The training objective per target token (label-smoothed, as the train loop computes it)."""
    logits = model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)
    loss, _ = label_smoothed_nll(logits, batch.target, cfg.trainer.label_smoothing,
                                 model.pad_index)
    return loss / batch.ntokens


def parse_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{text!r}: expected comma-separated integers") from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"{text!r}: expected positive integers")
    return values


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported on first plot: it is slow to load)."""
    import matplotlib  # noqa: PLC0415 (+0.5 s at import; only plots need it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (see above)

    return plt
