"""Real parallel corpora: strict reading, optional BPE, dictionaries, tokenized splits.

`load_translation_data(cfg.data)` serves `data=multi30k`, `data=iwslt14` and `data=custom`.
With `data.tokenize=moses` the text read is raw: it is Moses-tokenized (runner/data/moses.py)
before the BPE, and the raw target text of valid/test is kept for sacreBLEU.
Reading is strict: a missing file, a line-count mismatch, bytes that are not UTF-8, or (with
`empty_lines=error`) an empty line raise CorpusError naming the file and line. Nothing is
dropped silently: skipped empty pairs and pairs longer than max positions are counted in
`TranslationData.stats` and logged.
"""
from __future__ import annotations

import gzip
import logging
import os
import zlib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Sequence

from runner.data.cache import cached
from runner.data.dataset import TokenizedSplit, TranslationData
from runner.data.dictionary import Dictionary
from runner.data.moses import TOKENIZERS, sacremoses_version, tokenize_raw
from runner.data.subword import BPE_SYMBOL, BPEError, SubwordNmtCodes, learn_bpe, remove_bpe

log = logging.getLogger("deepinit.data")

PADDING_FACTOR = 8  # fairseq-preprocess default (IWSLT'14 joined dictionary: 10,152 = 8 * 1,269)


class CorpusError(ValueError):
    """A corpus that cannot be used as it is; the message names the file (and line)."""


# --------------------------------------------------------------------------------------------
# Reading


def readable(path: Path) -> Path:
    """`path`, or a one-line CorpusError when this user may not read it."""
    if not os.access(path, os.R_OK):
        raise CorpusError(f"cannot read {path}: permission denied")
    return path


def resolve_file(path: str | os.PathLike) -> Path:
    """`path`, or `path.gz` when only the compressed copy exists."""
    p = Path(path)
    if p.is_file():
        return readable(p)
    gz = p.with_name(p.name + ".gz")
    if gz.is_file():
        return readable(gz)
    raise CorpusError(f"missing corpus file: {p} (nor {gz.name})")


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a UTF-8 text file (plain or .gz), without line endings.

    Only '\\n' ends a line (a trailing '\\r' is dropped): str.splitlines() would also split at
    U+2028, U+0085 and friends, which misaligns parallel files."""
    p = resolve_file(path)
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rb") as f:
                data = f.read()
        else:
            data = p.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise CorpusError(f"cannot read {p}: {e}") from None
    return decode_lines(data, str(p))


def decode_lines(data: bytes, name: str) -> list[str]:
    """UTF-8 bytes to lines; CorpusError naming `name` and the 1-based line of a bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_no = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise CorpusError(f"{name}:{line_no}: not valid UTF-8 (byte 0x{data[e.start]:02x} at "
                          f"byte column {column})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


@dataclass
class ParallelText:
    src: list[str]
    tgt: list[str]
    empty_skipped: int
    src_path: Path
    tgt_path: Path
    # The target lines before data.tokenize=moses, aligned with `tgt` (None: not tokenized).
    tgt_raw: list[str] | None = None


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike,
                  empty_lines: str = "skip") -> ParallelText:
    """Read aligned source/target files. `empty_lines`: 'skip' drops pairs where either side is
    blank and counts them; 'error' raises at the first one."""
    if empty_lines not in ("skip", "error"):
        raise CorpusError(f"data.empty_lines must be skip or error, got {empty_lines!r}")
    sp, tp = resolve_file(src_path), resolve_file(tgt_path)
    src, tgt = read_lines(sp), read_lines(tp)
    if len(src) != len(tgt):
        raise CorpusError(f"line counts differ: {sp} has {len(src)} lines but {tp} has "
                          f"{len(tgt)}; the files must be aligned line by line")
    keep_src, keep_tgt, skipped = [], [], 0
    for i, (s, t) in enumerate(zip(src, tgt)):
        if s.strip() and t.strip():
            keep_src.append(s)
            keep_tgt.append(t)
            continue
        if empty_lines == "error":
            where = sp if not s.strip() else tp
            raise CorpusError(f"{where}:{i + 1}: empty line (set data.empty_lines=skip to drop "
                              "such pairs and count them)")
        skipped += 1
    return ParallelText(keep_src, keep_tgt, skipped, sp, tp)


# --------------------------------------------------------------------------------------------
# Where each corpus keeps its files

DATA_ROOT_ENV = "DEEPINIT_DATA_ROOT"
# The folder of each built-in corpus under the data root (data.dir null).
CORPUS_FOLDERS = {"multi30k": "multi30k", "iwslt14": "iwslt14-de-en-fairseq"}
# How to make each built-in corpus folder (for the missing-folder error).
PREPARE_HINTS = {"multi30k": "deepinit data prepare multi30k --out DIR",
                 "iwslt14": "deepinit data prepare iwslt14 --out DIR"}
