"""`init=lipschitz`: the Lipschitz-constrained init of Xu et al. (ACL 2020) as Neutron implements
it (hfxunlp/transformer, utils/init/base.py init_model_params_lipschitz), with the paper's
computation orders (Sec. 2, Fig. 1): v1 = Post-LN with a norm on the embedding sum (norm=post
norm.embedding_norm=true), v2 = Pre-LN (norm=pre)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from runner.config import InitConfig
from runner.init.base import BRANCH_WEIGHTS, InitScheme, stack_placements
from runner.init.common import branch_linears, fairseq_xavier, store_effective_, t5_qk_adjust_, unique_tables


@dataclass
class LipschitzOptions(InitConfig):
    # bound = scale * sqrt(1/fan_in) (hfxunlp/transformer utils/init/base.py)
    lipschitz_scale: float = 1.0


def order(cfg) -> str:
    return "v2" if cfg.norm.placement == "pre" else "v1"


class Lipschitz(InitScheme):
    name = "lipschitz"
    options = LipschitzOptions
    changes = (*BRANCH_WEIGHTS, "embedding.*")
    task_hint = ("Xu et al. 2020 state the Lipschitz init for the encoder-decoder model only")

    def requirements(self, cfg) -> list[str]:
        """v1 or v2 on both stacks (per-stack placements included)."""
        stacks = stack_placements(cfg)
        if all(p == "pre" for p in stacks.values()):
            return []
        if all(p == "post" for p in stacks.values()):
            if cfg.norm.embedding_norm:
                return []
            return ["Lipschitz v1 is Post-LN with a norm on the embedding sum: use "
                    "norm.embedding_norm=true (or norm=pre for v2)"]
        set_per_stack = [f"norm.{side}_placement={getattr(cfg.norm, f'{side}_placement')}"
                         for side in stacks if getattr(cfg.norm, f"{side}_placement")]
        found = " ".join(set_per_stack) or f"norm={cfg.norm.placement}"
        unset = " and ".join(f"norm.{side}_placement" for side in stacks
                             if getattr(cfg.norm, f"{side}_placement"))
        return [f"Lipschitz init is defined for the v1/v2 orders on both stacks only: use "
                f"norm=post norm.embedding_norm=true (v1) or norm=pre (v2), not {found}"
                + (f"; unset {unset}" if unset else "")]

    @torch.no_grad()
    def apply(self, model, cfg, batch=None) -> dict:
        return apply_lipschitz(model, cfg)


def linear_bound(fan_in: int, scale: float) -> float:
    return scale * math.sqrt(1.0 / fan_in)  # Neutron: U(+-b) for every matrix


def embedding_bound(dim: int, vocab: int) -> float:
    return math.sqrt(2.0 / (dim + vocab))  # Neutron: embeddings, Glorot-uniform with gain sqrt(1/3)


def apply_lipschitz(model, cfg) -> dict:
    # Biases 0 and norms 1/0 (as Neutron) come with the baseline; every matrix is then redrawn.
    fairseq_xavier(model, cfg)
    scale = cfg.init.lipschitz_scale
    for ref in model.sublayers():
        for role, linear in branch_linears(ref).items():
            b = linear_bound(linear.in_features, scale)
            nn.init.uniform_(linear.weight, -b, b)
            store_effective_(linear)
            t5_qk_adjust_(model, role, linear)
    bounds = {}
    tables = dict(unique_tables(model))
    if "output" in tables:  # an untied classifier is a Linear(d -> V): step 1, fan_in = d
        b = linear_bound(model.cfg.dim, scale)
        output = tables.pop("output")
        nn.init.uniform_(output, -b, b)
        if model.pad_index is not None:  # the decoder's fix_init zeroes the classifier pad row
            output[model.pad_index].zero_()
        bounds["output"] = b
    for role, weight in tables.items():
        b = embedding_bound(model.cfg.dim, weight.shape[0])
        nn.init.uniform_(weight, -b, b)
        if model.pad_index is not None:  # weight[None] would be the whole table
            weight[model.pad_index].zero_()
        bounds[role] = b
    return {"rule": "Lipschitz-constrained init (Xu et al. 2020, Sec. 3) as hfxunlp/transformer "
                    "utils/init/base.py init_model_params_lipschitz",
            "order": order(cfg), "scale": scale, "embedding_bounds": bounds}
