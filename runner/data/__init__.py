"""Data: corpora -> dictionaries -> tokenized splits -> token-bucketed batches.

`build_data(cfg)` is the one entry point; the corpus readers are picked from a dict literal.
"""
from __future__ import annotations

from runner.data import toy
from runner.data.corpus import load_translation_data
from runner.data.dataset import TokenizedSplit, TranslationData

BUILDERS = {"toy": toy.build, "multi30k": load_translation_data, "iwslt14": load_translation_data,
            "custom": load_translation_data}


def build_data(data_cfg) -> TranslationData:
    return BUILDERS[data_cfg.name](data_cfg)


__all__ = ["build_data", "TokenizedSplit", "TranslationData"]
