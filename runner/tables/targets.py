"""The reproduction targets: the papers' tables that `deepinit reproduce TARGET` reproduces, the
sweep presets of each scale, and the papers' numbers the tables print beside ours.

    cpu    the toy smoke tier (minutes), one or more presets run through `deepinit -m`
    real   Multi30k on CPU, cell by cell with seeds, intervals and verdicts, records in results/
    gpu    the same on one GPU at the papers' model size (table2, tfixup-depth)
    paper  the papers' recipes and corpora (GPU), through `deepinit -m`

Paper numbers: the constants below, each with its paper's table or figure. The cpu and paper
tables are rendered by runner/tables/render.py; the real and gpu tiers' reports by
runner/tables/report.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# cpu: the toy smoke tier; real: Multi30k on CPU, gpu: Multi30k at the papers' model size on one GPU
# (both runner/tables/suite.py, records in results/); paper: the papers' recipes and corpora
SCALES = ("cpu", "real", "gpu", "paper")
SUITE_TIERS = ("real", "gpu")
LAUNCHERS = ("basic", "local", "slurm")


# ----------------------------------------------------------------------------- paper numbers
# Liu et al. 2020 (Understanding the Difficulty of Training Transformers, EMNLP), Table 2
# (BLEU; None = "failed", training diverged); (mean, std or None)
TABLE2_PAPER: dict[str, dict[str, Optional[tuple[float, Optional[float]]]]] = {
    "IWSLT'14 De-En, 6L-6L small": {"post_ln": (35.64, 0.23), "pre_ln": (35.50, 0.04),
                                    "admin": (35.67, 0.15)},
    "WMT'14 En-Fr, 6L-6L base": {"post_ln": (41.29, None), "pre_ln": (40.74, None),
                                 "admin": (41.47, None)},
    "WMT'14 En-Fr, 60L-12L base": {"post_ln": None, "pre_ln": (43.10, None),
                                   "admin": (43.80, None)},
    "WMT'14 En-De, 6L-6L base": {"post_ln": (27.80, None), "pre_ln": (27.27, None),
                                 "admin": (27.90, None)},
    "WMT'14 En-De, 12L-12L base": {"post_ln": None, "pre_ln": (28.26, None),
                                   "admin": (28.58, None)},
    "WMT'14 En-De, 18L-18L base": {"post_ln": None, "pre_ln": (28.38, None),
                                   "admin": (29.03, None)},
}
TABLE2_WMT_ROW = {6: "WMT'14 En-De, 6L-6L base", 12: "WMT'14 En-De, 12L-12L base",
                  18: "WMT'14 En-De, 18L-18L base"}
METHODS = {"post_ln": "Post-LN", "pre_ln": "Pre-LN", "admin": "Admin"}
# Liu et al. 2020, Fig. 10, the no-warmup grid: diverged cells of 15 per method
GRID_PAPER_DIVERGED = {"post_ln": 7, "pre_ln": 0, "admin": 0}
GRID_PAPER_NOTE = {"post_ln": "beats Pre-LN in 7 of its 8 converged cells",
                   "pre_ln": "converges in all 15", "admin": "converges in all 15, beats Pre-LN"}
# Huang et al. 2020 (T-Fixup, ICML), Fig. 4(b) and its talk slides: IWSLT'14 De-En 64-128-2,
# first 50k updates
TFIXUP_DEPTH_PAPER = {6: 25.35, 20: 28.29, 50: 29.28, 100: 28.98, 200: 27.65}
# Xu et al. 2020 (Lipschitz Constrained Parameter Initialization for Deep Transformers, ACL),
# Tables 1 and 3, WMT'14 En-De (None = failed to converge)
LIPSCHITZ_PAPER: dict[tuple[str, str], dict[int, Optional[float]]] = {
    ("order_v1", "xavier"): {6: 27.77, 12: None, 18: None, 24: None},
    ("order_v1", "lipschitz"): {6: 27.96, 12: 28.67, 18: 29.05, 24: 29.46},
    ("order_v2", "xavier"): {6: 27.31, 12: 28.12, 18: 28.60, 24: 29.02},
    ("order_v2", "lipschitz"): {6: 27.38, 12: 28.13, 18: 28.67, 24: 29.20},
}
LIPSCHITZ_COLUMNS = [("order_v1", "xavier", "v1 (Post-LN)"), ("order_v1", "lipschitz", "v1-L"),
                     ("order_v2", "xavier", "v2 (Pre-LN)"), ("order_v2", "lipschitz", "v2-L")]


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Part:
    """One `deepinit -m +sweep=<preset>` call of a target, into <sweep dir>/<sub>."""

    preset: str
    sub: str = ""
    data_env: Optional[str] = None  # env var naming the prepared data folder (paper scale)
    data_langs: tuple[str, str] = ("de", "en")
    data_hint: str = ""
    beam: int = 5
    lenpen: float = 1.0
    average_last: int = 10


@dataclass(frozen=True)
class Target:
    """A published table: its sweep presets by scale. A target with a cpu or paper scale has a
    renderer of its table (runner/tables/render.py); the others have a real tier only."""

    name: str
    title: str
    parts: dict[str, tuple[Part, ...]]


IWSLT_HINT = ("the prepared IWSLT'14 De-En folder with a train split: "
              "`deepinit data prepare iwslt14 --out DIR` (downloads de-en.tgz; or --raw PATH), then "
              "DEEPINIT_IWSLT14_DIR=DIR (docs/data.md)")
WMT_HINT = ("a prepared, BPE'd WMT'14 En-De folder with {train,valid,test}.{en,de} "
            "(as Transformer-Clinic pre-process/wmt14en-de.sh: joint BPE 32k, newstest2013 valid, "
            "newstest2014 test): `deepinit data prepare wmt14-en-de --recipe admin --out DIR` "
            "(downloads the archives; or --raw DIR), then DEEPINIT_WMT14_DIR=DIR (docs/data.md)")
# CPU scale: greedy decoding of the last checkpoint (cheap); paper scale: the papers' protocol
# (Admin IWSLT beam 5 lenpen 1, WMT beam 4 lenpen 0.6: Transformer-Clinic nmt-experiments/eval_*.sh;
# T-Fixup beam 4 lenpen 0.3: layer6ai-labs/T-Fixup InferenceIWSLT.py; each the average of the last
# 10 checkpoints; Lipschitz beam 4, no length penalty, the average of the last 5: its Sec. 2.1).
CPU_EVAL = dict(beam=1, lenpen=1.0, average_last=0)


TARGETS: dict[str, Target] = {
    "table2": Target(
        "table2", "Admin paper, Table 2: Post-LN vs Pre-LN vs Admin by depth",
        {"cpu": (Part("reproduce_table2_cpu", **CPU_EVAL),),
         "real": (Part("reproduce_table2_real"),),
         "gpu": (Part("reproduce_table2_gpu"),),
         "paper": (Part("reproduce_table2_iwslt14", "iwslt14", "DEEPINIT_IWSLT14_DIR", ("de", "en"),
                        IWSLT_HINT, beam=5, lenpen=1.0, average_last=10),
                   Part("reproduce_table2_wmt14", "wmt14", "DEEPINIT_WMT14_DIR", ("en", "de"),
                        WMT_HINT, beam=4, lenpen=0.6, average_last=10))}),
    "grid": Target(
        "grid", "Admin paper, no-warmup grid: beta2 x lr for Post-LN, Pre-LN, Admin",
        {"cpu": (Part("reproduce_grid_cpu", **CPU_EVAL),),
         "real": (Part("reproduce_grid_real"),),
         "paper": (Part("reproduce_grid_paper", "", "DEEPINIT_IWSLT14_DIR", ("de", "en"),
                        IWSLT_HINT, beam=5, lenpen=1.0, average_last=10),)}),
    "tfixup-depth": Target(
        "tfixup-depth", "T-Fixup ultra-deep scan: 64-128-2, no LN, no warmup, 6 to 200 layers",
        {"cpu": (Part("reproduce_tfixup_depth_cpu", **CPU_EVAL),),
         "real": (Part("reproduce_tfixup_depth_real"),),
         "gpu": (Part("reproduce_tfixup_depth_gpu"),),
         "paper": (Part("reproduce_tfixup_depth_paper", "", "DEEPINIT_IWSLT14_DIR", ("de", "en"),
                        IWSLT_HINT, beam=4, lenpen=0.3, average_last=10),)}),
    "lipschitz": Target(
        "lipschitz", "Lipschitz paper, Tables 1 and 3: v1/v2 with and without Lipschitz init",
        {"cpu": (Part("reproduce_lipschitz_cpu", **CPU_EVAL),),
         "real": (Part("reproduce_lipschitz_real"),),
         # Lipschitz paper Sec. 2.1: beam 4, the average of the last 5 checkpoints (saved every
         # 1,500 updates); no length penalty (its implementation's default, hfxunlp/transformer
         # cnfg/base.py length_penalty=0.0)
         "paper": (Part("reproduce_lipschitz_paper", "", "DEEPINIT_WMT14_DIR", ("en", "de"),
                        WMT_HINT, beam=4, lenpen=0.0, average_last=5),)}),
    # Real-data tier only: every init scheme the tool offers, at table2's deep no-warmup setting.
    "schemes-postln": Target(
        "schemes-postln", "All schemes, deep, no warmup: Post-LN family and the papers' controls",
        {"real": (Part("reproduce_schemes_postln_real"),)}),
    "sgd-control": Target(
        "sgd-control", "T-Fixup Fig. 3c: Post-LN with SGD, deep, no warmup",
        {"real": (Part("reproduce_sgd_control_real"),)}),
    "schemes-other": Target(
        "schemes-other", "All schemes, deep, no warmup: ReZero, SkipInit, the alpha ramp, Lipschitz v1 and v2",
        {"real": (Part("reproduce_schemes_other_real"),)}),
    "schemes-norms": Target(
        "schemes-norms",
        "Methods since 2019, deep, no warmup: B2T, ResiDual, DyT, ScaleNorm+FixNorm, Mix-LN, Peri-LN, LN Scaling",
        {"real": (Part("reproduce_schemes_norms_real"),)}),
    "schemes-scaling": Target(
        "schemes-scaling", "Methods since 2019, deep, no warmup: QK-norm, sigma-reparam, LayerScale, depth-muP",
        {"real": (Part("reproduce_schemes_scaling_real"),)}),
    "schemes-norms-warmup": Target(
        "schemes-norms-warmup",
        "Methods since 2019, deep, with warmup: B2T, ResiDual, DyT, ScaleNorm+FixNorm, Mix-LN, Peri-LN, LN Scaling",
        {"real": (Part("reproduce_schemes_norms_warmup_real"),)}),
    "schemes-scaling-warmup": Target(
        "schemes-scaling-warmup",
        "Methods since 2019, deep, with warmup: QK-norm, sigma-reparam, LayerScale, depth-muP",
        {"real": (Part("reproduce_schemes_scaling_warmup_real"),)}),
    "mup-transfer": Target(
        "mup-transfer", "Depth-muP: does the best learning rate transfer from 6 to 12 layers?",
        {"real": (Part("reproduce_mup_transfer_real"),)}),
    "table2-converged": Target(
        "table2-converged", "Admin paper, Table 2 at 12+12, trained until the validation curve is flat",
        {"real": (Part("reproduce_table2_converged_real"),)}),
    "width": Target(
        "width", "Post-LN vs Pre-LN without warmup by width: does the stall become a blow-up?",
        {"real": (Part("reproduce_width_real"),), "gpu": (Part("reproduce_width_gpu"),)}),
    # task=lm: the methods since 2022 in the decoder-only setting their papers used
    "lm": Target(
        "lm", "Decoder-only LM (shakespeare_char), 12 and 24 layers: Post-LN vs Pre-LN, DeepNorm, sigma-reparam, "
              "LN Scaling, Mix-LN, Peri-LN, DyT, depth-muP",
        {"real": (Part("reproduce_lm_real"),)}),
}


# `deepinit reproduce all --scale real`: every real-tier suite through one pool of cells, in this
# order: Table 2 first, then the T-Fixup depth scan and the tables of the methods since 2019
# without warmup, then the other papers' tables, the grid, the with-warmup and transfer rows,
# then the width scan and Table 2 trained flat (the longest cells), and last the language-model tier.
REAL_SUITE_ORDER = ("table2", "tfixup-depth", "schemes-norms", "schemes-scaling", "lipschitz",
                    "schemes-postln", "sgd-control", "schemes-other", "grid", "schemes-norms-warmup",
                    "schemes-scaling-warmup", "mup-transfer", "width", "table2-converged", "lm")
