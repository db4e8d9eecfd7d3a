"""One residual branch with fixed norm slots, filled once from the placement table.

    out = post_norm( omega * x + alpha * Dropout(branch_norm(branch(c * pre_norm(x)))) )

c is 1 except under LayerNorm Scaling (Slots.pre_norm_scale). Which slots a layer has comes from
`layer_slots`: a placement's PLACEMENTS entry, or its per-layer schedule (SCHEDULES: Mix-LN).

omega (a d-vector, the shortcut scale of Admin/DeepNorm) and alpha (the branch scale of
ReZero/SkipInit, a scalar; a d-vector for LayerScale, ResidualSpec.alpha_vector) always exist, so
every init scheme sees the same state_dict keys; a scheme
writes their values, and the model's ResidualSpec decides at construction whether they are
trained and whether a layer's sublayers share one alpha (ReZero, rztx.py) or each branch has its
own (SkipInit).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields, make_dataclass, replace
from typing import Callable, Optional

import torch
from torch import nn

from runner.config import ConfigError, NormConfig
from runner.config.options import options, recast
from runner.model.dropout import Dropout
from runner.model.norms import make_norm


@dataclass(frozen=True)
class Slots:
    pre_norm: bool  # norm on the branch input (Pre-LN)
    branch_norm: bool  # norm on the branch output before the residual add (Sandwich-LN)
    post_norm: bool  # norm after the residual add (Post-LN)
    final_norm: bool  # norm after the last layer of each stack
    # B2T: the layer input x is added into the last sublayer's post_norm, y = LN(x + h + FFN(h))
    # (Takase et al., Findings of ACL 2023; takase/b2t_connection transformer_layer.py)
    bottom_to_top: bool = False
    # ResiDual: a second, unnormalized stream d_{k+1} = d_k + s F_k; the stack outputs
    # alpha x_N + final_norm(d_N) (Xie et al. 2023; microsoft/ResiDual resi_dual.py)
    dual: bool = False
    # Peri-LN: a norm on the embedding output, before the first layer (a stack-level slot, as
    # final_norm; Kim et al., ICML 2025)
    embedding_norm: bool = False
    # LayerNorm Scaling: pre_norm's output is multiplied by this, 1/sqrt(l) in layer l (1-based)
    # of its stack (Sun et al. 2025); 1.0 = no multiplication (every placement's default)
    pre_norm_scale: float = 1.0


# As fairseq/models/transformer.py: Post-LN has no final norm; Pre-LN does (fairseq
# normalize_before); sandwich is Pre-LN plus a norm on the branch output (CogView's Sandwich-LN).
# b2t is Post-LN plus the bottom-to-top shortcut; resi_dual is Post-LN on x plus the dual stream,
# whose final_norm is the LN(d_N) of the output. peri is sandwich plus a norm on the embedding
# output (Peri-LN). mix's entry holds its stack-level slots (Pre-LN's: a final norm, since its
# last layers are Pre-LN); its layers' slots come from its schedule in SCHEDULES.
PLACEMENTS = {
    "post": Slots(pre_norm=False, branch_norm=False, post_norm=True, final_norm=False),
    "pre": Slots(pre_norm=True, branch_norm=False, post_norm=False, final_norm=True),
    "none": Slots(pre_norm=False, branch_norm=False, post_norm=False, final_norm=False),
    "sandwich": Slots(pre_norm=True, branch_norm=True, post_norm=False, final_norm=True),
    "b2t": Slots(pre_norm=False, branch_norm=False, post_norm=True, final_norm=False,
                 bottom_to_top=True),
    "resi_dual": Slots(pre_norm=False, branch_norm=False, post_norm=True, final_norm=True,
                       dual=True),
    "peri": Slots(pre_norm=True, branch_norm=True, post_norm=False, final_norm=True,
                  embedding_norm=True),
    "mix": Slots(pre_norm=True, branch_norm=False, post_norm=False, final_norm=True),
}


# ----------------------------------------------------------------------------- placement options
# A placement that reads options of its own declares them here, as a subclass of NormConfig;
# conf/norm/<placement>.yaml names the schema (`defaults: [/norm_options/<placement>@_here_,
# _self_]`, registered by runner/cli/compose.py from PLACEMENT_OPTIONS), so `norm.mix_ratio` is a
# key of norm=mix only. The user keys are the ones NormConfig once held (norm.mix_ratio, ...).
@options
@dataclass
class MixOptions(NormConfig):
    # Mix-LN (Li et al. 2024): Post-LN in the first floor(mix_ratio * L) layers of each stack (L
    # its depth), Pre-LN in the rest; in [0, 1], 0.25 as the paper recommends
    mix_ratio: float = 0.25


@options
@dataclass
class ResiDualOptions(NormConfig):
    # s in d_{k+1} = d_k + s F_k, d_0 = s x_0 (Xie et al. 2023, ResiDual; microsoft/ResiDual
    # res_input_norm_scale: 1.0 in hydra_config/iwslt.yaml, 0.05 in the fp16 opus.yaml)
    resi_dual_scale: float = 1.0
    # alpha in the output alpha x_N + LN(d_N) (microsoft/ResiDual resi_dual.py enc_alpha /
    # dec_alpha, default 1.0)
    resi_dual_alpha: float = 1.0


@options
@dataclass
class B2TOptions(NormConfig):
    # scale every branch weight by (layers of its stack)^-1/2 after the init scheme
    # (takase/b2t_connection@c8e2ad4 fairseq/modules/transformer_layer.py rescaling_init;
    # false = the revision before 4d80167, no rescaling; runner/init/b2t.py applies it)
    b2t_rescale_init: bool = True


# placement -> its options class; a placement not listed reads only NormConfig's fields
PLACEMENT_OPTIONS: dict[str, type[NormConfig]] = {
    "mix": MixOptions, "resi_dual": ResiDualOptions, "b2t": B2TOptions}


def _joined_options() -> dict[tuple[str, ...], type[NormConfig]]:
    """One class for each set of two or more placements with options, for configs whose stacks
    differ (norm=resi_dual norm.decoder_placement=b2t reads both): made at import, with a module
    name, so that a config holding one pickles (DDP workers) like any other."""
    joined = {}
    for k in range(2, len(PLACEMENT_OPTIONS) + 1):
        for names in itertools.combinations(sorted(PLACEMENT_OPTIONS), k):
            name = "".join(PLACEMENT_OPTIONS[n].__name__.removesuffix("Options") for n in names) + "Options"
            cls = options(make_dataclass(name, [], bases=tuple(PLACEMENT_OPTIONS[n] for n in names)))
            cls.__module__, cls.__qualname__ = __name__, name
            globals()[name] = joined[names] = cls
    return joined


_JOINED_OPTIONS = _joined_options()


def norm_options_class(*placements: Optional[str]) -> type[NormConfig]:
    """The options dataclass of a config whose stacks use these placements (None: no per-stack
    override): NormConfig when none reads options of its own, else the one class holding every
    such placement's options."""
    names = tuple(sorted({p for p in placements if p in PLACEMENT_OPTIONS}))
    if not names:
        return NormConfig
    return PLACEMENT_OPTIONS[names[0]] if len(names) == 1 else _JOINED_OPTIONS[names]