# Multi30k's own split names (multi30k/dataset data/task1) for deepinit's usual ones.
MULTI30K_ALIASES = {"valid": "val", "test": "test_2016_flickr"}

IWSLT14_TRAIN_HINT = (
    "the staged IWSLT'14 copy has only valid and test (its train split could not be obtained); "
    "run `deepinit data prepare iwslt14 --out DIR` (it downloads de-en.tgz; or pass "
    "--raw PATH/de-en.tgz), then use data.dir=DIR")


def default_data_root() -> Path:
    """Where data.dir=null looks for the built-in corpora: $DEEPINIT_DATA_ROOT, else the
    per-user $XDG_CACHE_HOME/deepinit/data (~/.cache/deepinit/data when XDG_CACHE_HOME is unset
    or not absolute). Read from the environment at each call."""
    env = os.environ.get(DATA_ROOT_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "deepinit" / "data"


def default_corpus_dir(name: str) -> Path:
    """The folder of built-in corpus `name` (multi30k, iwslt14) under default_data_root()."""
    return default_data_root() / CORPUS_FOLDERS[name]


def corpus_dir(cfg) -> Path:
    if cfg.dir:
        return Path(cfg.dir).expanduser()
    if cfg.name in CORPUS_FOLDERS:
        return default_corpus_dir(cfg.name)
    raise CorpusError(f"data={cfg.name} needs data.dir=PATH (a folder with "
                      "{split}.{lang} files, plain or .gz)")


def existing_corpus_dir(cfg) -> Path:
    """corpus_dir(cfg), or a one-line CorpusError naming the folder looked in and what to do."""
    directory = corpus_dir(cfg)
    if directory.is_dir():
        if not os.access(directory, os.R_OK | os.X_OK):
            raise CorpusError(f"cannot read the corpus folder {directory}: permission denied "
                              "(data.dir)")
        return directory
    if cfg.dir:
        raise CorpusError(f"corpus folder not found: {directory} (data.dir)")
    folder = CORPUS_FOLDERS[cfg.name]
    source = (f"${DATA_ROOT_ENV}/{folder}" if os.environ.get(DATA_ROOT_ENV) else
              f"the per-user default, as {DATA_ROOT_ENV} is not set")
    raise CorpusError(
        f"data={cfg.name}: corpus folder not found: {directory} ({source}); set "
        f"{DATA_ROOT_ENV} to the folder that holds {folder}/, pass data.dir=PATH, or make one "
        f"with `{PREPARE_HINTS[cfg.name]}` and pass data.dir=DIR")


def split_file(cfg, directory: Path, split: str, lang: str) -> Path:
    """The file for one split and language; CorpusError listing what was tried."""
    names = [f"{split}.{lang}"]
    if cfg.name == "multi30k":
        alias = MULTI30K_ALIASES.get(split, split)
        names += [f"{alias}.{lang}", f"tok/{alias}.lc.norm.tok.{lang}"]
    tried = []
    for name in names:
        for candidate in (directory / name, directory / (name + ".gz")):
            if candidate.is_file():
                return readable(candidate)
            tried.append(candidate.name if candidate.parent == directory else name + "[.gz]")
    msg = f"missing corpus file for split '{split}' ({lang}) in {directory}: tried " + \
          ", ".join(dict.fromkeys(tried))
    if cfg.name == "iwslt14" and split == cfg.train_split:
        msg += f"; {IWSLT14_TRAIN_HINT}"
    raise CorpusError(msg)


# --------------------------------------------------------------------------------------------
# Building


def _bpe_for(cfg, train_lines: Sequence[str] | None) -> tuple[SubwordNmtCodes | None, dict]:
    try:
        return _bpe_for_unchecked(cfg, train_lines)
    except BPEError as e:  # one error type for the CLI to report
        raise CorpusError(str(e)) from None


def _bpe_for_unchecked(cfg, train_lines: Sequence[str] | None
                       ) -> tuple[SubwordNmtCodes | None, dict]:
    if cfg.bpe == "none":
        return None, {"bpe": "none"}
    if cfg.bpe == "codes":
        if not cfg.bpe_codes:
            raise CorpusError("data.bpe=codes needs data.bpe_codes=PATH (subword-nmt codes)")
        codes = SubwordNmtCodes.from_file(resolve_file(cfg.bpe_codes))
        return codes, {"bpe": "codes", "bpe_codes": str(cfg.bpe_codes), "merges": codes.num_merges}
    if cfg.bpe == "tokenizers":
        if train_lines is None:
            raise CorpusError("data.bpe=tokenizers learns the BPE on the train split, which "
                              "was not loaded")
        codes = learn_bpe(train_lines, cfg.bpe_merges)
        return codes, {"bpe": "tokenizers", "merges_requested": cfg.bpe_merges,
                       "merges": codes.num_merges}
    raise CorpusError(f"data.bpe must be none, tokenizers or codes, got {cfg.bpe!r}")


def _tokenize(cfg, text: dict[str, ParallelText]) -> None:
    """data.tokenize=moses: Moses-tokenize both sides of every split in place (the language's
    rules), keeping the raw target lines of the splits that are scored."""
    for split, pt in text.items():
        log.info("%s: Moses-tokenizing %d %s + %s lines", split, len(pt.src), cfg.source_lang,
                 cfg.target_lang)
        if split != cfg.train_split:
            pt.tgt_raw = pt.tgt
        pt.src = tokenize_raw(pt.src, cfg.source_lang)
        pt.tgt = tokenize_raw(pt.tgt, cfg.target_lang)


def build_translation_data(cfg, splits: Sequence[str] | None = None,
                           dictionaries: tuple[Dictionary, Dictionary] | None = None
                           ) -> TranslationData:
    """Read, segment and encode the corpus named by `cfg` (a DataConfig); no caching."""
    directory = existing_corpus_dir(cfg)
    wanted = list(dict.fromkeys(splits or (cfg.train_split, cfg.valid_split, cfg.test_split)))
    need_train = dictionaries is None or cfg.bpe == "tokenizers"
    if need_train and cfg.train_split not in wanted:
        wanted.insert(0, cfg.train_split)
    src_lang, tgt_lang = cfg.source_lang, cfg.target_lang
    if src_lang == tgt_lang:
        raise CorpusError(f"data.source_lang and data.target_lang are both {src_lang!r}")
    if cfg.tokenize not in TOKENIZERS:
        raise CorpusError(f"data.tokenize must be {' or '.join(TOKENIZERS)}, got {cfg.tokenize!r}")

    stats: dict[str, Any] = {"corpus": cfg.name, "dir": str(directory), "splits": {},
                             "tokenize": cfg.tokenize}
    text: dict[str, ParallelText] = {}
    for split in wanted:
        pt = read_parallel(split_file(cfg, directory, split, src_lang),
                           split_file(cfg, directory, split, tgt_lang), cfg.empty_lines)
        if cfg.lowercase:
            pt.src = [s.lower() for s in pt.src]
            pt.tgt = [t.lower() for t in pt.tgt]
        if not pt.src:
            raise CorpusError(f"{pt.src_path}: no usable sentence pairs")
        if pt.empty_skipped:
            log.warning("%s/%s: skipped %d pairs with an empty side", pt.src_path.name,
                        pt.tgt_path.name, pt.empty_skipped)
        text[split] = pt
        stats["splits"][split] = {"files": [str(pt.src_path), str(pt.tgt_path)],
                                  "empty_skipped": pt.empty_skipped}

    if cfg.tokenize == "moses":
        _tokenize(cfg, text)
    train = text.get(cfg.train_split)
    codes, bpe_stats = _bpe_for(cfg, train.src + train.tgt if train else None)
    stats["bpe"] = bpe_stats
    if codes is not None:
        for pt in text.values():
            pt.src, pt.tgt = codes.apply(pt.src), codes.apply(pt.tgt)
        bpe_symbol: str | None = BPE_SYMBOL
    else:
        # Already-prepared fairseq text (e.g. IWSLT'14) carries subword-nmt markers.
        sample = text.get(cfg.valid_split) or train or next(iter(text.values()))
        bpe_symbol = BPE_SYMBOL if any(BPE_SYMBOL in t for t in sample.tgt) else None
        bpe_stats["detected_bpe_symbol"] = bpe_symbol

    if dictionaries is not None:
        src_dict, tgt_dict = dictionaries
    elif cfg.joined_dictionary:
        src_dict = tgt_dict = Dictionary.build(
            [line.split() for line in train.src + train.tgt], padding_factor=PADDING_FACTOR)
    else:
        src_dict = Dictionary.build([s.split() for s in train.src], padding_factor=PADDING_FACTOR)
        tgt_dict = Dictionary.build([t.split() for t in train.tgt], padding_factor=PADDING_FACTOR)
    stats["dictionary"] = {"joined": src_dict is tgt_dict, "src_size": len(src_dict),
                           "tgt_size": len(tgt_dict)}

    out_splits: dict[str, TokenizedSplit] = {}
    references: dict[str, list[str]] = {}
    raw_references: dict[str, list[str]] = {}
    for split, pt in text.items():
        if splits and split not in splits:
            continue  # read only to learn the BPE / dictionaries
        src_ids, tgt_ids, refs, raw_refs, too_long = [], [], [], [], 0
        src_unk = tgt_unk = 0
        raw = pt.tgt_raw if pt.tgt_raw is not None else [None] * len(pt.tgt)
        for s, t, r in zip(pt.src, pt.tgt, raw):
            si, ti = src_dict.encode_line(s), tgt_dict.encode_line(t)
            # fairseq compares lengths with eos against max positions.
            if len(si) > cfg.max_source_positions or len(ti) > cfg.max_target_positions:
                too_long += 1
                continue
            src_unk += si.count(src_dict.unk_index)
            tgt_unk += ti.count(tgt_dict.unk_index)
            src_ids.append(si)
            tgt_ids.append(ti)
            if split != cfg.train_split:
                refs.append(remove_bpe(t, bpe_symbol) if bpe_symbol else " ".join(t.split()))
                raw_refs.append(r)
        if not src_ids:
            raise CorpusError(f"{pt.src_path}: every pair is longer than max positions "
                              f"({cfg.max_source_positions}/{cfg.max_target_positions})")
        if too_long:
            log.warning("%s: dropped %d pairs longer than max positions (%d source / %d target "
                        "tokens with eos)", split, too_long, cfg.max_source_positions,
                        cfg.max_target_positions)
        out_splits[split] = TokenizedSplit.from_lists(src_ids, tgt_ids)
        if split != cfg.train_split:
            references[split] = refs
            if pt.tgt_raw is not None:
                raw_references[split] = raw_refs
        s = out_splits[split]
        stats["splits"][split].update(
            pairs=len(s), too_long=too_long, src_tokens=int(s.src_lengths.sum()),
            tgt_tokens=int(s.tgt_lengths.sum()), src_unk=src_unk, tgt_unk=tgt_unk)
    return TranslationData(src_dict, tgt_dict, out_splits, references, bpe_symbol, stats,
                           raw_references)


def _key_parts(cfg, directory: Path, wanted: Sequence[str],
               dictionaries: tuple[Dictionary, Dictionary] | None) -> dict[str, Any]:
    files = {}
    for split in wanted:
        for lang in (cfg.source_lang, cfg.target_lang):
            files[f"{split}.{lang}"] = split_file(cfg, directory, split, lang)
    parts: dict[str, Any] = {
        "builder": "corpus/1", "name": cfg.name, "files": files,
        "langs": [cfg.source_lang, cfg.target_lang],
        "splits": [cfg.train_split, cfg.valid_split, cfg.test_split, list(wanted)],
        "joined": cfg.joined_dictionary, "bpe": cfg.bpe, "lowercase": cfg.lowercase,
        "empty_lines": cfg.empty_lines,
        "max_positions": [cfg.max_source_positions, cfg.max_target_positions]}
    if cfg.tokenize != "none":  # absent for none, so caches built before the field stay valid
        parts["tokenize"] = cfg.tokenize
        parts["sacremoses"] = sacremoses_version()
    if cfg.bpe == "tokenizers":
        parts["bpe_merges"] = cfg.bpe_merges
        parts["tokenizers"] = version("tokenizers")
    if cfg.bpe == "codes" and cfg.bpe_codes:
        parts["bpe_codes"] = resolve_file(cfg.bpe_codes)
    if dictionaries is not None:
        parts["dictionaries"] = [d.symbols for d in dictionaries]
    return parts


def load_translation_data(cfg, splits: Sequence[str] | None = None,
                          dictionaries: tuple[Dictionary, Dictionary] | None = None,
                          use_cache: bool = True) -> TranslationData:
    """TranslationData for data=multi30k|iwslt14|custom, from the binary cache when possible.

    splits: which splits to return (default train/valid/test per cfg); the train split is
    still read when the BPE or the dictionaries are built from it.
    dictionaries: (src, tgt) to encode with instead of building them (e.g. a trained model's).
    """
    if cfg.name not in ("multi30k", "iwslt14", "custom"):
        raise CorpusError(f"load_translation_data does not handle data={cfg.name}")
    directory = existing_corpus_dir(cfg)
    wanted = list(dict.fromkeys(splits or (cfg.train_split, cfg.valid_split, cfg.test_split)))
    if (dictionaries is None or cfg.bpe == "tokenizers") and cfg.train_split not in wanted:
        wanted.insert(0, cfg.train_split)
    key = _key_parts(cfg, directory, wanted, dictionaries)  # raises for missing files first
    data = cached(key, lambda: build_translation_data(cfg, splits, dictionaries),
                  cache_dir=cfg.cache_dir, name=cfg.name, enabled=use_cache)
    cache = data.stats.get("cache", {})
    log.info("%s: %s (cache %s)", cfg.name, ", ".join(
        f"{k} {v.get('pairs', '-')} pairs" for k, v in data.stats["splits"].items()),
        cache.get("status"))
    return data
