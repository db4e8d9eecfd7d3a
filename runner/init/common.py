"""Building blocks shared by the schemes: the baseline fill and selection by role."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from runner.model.norms import DynamicTanh, ScaleNorm
from runner.model.sublayer import Sublayer

# fairseq's separate q/k/v carry gain 1/sqrt(2) so that the fused (3d x d) Xavier bound
# sqrt(6/(4d)) is kept per matrix (fairseq/modules/multihead_attention.py reset_parameters in the
# layer6ai-labs/T-Fixup and LiyuanLucasLiu/Transformer-Clinic forks).
QKV_GAIN = 1 / math.sqrt(2)


def attention_projections(module: Sublayer) -> dict[str, nn.Linear]:
    attn = module.branch
    return {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj, "out": attn.out_proj}


def stack_sides(model) -> tuple[str, ...]:
    """The stacks the model has, of ("encoder", "decoder"): both for translation, the decoder
    alone for the decoder-only LM (what init.json reports per stack)."""
    present = {ref.side for ref in model.sublayers()}
    return tuple(side for side in ("encoder", "decoder") if side in present)


@torch.no_grad()
def init_embedding(weight: torch.Tensor, dim: int, pad_index: Optional[int]) -> None:
    """N(0, d^-1/2) with the padding row zero (the Embedding helper of fairseq/models/transformer.py;
    fairseq's learned positions are drawn the same way, fairseq/modules/positional_embedding.py).
    A language model's blocks have no padding (pad_index None)."""
    nn.init.normal_(weight, mean=0.0, std=dim ** -0.5)
    if pad_index is not None:
        weight[pad_index].zero_()


@torch.no_grad()
def reset_norms_and_scales(model) -> None:
    for _, norm in model.norms():
        if isinstance(norm, (DynamicTanh, ScaleNorm)):
            norm.reset_parameters()  # their own init values (DyT's alpha, ScaleNorm's g = sqrt(d))
            continue
        nn.init.ones_(norm.weight)
        if getattr(norm, "bias", None) is not None:
            nn.init.zeros_(norm.bias)
    for ref in model.sublayers():
        ref.module.omega.fill_(1.0)
        ref.alpha.fill_(1.0)


@torch.no_grad()
def fairseq_xavier(model, cfg) -> None:
    """The forks' "default Xavier" (fairseq ~0.8/0.9 in layer6ai-labs/T-Fixup and
    LiyuanLucasLiu/Transformer-Clinic; fairseq >= 0.10 differs): q/k/v Xavier-uniform with
    gain 1/sqrt(2), out/fc1/fc2 gain 1, zero biases (q/k/v biases per model.qkv_bias_init),
    norms 1/0, embeddings N(0, d^-1/2), residual scales 1.

    Under the NTK parameterization the projection weights are N(0, 1) instead: the
    1/sqrt(fan_in) lives in the forward pass (an option of this tool after Su 2021,
    kexue.fm/archives/8620, "NTK Parameterization"; not from the papers reproduced here). With
    T5-style attention the q/k variance is further divided by head_dim, replacing the 1/sqrt(d)
    removed from the logits.
    """
    mcfg = model.cfg
    ntk = mcfg.parameterization == "ntk"
    head_dim = mcfg.dim // mcfg.heads
    for ref in model.sublayers():
        if ref.kind == "ffn":
            linears = {"fc1": (ref.module.branch.fc1, 1.0), "fc2": (ref.module.branch.fc2, 1.0)}
        else:
            proj = attention_projections(ref.module)
            linears = {"q": (proj["q"], QKV_GAIN), "k": (proj["k"], QKV_GAIN),
                       "v": (proj["v"], QKV_GAIN), "out": (proj["out"], 1.0)}
        for role, (linear, gain) in linears.items():
            if ntk:
                nn.init.normal_(linear.weight, 0.0, 1.0)
            else:
                nn.init.xavier_uniform_(linear.weight, gain=gain)
            if mcfg.attention == "t5" and role in ("q", "k"):
                # t5: logits lose their 1/sqrt(head_dim), so q and k each lose head_dim^-1/4 of
                # std (variance / sqrt(head_dim) each, / head_dim for the product).
                linear.weight.mul_(head_dim ** -0.25)
            if role in ("q", "k", "v") and mcfg.qkv_bias_init == "torch_default":
                bound = 1 / math.sqrt(linear.in_features)
                nn.init.uniform_(linear.bias, -bound, bound)
            else:
                nn.init.zeros_(linear.bias)
    tables = model.embedding_tables()
    seen = set()
    for role, weight in tables.items():
        if id(weight) in seen:
            continue
        seen.add(id(weight))
        init_embedding(weight, mcfg.dim, model.pad_index)
    reset_norms_and_scales(model)


# ----- helpers for the schemes that rescale or redraw the baseline -----

def branch_linears(ref) -> dict[str, nn.Linear]:
    """The projections of one sublayer by role: q/k/v/out for attention, fc1/fc2 for the FFN."""
    if ref.kind == "ffn":
        return {"fc1": ref.module.branch.fc1, "fc2": ref.module.branch.fc2}
    return attention_projections(ref.module)


def is_ntk(linear: nn.Module) -> bool:
    return hasattr(linear, "output_scale")


@torch.no_grad()
def store_effective_(linear: nn.Linear) -> None:
    """The schemes draw the weight the forward pass should see; under the NTK parameterization
    the forward multiplies by 1/sqrt(fan_in), so the stored weight carries sqrt(fan_in) more."""
    if is_ntk(linear):
        linear.weight.div_(linear.output_scale)


@torch.no_grad()
def t5_qk_adjust_(model, role: str, linear: nn.Linear) -> None:
    """T5-style attention (no 1/sqrt(head_dim) on the logits; Su 2021, kexue.fm/archives/8620,
    "NTK Parameterization"): q and k variance each divided by a further sqrt(head_dim), because the
    logits no longer are."""
    if model.cfg.attention == "t5" and role in ("q", "k"):
        linear.weight.mul_((model.cfg.dim // model.cfg.heads) ** -0.25)


def unique_tables(model) -> list[tuple[str, nn.Parameter]]:
    """Embedding tables by role, each tied Parameter once (first role that holds it)."""
    out, seen = [], set()
    for role, weight in model.embedding_tables().items():
        if id(weight) not in seen:
            seen.add(id(weight))
            out.append((role, weight))
    return out


def fill_alpha(model, value: float) -> None:
    with torch.no_grad():
        for ref in model.sublayers():
            ref.alpha.fill_(value)