def placements_in_use(norm: NormConfig) -> tuple[str, ...]:
    """norm.placement and the per-stack overrides that are set."""
    return tuple(p for p in (norm.placement, norm.encoder_placement, norm.decoder_placement) if p)


def norm_options_for(placement: str, **values) -> NormConfig:
    """The placement's options with these fields set, the others at their defaults."""
    return norm_options_class(placement)(placement=placement, **values)


def own_option_names(placement: str) -> tuple[str, ...]:
    """The keys a placement adds to NormConfig (norm.mix_ratio for mix)."""
    base = {f.name for f in fields(NormConfig)}
    return tuple(f.name for f in fields(norm_options_class(placement)) if f.name not in base)


def with_placement_options(norm: NormConfig) -> NormConfig:
    """`norm` as an instance of the options class of the placements it uses. Composition gives the
    class of the chosen conf/norm option; a per-stack override (norm.decoder_placement=b2t) or
    `norm.placement=<p>` over another option keeps the fields the two classes share and starts
    the new placement's options at their defaults."""
    return recast(norm, norm_options_class(*placements_in_use(norm)))


def check_placement_options(norm: NormConfig) -> None:
    """The values of the placements' own options; raises ConfigError naming the key."""
    if isinstance(norm, MixOptions) and not 0.0 <= norm.mix_ratio <= 1.0:
        raise ConfigError(f"norm.mix_ratio={norm.mix_ratio}: expected a value in [0, 1] (the "
                          "fraction of each stack's layers that are Post-LN; the paper uses 0.25)")
    if isinstance(norm, ResiDualOptions):
        for key in ("resi_dual_scale", "resi_dual_alpha"):
            if getattr(norm, key) < 0:
                raise ConfigError(f"norm.{key}={getattr(norm, key)}: expected a value >= 0")


