"""`deepinit data prepare iwslt14|multi30k|wmt14-en-de`: raw corpora to the text deepinit reads.

iwslt14 reproduces fairseq's examples/translation/prepare-iwslt14.sh in Python:
  train.tags.de-en.{de,en}: drop <url>/<talkid>/<keywords> lines, strip <title>/<description>
    tags, Moses tokenizer.perl -l LANG (sacremoses, with Moses' default XML escaping),
    clean-corpus-n.perl -ratio 1.5 1 175, lowercase.perl;
  IWSLT14.TED*.{de,en}.xml: <seg> text, ’ -> ', tokenize, lowercase;
  valid = every 23rd cleaned training line, train = the rest;
  test = TED.dev2010 + TEDX.dev2012 + TED.tst2010 + TED.tst2011 + TED.tst2012;
  one joint BPE of 10,000 merges learned on train.de + train.en and applied to every split.
Output is fairseq's layout: OUT/{train,valid,test}.{de,en} (BPE), OUT/code, OUT/tmp/ (pre-BPE).

wmt14-en-de reproduces fairseq's examples/translation/prepare-wmt14en2de.sh (or, --recipe admin,
Transformer-Clinic's pre-process/wmt14en-de.sh) in Python, with the tokenizer and the BPE spread
over worker processes: see prepare_wmt14.

multi30k reproduces multi30k/dataset scripts/task1-tokenize.sh (lowercase, Moses punctuation
normalization, Moses tokenizer) and writes OUT/{train,valid,test,...}.{de,en}; the BPE is learned
when the data is loaded (data.bpe=tokenizers).

The raw files are supplied with `--raw`; without it the `deepinit data prepare` command fetches
them first (runner/data/download.py, into DATA_ROOT/downloads/NAME) and records their SHA-256 in
prepare.json. The functions here never download.
"""
from __future__ import annotations

import collections
import contextlib
import io
import itertools
import json
import multiprocessing
import os
import re
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from subword_nmt.learn_bpe import learn_bpe as snmt_learn

from runner.data.corpus import CorpusError, decode_lines, default_corpus_dir, read_lines
from runner.data.download import (
    IWSLT14_ORIGINAL_URL,
    IWSLT14_URL,
    MULTI30K_URL,
    WMT14_FILES,
    check_tar_members,
    local_record,
    unpack_once,
    unpacked_from,
    unpacked_name,
)
from runner.data.moses import moses_normalize, moses_tokenize, remove_non_printing, sacremoses_version
from runner.data.subword import SubwordNmtCodes, learn_bpe, learn_bpe_from_counts
from runner.files import atomic_open

# prepare-iwslt14.sh: the order of the concatenated test set.
IWSLT14_TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
                     "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")
IWSLT14_CLEAN = {"ratio": 1.5, "min_len": 1, "max_len": 175}  # clean-corpus-n.perl -ratio 1.5 1 175
IWSLT14_VALID_EVERY = 23  # prepare-iwslt14.sh: awk NR%23 == 0
IWSLT14_BPE_MERGES = 10000  # prepare-iwslt14.sh: learn_bpe.py -s 10000
MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr",
                   "test_2017_flickr": "test_2017_flickr", "test_2017_mscoco": "test_2017_mscoco",
                   "test_2018_flickr": "test_2018_flickr"}


class PrepareError(CorpusError):
    """A prepare step that cannot run; the message says what to supply."""


# --------------------------------------------------------------------------------------------
# Per-line steps (each mirrors one command of the shell pipelines)


def strip_train_tags(lines: Iterable[str]) -> list[str]:
    """grep -v '<url>' / '<talkid>' / '<keywords>', then sed away <title> and <description>."""
    out = []
    for line in lines:
        if "<url>" in line or "<talkid>" in line or "<keywords>" in line:
            continue
        for tag in ("<title>", "</title>", "<description>", "</description>"):
            line = line.replace(tag, "")
        out.append(line)
    return out


_SEG_OPEN = re.compile(r'<seg id="[0-9]*">\s*')
_SEG_CLOSE = re.compile(r"\s*</seg>\s*")


def xml_segments(lines: Iterable[str]) -> list[str]:
    """grep '<seg id' | sed 's/<seg id="[0-9]*">\\s*//g' | sed 's/\\s*<\\/seg>\\s*//g' | ’ -> '."""
    out = []
    for line in lines:
        if "<seg id" not in line:
            continue
        line = _SEG_CLOSE.sub("", _SEG_OPEN.sub("", line))
        out.append(line.replace("\u2019", "'"))
    return out


