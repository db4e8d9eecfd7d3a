"""`init=rezero`: ReZero (Bachlechner et al. 2020, ReZero is All You Need) as majumderb/rezero
rezero/transformer/rztx.py and Transformer-Clinic's `rezero` have it: no norm anywhere, every
branch multiplied by its layer's scalar alpha (shared by the layer's sublayers), alpha = 0 at
init and trained. Weights are the default Xavier.

The variants share this module's machinery:
- rezero_postln (LiyuanLucasLiu/Transformer-Clinic): the same alpha with Post-LN;
- skipinit (De & Smith 2020, unverified here): one alpha per residual branch instead of per layer;
- rezero_ramp (a fixed-step ramp after Su 2021, kexue.fm/archives/8620, "Residual Connections";
  not from a paper): alpha is not trained but rises by init.alpha_ramp_step per update
  until it reaches 1. Any of the schemes above ramps when init.alpha_ramp_step > 0."""
from __future__ import annotations

from dataclasses import dataclass

from runner.config import InitConfig
from runner.init.base import InitScheme
from runner.init.common import fairseq_xavier, fill_alpha
from runner.model.sublayer import ResidualSpec


@dataclass
class AlphaOptions(InitConfig):
    # alpha rises by this step per update until 1 (Su 2021, kexue.fm/archives/8620); 0 = learned alpha
    alpha_ramp_step: float = 0.0


def ramping(cfg) -> bool:
    return cfg.init.alpha_ramp_step > 0


def alpha_residual(cfg, per_layer: bool = True) -> ResidualSpec:
    return ResidualSpec(alpha_trainable=not ramping(cfg), alpha_per_layer=per_layer)


def alpha_apply(model, cfg, rule: str) -> dict:
    fairseq_xavier(model, cfg)
    fill_alpha(model, 0.0)
    report = {"rule": rule, "alpha_init": 0.0, "alpha_trained": not ramping(cfg)}
    if ramping(cfg):
        report["alpha_ramp_step"] = cfg.init.alpha_ramp_step
    return report


class AlphaScheme(InitScheme):
    """Weights as the default Xavier, every branch scale alpha = 0; alpha trained, or ramped
    when init.alpha_ramp_step > 0."""

    options = AlphaOptions
    changes = ("*.alpha",)
    alpha_per_layer: bool = True
    rule: str = ""

    def residual(self, cfg) -> ResidualSpec:
        return alpha_residual(cfg, per_layer=self.alpha_per_layer)

    def apply(self, model, cfg, batch=None) -> dict:
        return alpha_apply(model, cfg, self.rule)

    def updates_during_training(self, cfg) -> bool:
        return ramping(cfg)

    def on_update(self, model, step: int, cfg) -> None:
        """The fixed-step ramp (Su 2021, kexue.fm/archives/8620): after update `step`,
        alpha = min(1, step * r). A function of the step alone, so a resumed run continues exactly."""
        if not ramping(cfg) or (step - 1) * cfg.init.alpha_ramp_step >= 1.0:
            return  # trained alpha, or alpha already reached 1 at the previous update
        fill_alpha(model, min(1.0, step * cfg.init.alpha_ramp_step))


class ReZero(AlphaScheme):
    # one alpha per layer whatever the stack (majumderb/rezero rztx.py wraps encoder and decoder
    # layers alike), so the LM's one stack gets it unchanged
    tasks = ("translation", "lm")
    name = "rezero"
    placements = ("none",)
    placement_hint = "ReZero removes layer normalization"
    rule = "ReZero (Bachlechner et al. 2020; majumderb/rezero rztx.py): no norm, alpha per layer = 0"