def dual_scale(norm: NormConfig) -> float:
    """ResiDual's s for a stack's layers (1.0, unused, when no stack is ResiDual)."""
    return norm.resi_dual_scale if isinstance(norm, ResiDualOptions) else 1.0


def mix_post_layers(mix_ratio: float, num_layers: int) -> int:
    """Mix-LN's count of Post-LN layers, floor(mix_ratio * L) (Li et al. 2024; the
    reference's POST_NUM first layers). Rounded to 9 decimals first so that a ratio written in
    decimal floors as written (0.29 * 100 is 28.999999999999996 in binary)."""
    return math.floor(round(mix_ratio * num_layers, 9))


def mix_without_post_ln(norm: NormConfig, stacks: dict[str, int]) -> list[str]:
    """One line per stack ({side: layers}) where Mix-LN's ratio gives no Post-LN layer at all:
    floor(mix_ratio * L) = 0 makes that stack plain Pre-LN, which a run should say."""
    ratio = getattr(norm, "mix_ratio", 0.0)
    return [f"norm.mix_ratio={ratio:g} gives the {layers}-layer {side} no Post-LN layer "
            f"(floor({ratio:g} x {layers}) = 0): that stack trains as Pre-LN"
            for side, layers in stacks.items()
            if stack_placement(norm, side) == "mix" and ratio > 0 and mix_post_layers(ratio, layers) == 0]


def mix_schedule(norm: NormConfig, layer_index: int, num_layers: int) -> Slots:
    """Mix-LN: Post-LN slots in layers 0 .. floor(mix_ratio * L) - 1, Pre-LN slots in the rest."""
    post = layer_index < mix_post_layers(norm.mix_ratio, num_layers)
    return PLACEMENTS["post" if post else "pre"]


# Per-layer placement schedules: (norm config, 0-based layer index, layers in the stack) -> that
# layer's slots. A placement without a schedule gives every layer its PLACEMENTS entry; with one,
# its PLACEMENTS entry still gives the stack-level slots (final_norm, embedding_norm, dual).
SCHEDULES: dict[str, Callable[[NormConfig, int, int], Slots]] = {"mix": mix_schedule}


def stack_placement(norm: NormConfig, side: str) -> str:
    """The placement of one stack (encoder | decoder): its per-stack override or `placement`."""
    return getattr(norm, f"{side}_placement") or norm.placement


def stack_slots(norm: NormConfig, side: str) -> Slots:
    """The stack-level slots (final_norm, embedding_norm, dual) of one stack."""
    return PLACEMENTS[stack_placement(norm, side)]


def layer_slots(norm: NormConfig, side: str, layer_index: int, num_layers: int) -> Slots:
    """The slots of layer `layer_index` (0-based) of a stack of `num_layers`: its placement's
    schedule when it has one, its PLACEMENTS entry otherwise; with norm.layernorm_scaling, a
    layer with a pre_norm gets pre_norm_scale = 1/sqrt(layer_index + 1) (LayerNorm Scaling)."""
    name = stack_placement(norm, side)
    schedule = SCHEDULES.get(name)
    slots = PLACEMENTS[name] if schedule is None else schedule(norm, layer_index, num_layers)
    if norm.layernorm_scaling and slots.pre_norm:
        slots = replace(slots, pre_norm_scale=1.0 / math.sqrt(layer_index + 1))
    return slots


class DualStream:
    """ResiDual's second stream inside one layer call: each sublayer adds s * F_k to `value`
    (microsoft/ResiDual resi_dual_layers.py: res = res + x * res_input_norm_scale). Created per
    layer call from the layer's tensor argument, so activation checkpointing recomputes the same
    values (the layer stays a function of its tensor inputs), and a Sublayer still returns one
    tensor (the analysis hooks read it)."""

    def __init__(self, value: torch.Tensor, scale: float):
        self.value, self.scale = value, scale

    def add(self, branch: torch.Tensor) -> None:
        self.value = self.value + branch * self.scale


# eps of ResiDual's LN(d_N) (microsoft/ResiDual resi_dual.py: LayerNorm(embed_dim, eps=1e-7))
RESI_DUAL_FINAL_EPS = 1e-7


class ResiDualOutput(nn.Module):
    """ResiDual's stack output alpha * x_N + LN(d_N), given LN(d_N) (Xie et al. 2023; microsoft/
    ResiDual resi_dual.py: x = x * enc_alpha + self.layer_norm(res)). No parameters: LN(d_N) is
    the stack's final_norm slot, so the state_dict keys are those of Pre-LN. A module so that
    analysis hooks can read the stack output."""

    def __init__(self, scale: float, alpha: float):
        super().__init__()
        self.scale, self.alpha = scale, alpha

    def forward(self, x: torch.Tensor, normed_dual: torch.Tensor) -> torch.Tensor:
        return x * self.alpha + normed_dual

    def extra_repr(self) -> str:
        return f"scale={self.scale}, alpha={self.alpha}"


