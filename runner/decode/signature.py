"""The sacreBLEU signature of a recorded score, as it is written now.

`detok_sacrebleu` (runner/decode/scoring.py) lowercases when the references it scores against
are lowercased, so a new score on IWSLT'14 or Multi30k's tok/ files says `case:lc`. Records
scored before that say `case:mixed` for the same number: sacreBLEU was case-sensitive, but
hypotheses and references were both lowercase already (the hypotheses come from a vocabulary
learned on the same lowercased text), and lowercasing lowercased text changes nothing, so the
case-sensitive and the case-insensitive score are equal (tests/decode/test_scoring.py checks it
with sacreBLEU). Only the label was wrong; `sacrebleu_signature(record)` gives the true one.

A record holds no reference text, so whether its references were lowercased is read from its
data settings (`data_settings`: the data group its overrides select, read from conf/ without
Hydra).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional, Sequence

import yaml

from runner.config.paths import config_dir, sweeps_dir
from runner.decode.scoring import CASE_LC, CASE_MIXED

__all__ = ["references_lowercased", "true_signature", "data_settings", "sacrebleu_signature",
           "signature_note"]


def references_lowercased(data) -> bool:
    """Whether a corpus's references are lowercased, from its data settings (a DataConfig or a
    mapping with name, tokenize, lowercase): IWSLT'14 (prepare-iwslt14.sh lowercases), Multi30k
    read as prepared (upstream's tok/*.lc.* files or `deepinit data prepare multi30k`, both
    lowercased), or data.lowercase=true."""
    def get(key, default=None):
        return data.get(key, default) if isinstance(data, dict) else getattr(data, key, default)

    name, tokenize = get("name"), get("tokenize") or "none"
    return bool(get("lowercase", False)) or name == "iwslt14" or (name == "multi30k" and tokenize == "none")


def true_signature(signature: Optional[str], lowercased: bool) -> Optional[str]:
    """The signature of a sacreBLEU score on references that were (`lowercased`) or were not
    lowercased. A score written before sacreBLEU lowercased on lowercased references says
    case:mixed and is the case:lc score: it reads case:lc. Any other signature is returned as it
    is (None stays None)."""
    if signature is None or not lowercased:
        return signature
    return "|".join(CASE_LC if part == CASE_MIXED else part for part in signature.split("|"))


@functools.lru_cache(maxsize=None)
def _yaml(path: Path) -> dict:
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def _data_choice(defaults) -> Optional[str]:
    for entry in defaults or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if key.replace("override", "").strip().lstrip("/") == "data":
                    return str(value)
    return None


def data_settings(overrides: Sequence[str]) -> dict:
    """The data group a run's overrides select, with the keys they set over it: conf/train.yaml's
    data default, then the +sweep= preset's data default and `data:` keys, then data=NAME and
    data.KEY=VALUE overrides. Read from conf/ without Hydra: enough to tell whether the
    references are lowercased (name, tokenize, lowercase), not a composed config."""
    conf = config_dir()
    choice, keys = _data_choice(_yaml(conf / "train.yaml").get("defaults")), {}
    parsed = [o.lstrip("+~").partition("=") for o in overrides]
    for key, _, value in parsed:
        if key == "sweep":
            preset = _yaml(sweeps_dir() / f"{value}.yaml")
            choice = _data_choice(preset.get("defaults")) or choice
            keys.update(preset.get("data") or {})
    for key, _, value in parsed:
        if key == "data":
            choice = value
        elif key.startswith("data."):
            keys[key[len("data."):]] = yaml.safe_load(value) if value else value
    return {**_yaml(conf / "data" / f"{choice}.yaml"), **keys, "name": choice}


def sacrebleu_signature(record: dict) -> Optional[str]:
    """A record's sacreBLEU signature as it is written now (see the module's docstring): case:lc
    for a score on lowercased references, whenever it was recorded. None when it has none."""
    lowercased = references_lowercased(data_settings(record.get("overrides") or []))
    return true_signature(record.get("sacrebleu_signature"), lowercased)


def signature_note(records: Sequence[dict]) -> Optional[str]:
    """The line for a report whose table has a sacreBLEU column: the records' signatures
    (sacrebleu_signature), or None when no record has one."""
    signatures = list(dict.fromkeys(s for s in map(sacrebleu_signature, records) if s))
    if not signatures:
        return None
    how = ("lowercased references, case-insensitively" if any(CASE_LC in s.split("|") for s in signatures)
           else "the references")
    return (f"sacreBLEU: the detokenized hypotheses scored against {how}; signature "
            f"{', '.join(signatures)} (docs/evaluation.md).")
