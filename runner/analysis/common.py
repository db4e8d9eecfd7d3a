"""What every analysis command shares: configurations from overrides or a run folder, the
fixed input batch, a freshly initialized model exactly as `deepinit train` builds it, and the
JSON/PNG/summary output."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from runner.config import ConfigError, validate
from runner.data.batching import Batch, collate


@dataclass
class Setting:
    """One configuration to analyse: a label, its overrides and the typed Config. `run_dir` is
    set when it comes from a finished run folder (its checkpoints can then be analysed)."""

    label: str
    overrides: list[str]
    cfg: Any
    run_dir: Optional[Path] = None
    checkpoints: list[Path] = field(default_factory=list)


def compose(overrides: list[str]):
    """The typed Config for these overrides, composed from conf/ exactly as the CLI does."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from runner.cli import config_dir
    from runner.config import register_schemas

    register_schemas()
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            cfg = hydra_compose(config_name="train", overrides=list(overrides))
        cfg = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"cannot compose {' '.join(overrides) or '(defaults)'}: {err}") from err
    validate(cfg)
    return cfg


def is_run_dir(path: str) -> bool:
    p = Path(path)
    return p.is_dir() and (p / ".hydra" / "config.yaml").is_file()


def load_run(run_dir: Path):
    """A finished run's typed Config (from .hydra/config.yaml) and its checkpoints in step
    order (numbered ones, then checkpoint_last.pt when its step is not among them)."""
    from omegaconf import OmegaConf

    from runner import checkpoint as ckpt
    from runner.config import Config

    raw = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), raw))
    validate(cfg)
    paths = list(ckpt.numbered_checkpoints(run_dir))
    last = run_dir / ckpt.LAST
    if last.is_file():
        steps = {_step_of(p) for p in paths}
        if int(torch.load(last, map_location="cpu", weights_only=False)["step"]) not in steps:
            paths.append(last)
    return cfg, paths


def _step_of(path: Path) -> Optional[int]:
    stem = path.stem.rsplit("_", 1)[-1]
    return int(stem) if stem.isdigit() else None


def settings_from(configs: list[str], common: list[str], defaults: list[str]) -> list[Setting]:
    """--config strings (each a space-separated override list, or a run folder) with the
    common overrides appended; `defaults` when no --config was given."""
    out = []
    for text in (configs or defaults):
        if is_run_dir(text):
            run_dir = Path(text)
            cfg, ckpts = load_run(run_dir)
            out.append(Setting(run_dir.name, [], cfg, run_dir, ckpts))
            continue
        overrides = shlex.split(text) + list(common)
        out.append(Setting(text or "defaults", overrides, None))
    return out


def for_depth(setting: Setting, extra: list[str]):
    """The setting's Config with `extra` overrides (e.g. model.layers=N) applied on top."""
    if setting.run_dir is not None:
        if not extra:
            return setting.cfg
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        try:
            merged = OmegaConf.merge(OmegaConf.structured(setting.cfg), OmegaConf.from_dotlist(extra))
            cfg = OmegaConf.to_object(merged)
        except OmegaConfBaseException as err:
            raise ConfigError(f"{setting.run_dir}: cannot apply {' '.join(extra)}: {err}") from err
        validate(cfg)
        return cfg
    return compose(setting.overrides + extra)


_DATA_CACHE: dict[str, Any] = {}


def data_for(cfg):
    """Built once per data config: the toy generator takes seconds per call."""
    from runner.data import build_data

    key = repr(cfg.data)
    if key not in _DATA_CACHE:
        _DATA_CACHE[key] = build_data(cfg.data)
    return _DATA_CACHE[key]


def input_batch(cfg, sentences: int, seed: int = 0) -> Batch:
    """A fixed input x0: `sentences` training pairs drawn with `seed` (same for every depth and
    configuration that shares the data config), right-padded as in training."""
    data = data_for(cfg)
    split = data.splits[cfg.data.train_split]
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(split), size=min(sentences, len(split)), replace=False)
    return collate(split, np.sort(idx), data.tgt_dict.pad_index, data.tgt_dict.eos_index)


def first_train_batch(cfg) -> Batch:
    """The batch Trainer.initialize gives the init scheme (Admin profiles it)."""
    from runner.data.batching import filter_by_length, make_batches

    data = data_for(cfg)
    split = data.splits[cfg.data.train_split]
    keep = filter_by_length(split, cfg.data.max_source_positions, cfg.data.max_target_positions)
    batches = make_batches(split, cfg.data.max_tokens, keep, seed=cfg.trainer.seed)
    return collate(split, batches[0], data.tgt_dict.pad_index, data.tgt_dict.eos_index)


def fresh_model(cfg, seed: Optional[int] = None):
    """The model `deepinit train` would start from with trainer.seed = seed: the same RNG order
    (seed, build, init scheme on the first training batch). Activation checkpointing is off so
    forward hooks fire once per forward."""
    import copy

    from runner import init as init_schemes
    from runner.model.seq2seq import build_model

    cfg = copy.deepcopy(cfg)
    cfg.model.activation_checkpointing = False
    if seed is not None:
        cfg.trainer.seed = seed
    data = data_for(cfg)
    torch.manual_seed(cfg.trainer.seed)
    model = build_model(cfg, len(data.src_dict), len(data.tgt_dict), data.tgt_dict.pad_index)
    init_schemes.apply(model, cfg, first_train_batch(cfg))
    return model


def model_from_checkpoint(cfg, path: Path):
    import copy

    from runner.model.seq2seq import build_model

    cfg = copy.deepcopy(cfg)
    cfg.model.activation_checkpointing = False
    data = data_for(cfg)
    model = build_model(cfg, len(data.src_dict), len(data.tgt_dict), data.tgt_dict.pad_index)
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    return model, int(state.get("step", 0))


def loss_of(model, cfg, batch: Batch) -> torch.Tensor:
    """The training objective per target token (label-smoothed, as Trainer computes it)."""
    from runner.loss import label_smoothed_nll

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


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=_jsonable) + "\n")


def _jsonable(obj):
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
