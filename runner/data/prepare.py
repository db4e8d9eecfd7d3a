"""`deepinit data prepare iwslt14|multi30k`: raw corpora to the text deepinit reads.

iwslt14 reproduces fairseq's examples/translation/prepare-iwslt14.sh in Python:
  train.tags.de-en.{de,en}: drop <url>/<talkid>/<keywords> lines, strip <title>/<description>
    tags, Moses tokenizer.perl -l LANG (sacremoses, with Moses' default XML escaping),
    clean-corpus-n.perl -ratio 1.5 1 175, lowercase.perl;
  IWSLT14.TED*.{de,en}.xml: <seg> text, ’ -> ', tokenize, lowercase;
  valid = every 23rd cleaned training line, train = the rest;
  test = TED.dev2010 + TEDX.dev2012 + TED.tst2010 + TED.tst2011 + TED.tst2012;
  one joint BPE of 10,000 merges learned on train.de + train.en and applied to every split.
Output is fairseq's layout: OUT/{train,valid,test}.{de,en} (BPE), OUT/code, OUT/tmp/ (pre-BPE).

multi30k reproduces multi30k/dataset scripts/task1-tokenize.sh (lowercase, Moses punctuation
normalization, Moses tokenizer) and writes OUT/{train,valid,test,...}.{de,en}; the BPE is learned
when the data is loaded (data.bpe=tokenizers).

The raw files are supplied with `--raw`; without it the `deepinit data prepare` command fetches
them first (runner/data/download.py, into DATA_ROOT/downloads/NAME) and records their SHA-256 in
prepare.json. The functions here never download.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Iterable, Sequence

from subword_nmt.learn_bpe import learn_bpe as snmt_learn

from runner.data.corpus import CorpusError, decode_lines, default_corpus_dir, read_lines
from runner.data.download import IWSLT14_ORIGINAL_URL, IWSLT14_URL, MULTI30K_URL, check_tar_members
from runner.data.moses import moses_normalize, moses_tokenize
from runner.data.subword import SubwordNmtCodes, learn_bpe

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
    factored = bool(src) and ("|" in src[0] or "|" in tgt[0])
    keep_s, keep_t = [], []
    too_long_word = re.compile(r"[^\s|]{%d}" % (max_word_length + 1))
    for s, t in zip(src, tgt):
        if not factored:
            s, t = s.replace("|", ""), t.replace("|", "")
        s = _SPACES.sub(" ", s).strip(" ")
        t = _SPACES.sub(" ", t).strip(" ")
        if not s or not t:
            continue
        ns, nt = len(s.split(" ")), len(t.split(" "))
        if not (min_len <= ns <= max_len and min_len <= nt <= max_len):
            continue
        if ns / nt > ratio or nt / ns > ratio:
            continue
        if too_long_word.search(s) or too_long_word.search(t):
            continue
        keep_s.append(s)
        keep_t.append(t)
    return keep_s, keep_t, len(src) - len(keep_s)


def split_every(lines: Sequence[str], every: int = IWSLT14_VALID_EVERY) -> tuple[list[str], list[str]]:
    """(rest, every n-th line counting from 1), as awk 'NR%n != 0' / 'NR%n == 0'."""
    rest = [line for i, line in enumerate(lines, start=1) if i % every]
    picked = [line for i, line in enumerate(lines, start=1) if i % every == 0]
    return rest, picked


# --------------------------------------------------------------------------------------------
# Output


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line)
            f.write("\n")
    os.replace(tmp, path)


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
# Command line

def default_multi30k_raw() -> Path:
    """Where `deepinit data prepare multi30k` looks when --raw is not given: the raw/ folder of
    the Multi30k copy under the data root (read from the environment at each call)."""
    return default_corpus_dir("multi30k") / "raw"