def lowercase(lines: Iterable[str]) -> list[str]:
    return [line.lower() for line in lines]


_SPACES = re.compile(r"\s+")


def clean_corpus(src: Sequence[str], tgt: Sequence[str], min_len: int = 1, max_len: int = 175,
                 ratio: float = 1.5, max_word_length: int = 1000
                 ) -> tuple[list[str], list[str], int]:
    """clean-corpus-n.perl: squeeze whitespace, then keep pairs with min_len..max_len tokens on
    both sides, length ratio <= `ratio` both ways and no token longer than max_word_length.
    Returns (src, tgt, number dropped). '|' is only removed by the perl script for
    non-factored input; Moses escaping has already turned every '|' into &#124;."""
    if len(src) != len(tgt):
        raise PrepareError(f"clean: {len(src)} source lines but {len(tgt)} target lines")
    stats = {"dropped": 0}
    kept = list(clean_pairs(zip(src, tgt), min_len, max_len, ratio, max_word_length, stats))
    return [s for s, _ in kept], [t for _, t in kept], stats["dropped"]


def clean_pairs(pairs: Iterable[tuple[str, str]], min_len: int = 1, max_len: int = 175,
                ratio: float = 1.5, max_word_length: int = 1000, stats: dict | None = None
                ) -> Iterator[tuple[str, str]]:
    """clean_corpus pair by pair (for corpora too large to hold): yields the kept pairs, and
    counts the others in stats["dropped"]. Input is factored when its first pair has a '|'."""
    stats = {} if stats is None else stats
    stats.setdefault("dropped", 0)
    factored = None
    too_long_word = re.compile(r"[^\s|]{%d}" % (max_word_length + 1))
    for s, t in pairs:
        if factored is None:
            factored = "|" in s or "|" in t
        if not factored:
            s, t = s.replace("|", ""), t.replace("|", "")
        s = _SPACES.sub(" ", s).strip(" ")
        t = _SPACES.sub(" ", t).strip(" ")
        ns, nt = (len(s.split(" ")), len(t.split(" "))) if s and t else (0, 0)
        if (not s or not t or not (min_len <= ns <= max_len and min_len <= nt <= max_len)
                or ns / nt > ratio or nt / ns > ratio
                or too_long_word.search(s) or too_long_word.search(t)):
            stats["dropped"] += 1
            continue
        yield s, t


def split_every(lines: Sequence[str], every: int = IWSLT14_VALID_EVERY, offset: int = 0
                ) -> tuple[list[str], list[str]]:
    """(rest, every n-th line counting from 1), as awk 'NR%n != 0' / 'NR%n == 0'; `offset`: the
    number of lines before these (for a file read in chunks)."""
    rest = [line for i, line in enumerate(lines, start=offset + 1) if i % every]
    picked = [line for i, line in enumerate(lines, start=offset + 1) if i % every == 0]
    return rest, picked


# --------------------------------------------------------------------------------------------
# Output


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    with _Writer(path) as w:
        w.write(lines)


def _missing_raw(name: str, what: str, url: str) -> PrepareError:
    return PrepareError(f"{name}: {what}; run `deepinit data prepare {name}` without --raw to "
                        f"download it, or download it from {url} and pass --raw PATH")


# --------------------------------------------------------------------------------------------
# IWSLT'14


