"""Data: corpora -> dictionaries -> tokenized splits -> token-bucketed batches.

`build_data(cfg)` is the one entry point; the corpus readers are picked from a dict literal.
"""
from __future__ import annotations

from runner.data.dataset import TokenizedSplit, TranslationData


def _toy(data_cfg) -> TranslationData:
    from runner.data import toy

    return toy.build(data_cfg)


def _corpus(data_cfg) -> TranslationData:
    from runner.data.corpus import load_translation_data

    return load_translation_data(data_cfg)


BUILDERS = {"toy": _toy, "multi30k": _corpus, "iwslt14": _corpus, "custom": _corpus}


def build_data(data_cfg) -> TranslationData:
    return BUILDERS[data_cfg.name](data_cfg)


__all__ = ["build_data", "TokenizedSplit", "TranslationData"]
