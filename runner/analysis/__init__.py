"""`deepinit analyze WHAT`: the papers' diagnostic figures for any configuration.

    output-change   Admin Fig. 4: |F(x0,W) - F(x0,W*)|^2 vs depth, random and Adam W*, fits
    grad-norms      Admin Fig. 3: gradient norm of every sublayer output at init
    dependency      Admin Figs. 7/8: layer dependency beta_{i,j}, at init and per checkpoint
    early-training  T-Fixup Figs. 2, 3a/b: embedding gradients, Adam updates, LN-input norms
                    over the first K updates, with and without warmup
    mode-gap        one checkpoint's loss on train and valid batches with dropout on and off:
                    whether a run's train/valid gap is the model's mode or the data
                    (`deepinit analyze mode-gap CHECKPOINT [BATCHES]`; JSON on stdout)

Each takes configurations as `--config "norm=post init=admin"` (repeatable; a finished run
folder also works), overrides shared by all of them as positional `key=value` arguments, and
writes <what>.json and a PNG plot into --out (default outputs/analysis/<what>).
Hooks live in hooks.py and never touch model code. The CLI is runner/cli/analyze.py.
"""
from __future__ import annotations

DEFAULT_CONFIGS = {
    "output-change": ["norm=post", "norm=pre", "norm=post init=admin"],
    "grad-norms": ["norm=post", "norm=pre"],
    "dependency": ["norm=post", "norm=pre", "norm=post init=admin"],
    "early-training": ["norm=post", "norm=none init=tfixup"],
}
