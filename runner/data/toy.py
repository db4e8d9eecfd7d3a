"""The built-in synthetic translation task: a small grammar pair generated from a seed.

Source ("verb-final, noun-adjective") and target ("SVO, adjective-noun") differ in order and in
agreement, so a model has to reorder and carry number across the sentence:
  source:  DET(g,n,def) NOUN [PL] ADJ SUFFIX(g,n) ...  OBJECT ...  [PREP NP]  VERB AGR(n)
  target:  DET(def,n) ADJ ... NOUN [PL]  VERB [3SG]  OBJECT ...  [PREP NP]
A clause may be followed by a conjunction and a second clause. Words are pseudo-words drawn
from the seed, so nothing is downloaded and the vocabulary is joined (one dictionary).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from runner.data.dataset import TokenizedSplit, TranslationData
from runner.data.dictionary import Dictionary

SYLLABLES = ["ka", "lo", "mi", "ru", "te", "za", "po", "ne", "fi", "gu", "ba", "so", "de", "vu",
             "ri", "ha", "jo", "wen", "tal", "mor", "kis", "pan", "dre", "lum"]


@dataclass
class Lexicon:
    nouns: list[tuple[str, str, int]]  # (source, target, gender 0..2)
    verbs: list[tuple[str, str]]
    adjectives: list[tuple[str, str]]
    preps: list[tuple[str, str]]


def _words(rng: random.Random, count: int, prefix: str, taken: set[str]) -> list[str]:
    out = []
    while len(out) < count:
        word = prefix + "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def make_lexicon(cfg, rng: random.Random) -> Lexicon:
    taken: set[str] = set()
    src_n, tgt_n = _words(rng, cfg.nouns, "", taken), _words(rng, cfg.nouns, "", taken)
    src_v, tgt_v = _words(rng, cfg.verbs, "", taken), _words(rng, cfg.verbs, "", taken)
    src_a, tgt_a = _words(rng, cfg.adjectives, "", taken), _words(rng, cfg.adjectives, "", taken)
    src_p, tgt_p = _words(rng, 8, "", taken), _words(rng, 8, "", taken)
    return Lexicon(
        nouns=[(s, t, rng.randrange(3)) for s, t in zip(src_n, tgt_n)],
        verbs=list(zip(src_v, tgt_v)),
        adjectives=list(zip(src_a, tgt_a)),
        preps=list(zip(src_p, tgt_p)),
    )


# Source determiners by (definite, plural, gender); target ones by (definite, plural).
SRC_DET = {(True, False): ["der", "die", "das"], (False, False): ["ein", "eine", "ein"],
           (True, True): ["die", "die", "die"], (False, True): ["einige", "einige", "einige"]}
TGT_DET = {(True, False): "the", (False, False): "a", (True, True): "the", (False, True): "some"}
SRC_ADJ_SUFFIX = ["+er", "+e", "+es"]  # by gender; plural takes "+en"


class Grammar:
    def __init__(self, lexicon: Lexicon, rng: random.Random):
        self.lex, self.rng = lexicon, rng

    def noun_phrase(self, depth: int) -> tuple[list[str], list[str], bool]:
        rng = self.rng
        src_noun, tgt_noun, gender = rng.choice(self.lex.nouns)
        definite, plural = rng.random() < 0.6, rng.random() < 0.35
        adjectives = [rng.choice(self.lex.adjectives) for _ in range(rng.choice([0, 0, 1, 1, 2]))]
        src = [SRC_DET[(definite, plural)][gender], src_noun] + (["+n"] if plural else [])
        for src_adj, _ in adjectives:
            src += [src_adj, "+en" if plural else SRC_ADJ_SUFFIX[gender]]
        tgt = [TGT_DET[(definite, plural)]] + [t for _, t in adjectives] + [tgt_noun]
        tgt += ["+s"] if plural else []
        if depth > 0 and rng.random() < 0.25:
            src_prep, tgt_prep = rng.choice(self.lex.preps)
            sub_src, sub_tgt, _ = self.noun_phrase(depth - 1)
            src += [src_prep] + sub_src
            tgt += [tgt_prep] + sub_tgt
        return src, tgt, plural

    def clause(self) -> tuple[list[str], list[str]]:
        subj_src, subj_tgt, plural = self.noun_phrase(depth=1)
        obj_src, obj_tgt, _ = self.noun_phrase(depth=1)
        src_verb, tgt_verb = self.rng.choice(self.lex.verbs)
        src = subj_src + obj_src + [src_verb, "+en" if plural else "+t"]
        tgt = subj_tgt + [tgt_verb] + ([] if plural else ["+s"]) + obj_tgt
        return src, tgt

    def sentence(self) -> tuple[str, str]:
        src, tgt = self.clause()
        if self.rng.random() < 0.3:
            more_src, more_tgt = self.clause()
            src, tgt = src + ["und"] + more_src, tgt + ["and"] + more_tgt
        return " ".join(src), " ".join(tgt)


def generate(cfg) -> dict[str, list[tuple[str, str]]]:
    """Deterministic text pairs per split; splits never share a sentence pair."""
    rng = random.Random(cfg.seed)
    grammar = Grammar(make_lexicon(cfg, rng), rng)
    sizes = {"train": cfg.train_size, "valid": cfg.valid_size, "test": cfg.test_size}
    seen: set[tuple[str, str]] = set()
    splits: dict[str, list[tuple[str, str]]] = {}
    for split, size in sizes.items():
        pairs = []
        while len(pairs) < size:
            pair = grammar.sentence()
            if pair in seen and split != "train":
                continue
            seen.add(pair)
            pairs.append(pair)
        splits[split] = pairs
    return splits


def build(data_cfg) -> TranslationData:
    text = generate(data_cfg.toy)
    vocab = Dictionary.build(
        (line.split() for pairs in text.values() for pair in pairs for line in pair))
    splits = {}
    names = {"train": data_cfg.train_split, "valid": data_cfg.valid_split, "test": data_cfg.test_split}
    for split, pairs in text.items():
        splits[names[split]] = TokenizedSplit.from_lists(
            [vocab.encode_line(s) for s, _ in pairs], [vocab.encode_line(t) for _, t in pairs])
    references = {names[split]: [t for _, t in pairs] for split, pairs in text.items()}
    return TranslationData(vocab, vocab, splits, references=references)