@dataclass(frozen=True)
class ResidualSpec:
    """Which residual scales train; declared by the init scheme, fixed at model construction."""

    omega_trainable: bool = False
    omega_vector: bool = True  # False: one scalar per sublayer (Admin's scalar option)
    alpha_trainable: bool = False
    alpha_per_layer: bool = True  # one alpha shared by a layer's sublayers (rztx.py); False: per branch
    # True: alpha is a d-vector, a per-channel branch scale (LayerScale's diag(lambda), Touvron
    # et al. 2021, Eq. 2); the only spec that changes alpha's shape in the state_dict
    alpha_vector: bool = False


class Sublayer(nn.Module):
    def __init__(self, branch: nn.Module, dim: int, slots: Slots, norm_kind: str, eps: float,
                 dropout: float, residual: ResidualSpec):
        super().__init__()
        identity = nn.Identity
        self.pre_norm = make_norm(norm_kind, dim, eps) if slots.pre_norm else identity()
        self.pre_norm_scale = slots.pre_norm_scale  # a float, not a parameter: no state_dict key
        self.branch = branch
        self.branch_norm = make_norm(norm_kind, dim, eps) if slots.branch_norm else identity()
        self.dropout = Dropout(dropout)
        self.post_norm = make_norm(norm_kind, dim, eps) if slots.post_norm else identity()
        self.omega = nn.Parameter(torch.ones(dim if residual.omega_vector else 1),
                                  requires_grad=residual.omega_trainable)
        self.alpha = nn.Parameter(torch.ones(dim if residual.alpha_vector else 1),
                                  requires_grad=residual.alpha_trainable)
        self._unit_key: tuple = ()  # what _unit_residual last looked at, and its answer
        self._unit = False

    def _unit_residual(self) -> bool:
        """True when omega and alpha are frozen at one, so the residual is a plain add: two
        fewer element-wise passes over (B, T, D), forward and backward (on an H200 the general
        path's addcmul alone took 3% of a base model's eager GPU time). Schemes and
        checkpoints write these values in place after construction, so the answer is kept with
        the tensors' version counters (bumped by every in-place write) and storage, and looked up
        again only when one of them changed: on CUDA that look-up syncs the host, once per
        change rather than per call. Under torch.compile the general path, which compile fuses."""
        if torch.compiler.is_compiling() or self.omega.requires_grad or self.alpha.requires_grad:
            return False
        key = (self.omega._version, self.alpha._version, self.omega.data_ptr(), self.alpha.data_ptr(),
               self.omega.device, self.alpha.device)
        if key != self._unit_key:
            # one host sync (a rezero ramp writes alpha every update until it reaches 1)
            self._unit = bool(torch.logical_and((self.omega == 1).all(), (self.alpha == 1).all()))
            self._unit_key = key
        return self._unit

    def forward(self, x: torch.Tensor, bottom: Optional[torch.Tensor] = None,
                dual: Optional[DualStream] = None, **branch_kwargs) -> torch.Tensor:
        z = self.pre_norm(x)
        if self.pre_norm_scale != 1.0:  # LayerNorm Scaling; skipped otherwise, so bit-identical
            z = z * self.pre_norm_scale
        h = self.dropout(self.branch_norm(self.branch(z, **branch_kwargs)))
        if bottom is not None or dual is not None:
            return self._bottom_or_dual(x, h, bottom, dual)
        if self._unit_residual():
            return self.post_norm(x + h)  # bitwise equal to the general path with ones
        return self.post_norm(torch.addcmul(h * self.alpha, x, self.omega))

    def _bottom_or_dual(self, x: torch.Tensor, h: torch.Tensor, bottom: Optional[torch.Tensor],
                        dual: Optional[DualStream]) -> torch.Tensor:
        """B2T: post_norm(omega * x + alpha * h + bottom), bottom the layer's input. ResiDual:
        post_norm(omega * x + alpha * h), and the dual stream gains s * alpha * h (F_k is the
        branch as it enters the residual add: after dropout and alpha)."""
        unit = self._unit_residual()
        branch = h if unit else h * self.alpha
        total = x + branch if unit else torch.addcmul(branch, x, self.omega)
        if bottom is not None:
            total = total + bottom
        if dual is not None:
            dual.add(branch)
        return self.post_norm(total)