def _tar_members(raw_tgz: Path) -> dict[str, tarfile.TarInfo]:
    try:
        tar = tarfile.open(raw_tgz, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise PrepareError(f"{raw_tgz}: not a readable tar archive ({e})") from None
    with tar:
        # Only read (never extracted), but an archive with members that would land outside its
        # folder (absolute, `..`, links out) is refused as a whole, as when unpacking.
        return {Path(m.name).name: m for m in check_tar_members(tar, raw_tgz) if m.isfile()}


def _tar_lines(raw_tgz: Path, members: dict[str, tarfile.TarInfo], name: str) -> list[str]:
    if name not in members:
        raise PrepareError(f"{raw_tgz}: has no {name}; is this the IWSLT'14 de-en.tgz?")
    with tarfile.open(raw_tgz, "r:*") as tar:
        f = tar.extractfile(members[name])
        assert f is not None
        return decode_lines(f.read(), f"{raw_tgz}:{members[name].name}")


def prepare_iwslt14(raw_tgz: str | os.PathLike | None, out_dir: str | os.PathLike,
                    bpe_merges: int = IWSLT14_BPE_MERGES, bpe_learner: str = "tokenizers",
                    codes: str | os.PathLike | None = None, src: str = "de", tgt: str = "en",
                    progress=print, downloads: list[dict] | None = None) -> dict:
    """Run the prepare-iwslt14.sh pipeline; returns the counts written to OUT/prepare.json.

    bpe_learner: tokenizers (deepinit's learner, deterministic) or subword-nmt (the learn_bpe
    fairseq's script runs, for its exact code file). codes: apply these subword-nmt codes
    instead of learning (e.g. fairseq's own `code`, which reproduces its valid/test exactly).
    downloads: the records of the fetched raw files (url, sha256), kept in prepare.json."""
    if raw_tgz is None:
        raise _missing_raw("iwslt14", "no raw archive given",
                           f"{IWSLT14_URL} (originally {IWSLT14_ORIGINAL_URL})")
    raw = Path(raw_tgz)
    if not raw.is_file():
        raise _missing_raw("iwslt14", f"{raw} does not exist", IWSLT14_URL)
    if bpe_learner not in ("tokenizers", "subword-nmt"):
        raise PrepareError(f"--bpe-learner must be tokenizers or subword-nmt, got {bpe_learner!r}")
    out, tmp = Path(out_dir), Path(out_dir) / "tmp"
    members = _tar_members(raw)
    pair = f"{src}-{tgt}"
    counts: dict = {"raw": str(raw), **({"downloads": downloads} if downloads else {})}

    progress(f"iwslt14: tokenizing train.tags.{pair}.{{{src},{tgt}}}")
    tok = {}
    for lang in (src, tgt):
        lines = strip_train_tags(_tar_lines(raw, members, f"train.tags.{pair}.{lang}"))
        tok[lang] = moses_tokenize(lines, lang)
    if len(tok[src]) != len(tok[tgt]):
        raise PrepareError(f"train.tags.{pair}: {len(tok[src])} {src} lines but "
                           f"{len(tok[tgt])} {tgt} lines after removing tag lines")
    clean_src, clean_tgt, dropped = clean_corpus(tok[src], tok[tgt], **IWSLT14_CLEAN)
    counts["train_tags_lines"] = len(tok[src])
    counts["clean_dropped"] = dropped
    cleaned = {src: lowercase(clean_src), tgt: lowercase(clean_tgt)}

    progress("iwslt14: dev/test XML")
    for lang in (src, tgt):
        for name in sorted(members):
            if re.fullmatch(rf"IWSLT14\.TED.*\.{lang}\.xml", name):
                segs = xml_segments(_tar_lines(raw, members, name))
                _write_lines(tmp / name[: -len(".xml")], lowercase(moses_tokenize(segs, lang)))

    text: dict[str, dict[str, list[str]]] = {"train": {}, "valid": {}, "test": {}}
    for lang in (src, tgt):
        text["train"][lang], text["valid"][lang] = split_every(cleaned[lang])
        test = []
        for name in IWSLT14_TEST_SETS:
            path = tmp / f"{name}.{pair}.{lang}"
            if not path.is_file():
                raise PrepareError(f"{raw}: has no {name}.{pair}.{lang}.xml (needed for test)")
            test += read_lines(path)
        text["test"][lang] = test
        for split in text:
            _write_lines(tmp / f"{split}.{lang}", text[split][lang])

    if codes is not None:
        bpe = SubwordNmtCodes.from_file(codes)
        counts["bpe"] = {"codes": str(codes), "merges": bpe.num_merges}
    else:
        progress(f"iwslt14: learning a joint {bpe_merges}-merge BPE ({bpe_learner}"
                 + (", several minutes" if bpe_learner == "subword-nmt" else "") + ")")
        joint = text["train"][src] + text["train"][tgt]
        bpe = _learn(joint, bpe_merges, bpe_learner)
        counts["bpe"] = {"learner": bpe_learner, "merges": bpe.num_merges}
    bpe.save(out / "code")
    for split in text:
        for lang in (src, tgt):
            _write_lines(out / f"{split}.{lang}", bpe.apply(text[split][lang]))
        counts[split] = len(text[split][src])
    (out / "prepare.json").write_text(json.dumps(counts, indent=1) + "\n", encoding="utf-8")
    return counts


def _learn(lines: list[str], merges: int, learner: str) -> SubwordNmtCodes:
    if learner == "tokenizers":
        return learn_bpe(lines, merges)
    out = io.StringIO()
    # subword-nmt draws a tqdm bar on stderr even with verbose=False; it is slow (about a minute
    # per 30k lines for 10k merges), so say so once instead.
    with contextlib.redirect_stderr(io.StringIO()):
        snmt_learn(io.StringIO("\n".join(lines) + "\n"), out, merges)  # min_frequency 2
    return SubwordNmtCodes(out.getvalue(), source="<subword-nmt learn_bpe>")


# --------------------------------------------------------------------------------------------
# Multi30k


def prepare_multi30k(raw_dir: str | os.PathLike | None, out_dir: str | os.PathLike,
                     src: str = "de", tgt: str = "en", max_lines: int | None = None,
                     progress=print, downloads: list[dict] | None = None) -> dict:
    """task1-tokenize.sh on RAW/{split}.{lang}.gz: lowercase, normalize punctuation, tokenize.
    Writes OUT/{split}.{lang} with deepinit's split names (val -> valid, test_2016_flickr ->
    test); `max_lines` keeps only the first lines of each file (for tests). downloads: the
    records of the fetched raw files (url, sha256), kept in prepare.json."""
    if raw_dir is None:
        raise _missing_raw("multi30k", "no raw folder given", MULTI30K_URL)
    raw = Path(raw_dir)
    if not raw.is_dir():
        raise _missing_raw("multi30k", f"{raw} is not a folder", MULTI30K_URL)
    out = Path(out_dir)
    counts: dict = {"raw": str(raw), **({"downloads": downloads} if downloads else {})}
    for ours, theirs in MULTI30K_SPLITS.items():
        present = [(raw / f"{theirs}.{lang}.gz").is_file() or (raw / f"{theirs}.{lang}").is_file()
                   for lang in (src, tgt)]
        if not any(present) and ours not in ("train", "valid", "test"):
            continue  # the extra test sets are optional
        text = {}
        for lang in (src, tgt):
            lines = read_lines(raw / f"{theirs}.{lang}")[:max_lines]
            text[lang] = moses_tokenize(moses_normalize(lowercase(lines), lang), lang)
        if len(text[src]) != len(text[tgt]):
            raise PrepareError(f"{raw}/{theirs}: {len(text[src])} {src} lines but "
                               f"{len(text[tgt])} {tgt} lines")
        for lang in (src, tgt):
            _write_lines(out / f"{ours}.{lang}", text[lang])
        counts[ours] = len(text[src])
        progress(f"multi30k: {ours} ({theirs}) {counts[ours]} pairs")
    (out / "prepare.json").write_text(json.dumps(counts, indent=1) + "\n", encoding="utf-8")
    return counts


# --------------------------------------------------------------------------------------------
# WMT'14 en-de

WMT14 = "wmt14-en-de"
WMT14_SRC, WMT14_TGT = "en", "de"  # prepare-wmt14en2de.sh: src=en, tgt=de
# The script's CORPORA: (archive, file inside it without the .LANG suffix), concatenated in order.
WMT14_TRAIN = (("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en"),
               ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en"),
               ("training-parallel-nc-v12.tgz", "training/news-commentary-v12.de-en"))
WMT14_DEV = ("dev.tgz", "dev/newstest2013")  # .LANG: the admin recipe's valid set
# newstest2014: the source side from the -src file, the target side from the -ref file.
WMT14_TEST = ("test-full.tgz", "test-full/newstest2014-deen-{side}.{lang}.sgm")
WMT14_CHUNK_LINES = 10000  # lines per task handed to a worker process


@dataclass(frozen=True)
class Wmt14Recipe:
    about: str
    bpe_merges: int
    clean: dict             # clean-corpus-n.perl -ratio R ... MIN MAX
    clean_after_bpe: bool   # True: train and valid cleaned after the BPE (BPE tokens counted)
    valid_every: int | None  # valid = every n-th tokenized training line; None: newstest2013


WMT14_RECIPES = {
    # fairseq examples/translation/prepare-wmt14en2de.sh (default file list, News Commentary v12)
    "fairseq": Wmt14Recipe("fairseq's examples/translation/prepare-wmt14en2de.sh", 40000,
                           {"ratio": 1.5, "min_len": 1, "max_len": 250}, True, 100),
    # Transformer-Clinic pre-process/wmt14en-de.sh, the data of Admin's WMT'14 rows (and the
    # paper presets' DEEPINIT_WMT14_DIR): clean 1-80 (default ratio 9) before a 32,764-merge BPE,
    # newstest2013 as valid.
    "admin": Wmt14Recipe("Transformer-Clinic's pre-process/wmt14en-de.sh (Admin)", 32764,
                         {"ratio": 9.0, "min_len": 1, "max_len": 80}, False, None),
}

_WORKER: dict = {}  # per worker process: the BPE codes it was last given, applied


def _tokenize_chunk(task: tuple[str, bool, list[str]]) -> list[str]:
    """normalize-punctuation.perl LANG | remove-non-printing-char.perl | tokenizer.perl -a -l LANG
    (without the first two for the test set, as the script)."""
    lang, normalize, lines = task
    if normalize:
        lines = remove_non_printing(moses_normalize(lines, lang))
    return moses_tokenize(lines, lang, aggressive_dash_splits=True)


def _bpe_chunk(task: tuple[str, list[str], list[str]]) -> tuple[list[str], list[str]]:
    """subword-nmt's apply_bpe.py -c CODES on both sides of a chunk of pairs."""
    codes, src, tgt = task
    if _WORKER.get("codes") != codes:
        _WORKER["codes"], _WORKER["bpe"] = codes, SubwordNmtCodes(codes, source="<code>")
    bpe = _WORKER["bpe"]
    return bpe.apply(src), bpe.apply(tgt)


def _ordered_map(fn, tasks: Iterable, pool: ProcessPoolExecutor | None, workers: int) -> Iterator:
    """fn over tasks, results in order: in this process without a pool, else in the pool's
    `workers` processes with at most 2 x workers tasks in flight (the input is read as the
    results are used, not all at once)."""
    if pool is None:
        yield from map(fn, tasks)
        return
    pending: collections.deque = collections.deque()
    for task in tasks:
        pending.append(pool.submit(fn, task))
        if len(pending) >= 2 * workers:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _count_lines(path: Path) -> int:
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def _chunks(path: Path, size: int, bad: list) -> Iterator[list[str]]:
    """PATH's lines (only \\n ends one, as the perl scripts read) in lists of `size`. Bytes that
    are not UTF-8 become U+FFFD; such lines are counted in bad[0], the first named in bad[1]."""
    chunk: list[str] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            raw = raw[:-1] if raw.endswith(b"\n") else raw
            try:
                chunk.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                chunk.append(raw.decode("utf-8", errors="replace"))
                bad[0] += 1
                bad[1] = bad[1] or f"{path}:{n}"
            if len(chunk) >= size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _pair_chunks(src: Path, tgt: Path, size: int, bad: list) -> Iterator[tuple[list[str], list[str]]]:
    """Aligned chunks of two files with the same number of lines."""
    for a, b in itertools.zip_longest(_chunks(src, size, bad), _chunks(tgt, size, bad), fillvalue=[]):
        if len(a) != len(b):
            raise PrepareError(f"{src} and {tgt} do not have the same number of lines")
        yield a, b


class _Writer:
    """Lines into PATH, which appears only when complete (closed without an error)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = atomic_open(path, "w", encoding="utf-8", newline="\n")

    def write(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.f.write(line)
            self.f.write("\n")

    def __enter__(self) -> "_Writer":
        self.f = self.file.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.file.__exit__(*exc)


def _wmt14_locate(raw: Path, archive_name: str, rels: Sequence[str], sha: str | None,
                  progress) -> list[Path]:
    """The files RELS of one archive: in RAW/<archive stem>/ (as `deepinit data download`
    unpacks it) or RAW/ itself (fairseq's orig/ folder), else unpacked from RAW/ARCHIVE first
    (safely, next to it). An unpacked folder stamped with another archive's hash is redone."""
    dest, archive = raw / unpacked_name(archive_name), raw / archive_name
    stamp = unpacked_from(dest)
    if not (archive.is_file() and sha and stamp is not None and stamp != sha):
        for base in (dest, raw):
            if all((base / rel).is_file() for rel in rels):
                return [base / rel for rel in rels]
    if not archive.is_file():
        remote = next(r for r in WMT14_FILES if r.name == archive_name)
        raise _missing_raw(WMT14, f"{raw} has neither {archive_name} nor {dest.name}/{rels[0]}",
                           remote.urls[0])
    progress(f"{WMT14}: unpacking {archive_name}")
    unpack_once(archive, dest, sha or "unknown")
    missing = [rel for rel in rels if not (dest / rel).is_file()]
    if missing:
        raise PrepareError(f"{archive}: has no {missing[0]}; is this the archive fairseq's "
                           "prepare-wmt14en2de.sh downloads?")
    return [dest / rel for rel in rels]


def prepare_wmt14(raw_dir: str | os.PathLike | None, out_dir: str | os.PathLike,
                  recipe: str = "fairseq", bpe_merges: int | None = None,
                  bpe_learner: str = "tokenizers", codes: str | os.PathLike | None = None,
                  workers: int | None = None, progress=print, tick=None,
                  downloads: list[dict] | None = None, chunk_lines: int = WMT14_CHUNK_LINES) -> dict:
    """WMT'14 en-de from the archives of fairseq's prepare-wmt14en2de.sh in RAW_DIR; returns the
    counts written to OUT/prepare.json.

    recipe "fairseq" (prepare-wmt14en2de.sh): europarl-v7 + commoncrawl + news-commentary-v12,
    each through normalize-punctuation.perl LANG | remove-non-printing-char.perl |
    tokenizer.perl -a -l LANG; test = newstest2014 (<seg> lines of -src.en / -ref.de .sgm,
    ’ -> ', tokenizer -a); valid = every 100th training line, train = the rest; a joint BPE of
    40,000 merges learned on train.en + train.de and applied to every split; then train and
    valid cleaned (clean-corpus-n.perl -ratio 1.5, 1-250 BPE tokens). Recipe "admin"
    (Transformer-Clinic pre-process/wmt14en-de.sh): the same tokenization, training pairs cleaned
    to 1-80 tokens (ratio 9) before a 32,764-merge BPE, valid = newstest2013.

    Writes OUT/{train,valid,test}.{en,de} (BPE), OUT/code and OUT/tmp/ (the text before the BPE;
    tmp/train.tags.en-de.tok.* is reused by a second run on the same archives). workers:
    processes for the tokenizer and the BPE (default: all cores). tick(stage, done, total):
    lines done per stage, for a progress bar. bpe_learner, codes: as prepare_iwslt14.
    downloads: the records of the fetched archives; without them the archives found in RAW_DIR
    are recorded (SHA-256 from its downloads.json when still valid, else computed)."""
    if recipe not in WMT14_RECIPES:
        raise PrepareError(f"--recipe must be one of {', '.join(WMT14_RECIPES)}, got {recipe!r}")
    if bpe_learner not in ("tokenizers", "subword-nmt"):
        raise PrepareError(f"--bpe-learner must be tokenizers or subword-nmt, got {bpe_learner!r}")
    if raw_dir is None:
        raise _missing_raw(WMT14, "no raw folder given", "https://www.statmt.org/wmt14/translation-task.html")
    raw = Path(raw_dir)
    if not raw.is_dir():
        raise _missing_raw(WMT14, f"{raw} is not a folder (pass the folder that holds the "
                           f"archives: {', '.join(r.name for r in WMT14_FILES)})",
                           "https://www.statmt.org/wmt14/translation-task.html")
    rec = WMT14_RECIPES[recipe]
    merges = rec.bpe_merges if bpe_merges is None else bpe_merges
    workers = max(1, workers or os.cpu_count() or 1)
    tick = tick or (lambda stage, done, total: None)
    out, tmp = Path(out_dir), Path(out_dir) / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    langs, pair = (WMT14_SRC, WMT14_TGT), f"{WMT14_SRC}-{WMT14_TGT}"
    t0 = time.perf_counter()
    if downloads is None:
        downloads = [r for r in (local_record(remote, raw) for remote in WMT14_FILES) if r]
    sha = {r["file"]: r.get("sha256") for r in downloads}
    counts: dict = {"raw": str(raw), "recipe": recipe, **({"downloads": downloads} if downloads else {})}

    # Find (or unpack) every input before the long work starts.
    train = {lang: [] for lang in langs}
    for archive, stem in WMT14_TRAIN:
        for lang, path in zip(langs, _wmt14_locate(raw, archive, [f"{stem}.{lang}" for lang in langs],
                                                   sha.get(archive), progress)):
            train[lang].append(path)
    test_files = dict(zip(langs, _wmt14_locate(
        raw, WMT14_TEST[0], [WMT14_TEST[1].format(side=side, lang=lang)
                             for side, lang in zip(("src", "ref"), langs)], sha.get(WMT14_TEST[0]), progress)))
    dev_files = {} if rec.valid_every else dict(zip(langs, _wmt14_locate(
        raw, WMT14_DEV[0], [f"{WMT14_DEV[1]}.{lang}" for lang in langs], sha.get(WMT14_DEV[0]), progress)))
    bad: list = [0, None]  # lines that were not UTF-8, the first of them

    # One pool of worker processes for every stage ("spawn": nothing of this process, its
    # threads included, is copied into them).
    pool = (ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
            if workers > 1 else None)
    try:
        # 1. Training corpora, concatenated and tokenized (the long step; reused when done before).
        tags = {lang: tmp / f"train.tags.{pair}.tok.{lang}" for lang in langs}
        stamp_path = tmp / f"train.tags.{pair}.json"
        key = {"inputs": [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for lang in langs for p in train[lang]],
               "steps": "normalize-punctuation | remove-non-printing-char | tokenizer -a",
               "sacremoses": sacremoses_version()}
        sizes = [_count_lines(p) for p in train[WMT14_SRC]]
        for p, n, other in zip(train[WMT14_SRC], sizes, train[WMT14_TGT]):
            if (m := _count_lines(other)) != n:
                raise PrepareError(f"{p} has {n} lines but {other} has {m}")
        counts["train_tags_lines"] = total = sum(sizes)
        try:
            before = json.loads(stamp_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = {}
        if isinstance(before, dict) and before.get("key") == key and all(p.is_file() for p in tags.values()):
            progress(f"{WMT14}: reusing the tokenized training text in {tmp} (delete it to redo)")
            bad[:] = before.get("not_utf8", [0, None])
        else:
            stamp_path.unlink(missing_ok=True)
            for lang in langs:
                progress(f"{WMT14}: tokenizing the {lang} training text ({total:,} lines, {workers} "
                         f"worker{'s' if workers > 1 else ''})")
                stage, done = f"tokenize train.{lang}", 0
                tick(stage, 0, total)
                tasks = ((lang, True, chunk) for path in train[lang] for chunk in _chunks(path, chunk_lines, bad))
                with _Writer(tags[lang]) as w:
                    for lines in _ordered_map(_tokenize_chunk, tasks, pool, workers):
                        w.write(lines)
                        done += len(lines)
                        tick(stage, done, total)
            stamp_path.write_text(json.dumps({"key": key, "not_utf8": bad}, indent=1) + "\n", encoding="utf-8")

        # 2. Test (and the admin recipe's valid): small, tokenized here.
        progress(f"{WMT14}: newstest2014" + ("" if rec.valid_every else " and newstest2013"))
        for lang in langs:
            segs = xml_segments(line for chunk in _chunks(test_files[lang], chunk_lines, bad) for line in chunk)
            _write_lines(tmp / f"test.{lang}", _tokenize_chunk((lang, False, segs)))
            if dev_files:
                lines = [line for chunk in _chunks(dev_files[lang], chunk_lines, bad) for line in chunk]
                _write_lines(tmp / f"valid.{lang}", _tokenize_chunk((lang, True, lines)))
        if _count_lines(tmp / f"test.{WMT14_SRC}") != _count_lines(tmp / f"test.{WMT14_TGT}"):
            raise PrepareError(f"{test_files[WMT14_SRC]} and {test_files[WMT14_TGT]} have different "
                               "numbers of <seg> lines")

        # 3. Split off valid (fairseq) or clean (admin).
        stats = {"dropped": 0}
        with _Writer(tmp / f"train.{WMT14_SRC}") as ws, _Writer(tmp / f"train.{WMT14_TGT}") as wt:
            if rec.valid_every:
                progress(f"{WMT14}: valid = every {rec.valid_every}th training line")
                with _Writer(tmp / f"valid.{WMT14_SRC}") as vs, _Writer(tmp / f"valid.{WMT14_TGT}") as vt:
                    n = 0
                    for a, b in _pair_chunks(tags[WMT14_SRC], tags[WMT14_TGT], chunk_lines, bad):
                        for lines, to_train, to_valid in ((a, ws, vs), (b, wt, vt)):
                            rest, picked = split_every(lines, rec.valid_every, offset=n)
                            to_train.write(rest)
                            to_valid.write(picked)
                        n += len(a)
            else:
                progress(f"{WMT14}: cleaning the training pairs ({rec.clean['min_len']}-"
                         f"{rec.clean['max_len']} tokens, ratio {rec.clean['ratio']:g})")
                for a, b in _pair_chunks(tags[WMT14_SRC], tags[WMT14_TGT], chunk_lines, bad):
                    kept = list(clean_pairs(zip(a, b), **rec.clean, stats=stats))
                    ws.write(s for s, _ in kept)
                    wt.write(t for _, t in kept)
                counts["clean_dropped"] = stats["dropped"]

        # 4. BPE: learned on train.en + train.de (in that order, as the script's cat), or given.
        if codes is not None:
            bpe = SubwordNmtCodes.from_file(codes)
            counts["bpe"] = {"codes": str(codes), "merges": bpe.num_merges}
        else:
            progress(f"{WMT14}: learning a joint {merges}-merge BPE ({bpe_learner}"
                     + (", an hour or more on the full corpus" if bpe_learner == "subword-nmt" else "") + ")")
            words: collections.Counter = collections.Counter()
            for lang in langs:  # words as subword-nmt's learn_bpe.py splits them, in its order
                for chunk in _chunks(tmp / f"train.{lang}", chunk_lines, bad):
                    words.update(itertools.chain.from_iterable(line.split(" ") for line in chunk))
            words.pop("", None)
            bpe = _learn_counts(words, merges, bpe_learner)
            del words
            counts["bpe"] = {"learner": bpe_learner, "merges": bpe.num_merges}
        bpe.save(out / "code")

        # 5. Apply the BPE to every split; the fairseq recipe cleans train and valid after it.
        for split in ("train", "valid", "test"):
            src_in, tgt_in = tmp / f"{split}.{WMT14_SRC}", tmp / f"{split}.{WMT14_TGT}"
            n_in, done, stage = _count_lines(src_in), 0, f"BPE {split}"
            progress(f"{WMT14}: applying the BPE to {split} ({n_in:,} pairs)")
            tick(stage, 0, n_in)
            clean = rec.clean_after_bpe and split != "test"
            stats = {"dropped": 0}
            kept = 0
            with _Writer(out / f"{split}.{WMT14_SRC}") as ws, _Writer(out / f"{split}.{WMT14_TGT}") as wt:
                tasks = ((bpe.text, a, b) for a, b in _pair_chunks(src_in, tgt_in, chunk_lines, bad))
                for a, b in _ordered_map(_bpe_chunk, tasks, pool, workers):
                    done += len(a)
                    pairs = list(clean_pairs(zip(a, b), **rec.clean, stats=stats)) if clean else list(zip(a, b))
                    ws.write(s for s, _ in pairs)
                    wt.write(t for _, t in pairs)
                    kept += len(pairs)
                    tick(stage, done, n_in)
            counts[split] = kept
            if clean:
                counts[f"{split}_clean_dropped"] = stats["dropped"]
        if bad[0]:
            counts["not_utf8_lines"] = bad[0]
            progress(f"{WMT14}: {bad[0]} lines were not valid UTF-8 (bytes replaced by U+FFFD), "
                     f"the first at {bad[1]}")
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        _WORKER.clear()
    counts["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "prepare.json").write_text(json.dumps(counts, indent=1) + "\n", encoding="utf-8")
    return counts


def _learn_counts(words: collections.Counter, merges: int, learner: str) -> SubwordNmtCodes:
    if learner == "tokenizers":
        return learn_bpe_from_counts(words, merges)
    out = io.StringIO()
    vocab = io.StringIO("".join(f"{w} {n}\n" for w, n in words.items()))
    with contextlib.redirect_stderr(io.StringIO()):
        snmt_learn(vocab, out, merges, is_dict=True)  # min_frequency 2, as learn_bpe.py -s N
    return SubwordNmtCodes(out.getvalue(), source="<subword-nmt learn_bpe>")


# --------------------------------------------------------------------------------------------
# Command line

def default_multi30k_raw() -> Path:
    """Where `deepinit data prepare multi30k` looks when --raw is not given: the raw/ folder of
    the Multi30k copy under the data root (read from the environment at each call)."""
    return default_corpus_dir("multi30k") / "raw"
