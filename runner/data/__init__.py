"""Data: corpora -> dictionaries -> tokenized splits -> token-bucketed batches.

`build_data(cfg)` is the one entry point; the corpus readers are picked from a dict literal.
"""
from __future__ import annotations

from runner.data import toy
from runner.data.corpus import load_translation_data
from runner.data.dataset import TokenizedSplit, TranslationData
from runner.data.lm import LMData, load_shakespeare_char, load_text

BUILDERS = {"toy": toy.build, "multi30k": load_translation_data, "iwslt14": load_translation_data,
            "custom": load_translation_data}
LM_BUILDERS = {"shakespeare_char": load_shakespeare_char, "text": load_text}  # task=lm's corpora


def build_data(data_cfg) -> TranslationData:
    return BUILDERS[data_cfg.name](data_cfg)


def build_lm_data(data_cfg) -> LMData:
    return LM_BUILDERS[data_cfg.name](data_cfg)


__all__ = ["build_data", "build_lm_data", "LMData", "TokenizedSplit", "TranslationData"]
