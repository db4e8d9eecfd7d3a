"""The interface every init scheme implements, and the model surface it may touch.

A scheme writes values into slots the model already has (weights, omega, alpha); it never changes
the model's structure, so state_dict keys are the same under every scheme. What a scheme needs
from the model is the `ModelSurface` protocol below; what the model needs from a scheme (which
residual scales train) is the `ResidualSpec` the scheme declares, handed to the model's builder
by the run assembly. The model never imports this package.

A scheme may also give the optimizer parameter groups (`param_groups`: learning-rate and Adam
eps multipliers per parameter, Depth-muP's corrections); the run assembly hands them to
runner.train.optim.build_optimizer, and the train loop multiplies each group's lr by its own
multiplier.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Optional, Protocol

import torch
from torch import nn

from runner.config import InitConfig
from runner.model.sublayer import ResidualSpec

# The roles of a model's tensors that `InitScheme.changes` names (fnmatch patterns over them):
# "<side>.<kind>.<q|k|v|out|fc1|fc2>" (branch weights), "<side>.<kind>.omega",
# "<side>.<kind>.alpha" with side encoder|decoder and kind self_attn|cross_attn|ffn, and
# "embedding.<encoder|decoder|output>" (the token tables and the output matrix).
BRANCH_WEIGHTS = ("*.q", "*.k", "*.v", "*.out", "*.fc1", "*.fc2")


class SublayerHandle(Protocol):
    """One residual branch: out = post_norm(omega * x + alpha * dropout(branch(pre_norm(x))))."""

    side: str  # encoder | decoder
    layer: int  # 0-based within its stack
    kind: str  # self_attn | cross_attn | ffn
    module: nn.Module  # .branch (q/k/v/out_proj or fc1/fc2), .omega, .alpha, .dropout

    @property
    def alpha(self) -> nn.Parameter: ...

    @property
    def name(self) -> str: ...


class ModelSurface(Protocol):
    """What init schemes and diagnostics may use of a model (runner.model.seq2seq.Seq2Seq)."""

    cfg: Any  # the ModelConfig: dim, heads, num_encoder_layers, num_decoder_layers, ...
    pad_index: Optional[int]  # None: a language model's blocks have no padding
    decoder_only: bool  # True: one causal stack (runner.model.lm.DecoderOnlyLM), no encoder
    training: bool

    def sublayers(self) -> Iterator[SublayerHandle]: ...

    def embedding_tables(self) -> dict[str, nn.Parameter]: ...

    def norms(self) -> Iterator[tuple[str, nn.Module]]: ...

    def __call__(self, src_tokens: torch.Tensor, prev_tokens: torch.Tensor,
                 src_has_pad: bool = True) -> torch.Tensor: ...

    def train(self, mode: bool = True) -> Any: ...  # nn.Module's (Admin profiles in train mode)

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def after_init(self) -> None: ...  # weight-dependent state (sigma-reparam), once weights are final


class InitScheme:
    """Base class of the schemes. Subclasses set `name` and `placements` and implement `apply`;
    the other hooks have neutral defaults.

    options: its typed options, the dataclass `cfg.init` is an instance of: a subclass of
      runner.config.InitConfig declared in the scheme's file (choices as Literal types,
      @runner.config.options.options), named by conf/init/<name>.yaml's defaults list.
    changes: what apply() changes relative to the xavier baseline from the same seed, as role
      patterns (BRANCH_WEIGHTS above); tests/init/test_structure.py checks it.
    placements: the norm placements the scheme is defined for. Both stacks' placements (with
      norm.encoder_placement / norm.decoder_placement) must be among them; None = any.
    requirements(cfg): further rules, one line per violation, each naming the override to change.
    residual(cfg): which residual scales train (fixed when the model is built).
    apply(model, cfg, batch): write the initial values; `batch` is the first training batch
      (Admin profiles it). Returns the report written to init.json.
    on_update(model, step, cfg): called after every optimizer update when `updates_during_training`
      is True for this config (alpha ramps).
    param_groups(model, cfg): optimizer parameter groups with their lr and eps multipliers, or
      None (one group, the configured lr and eps: every scheme but depth_mup).
    """

    name: ClassVar[str] = ""
    options: ClassVar[type[InitConfig]] = InitConfig
    changes: ClassVar[tuple[str, ...]] = ()
    placements: ClassVar[Optional[tuple[str, ...]]] = None
    placement_hint: ClassVar[str] = ""  # why the placement is required, for the error line
    # The tasks (config `task`) the scheme states a rule for; a decoder-only LM needs a rule for
    # one stack of self-attention and FFN branches (runner/model/lm.py).
    tasks: ClassVar[tuple[str, ...]] = ("translation",)
    task_hint: ClassVar[str] = ""  # why the scheme has no rule for the other tasks, for the error line
    # The warmup the scheme is meant to train with, applied when the config leaves the warmup to
    # the scheme (warmup=auto, the default: runner/config/resolve.py); None = no opinion
    # (warmup=default's updates).
    warmup_updates: ClassVar[Optional[int]] = None

    def requirements(self, cfg) -> list[str]:
        return []

    def residual(self, cfg) -> ResidualSpec:
        return ResidualSpec()

    def apply(self, model: ModelSurface, cfg, batch=None) -> dict:
        raise NotImplementedError

    def updates_during_training(self, cfg) -> bool:
        return False

    def on_update(self, model: ModelSurface, step: int, cfg) -> None:
        return None

    def param_groups(self, model: ModelSurface, cfg) -> Optional[list["ParamGroup"]]:
        return None


@dataclass
class ParamGroup:
    """Parameters the optimizer treats alike: lr = schedule's lr * lr_scale at every update,
    Adam/RAdam eps = optim.eps * eps_scale (SGD has no eps). Groups must cover every trainable
    parameter once."""

    name: str
    params: list[nn.Parameter]
    lr_scale: float = 1.0
    eps_scale: float = 1.0


def stack_placements(cfg) -> dict[str, str]:
    """The norm placement of each stack (per-stack overrides included)."""
    norm = cfg.norm
    return {"encoder": norm.encoder_placement or norm.placement,
            "decoder": norm.decoder_placement or norm.placement}


def task_problems(scheme: InitScheme, cfg) -> list[str]:
    """One line when the scheme states no rule for the configured task."""
    task = getattr(cfg, "task", "translation")
    if task in scheme.tasks:
        return []
    why = f": {scheme.task_hint}" if scheme.task_hint else ""
    return [f"init={scheme.name} has no rule for task={task}{why}; use "
            f"{' or '.join('task=' + t for t in scheme.tasks)}, or an init scheme that has one"]


def placement_problems(scheme: InitScheme, cfg) -> list[str]:
    """One line for the placement the scheme does not define, on either stack."""
    if scheme.placements is None:
        return []
    allowed = " or ".join(f"norm={p}" for p in scheme.placements)
    hint = f" ({scheme.placement_hint})" if scheme.placement_hint else ""
    if cfg.norm.placement not in scheme.placements:
        return [f"init={scheme.name} is defined for {allowed} only{hint}, not "
                f"norm={cfg.norm.placement}: use {allowed}"]
    for side, placement in stack_placements(cfg).items():
        if placement not in scheme.placements:
            return [f"init={scheme.name} is defined for {allowed} only{hint}, on both stacks, "
                    f"not norm.{side}_placement={placement}: use {allowed} and unset "
                    f"norm.{side}_placement"]
    return []
