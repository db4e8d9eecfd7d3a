"""`deepinit data download|prepare NAME`: fetch a corpus's raw files into the per-user cache
(runner/data/download.py), or prepare a corpus from them (runner/data/prepare.py)."""
from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Iterator, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from runner.data.corpus import CorpusError
from runner.data.download import CORPORA, DOWNLOADS_FOLDER, MIRROR_ENV, download
from runner.data.prepare import (
    IWSLT14_BPE_MERGES,
    WMT14_RECIPES,
    default_multi30k_raw,
    prepare_iwslt14,
    prepare_multi30k,
    prepare_wmt14,
)

PREPARED = ("iwslt14", "multi30k", "wmt14-en-de")  # the corpora `data prepare` knows
_NAME_WIDTH = max(len(name) for name in CORPORA)
CORPORA_HELP = "corpora:\n" + "\n".join(f"  {name:<{_NAME_WIDTH}}  {c.about}" for name, c in CORPORA.items())
WHERE_HELP = (f"Downloads go to DATA_ROOT/{DOWNLOADS_FOLDER}/NAME, where DATA_ROOT is $DEEPINIT_DATA_ROOT,\n"
              "else $XDG_CACHE_HOME/deepinit/data (~/.cache/deepinit/data); see docs/data.md.")


def _error(err: Console, message: str) -> int:
    """One line on stderr, as every deepinit command words its errors; exit code 2 (no traceback)."""
    err.print(f"deepinit: [bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return 2


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]):
    """(args, None), or (None, exit code) for --help (0) and bad arguments (2)."""
    try:
        return parser.parse_args(list(argv)), None
    except SystemExit as e:
        return None, 0 if e.code == 0 else 2


def _fetch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mirror", metavar="URL",
                        help=f"fetch each file FILE from URL/FILE instead of its known URLs "
                             f"(default: ${MIRROR_ENV} when set)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it is drawn only when stderr is a terminal)")


def main_download(argv: Sequence[str]) -> int:
    """`deepinit data download NAME [--dir DIR] [--mirror URL]`; exit code 0 or 2."""
    console, err = Console(), Console(stderr=True)
    parser = argparse.ArgumentParser(
        prog="deepinit data download", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fetch a corpus's raw files: known URLs with mirrors, SHA-256 checked where\n"
                    "known and recorded always, resumable, archives unpacked safely.\n" + WHERE_HELP,
        epilog=CORPORA_HELP)
    parser.add_argument("corpus", choices=list(CORPORA))
    parser.add_argument("--dir", help=f"download folder (default: DATA_ROOT/{DOWNLOADS_FOLDER}/NAME)")
    _fetch_options(parser)
    args, code = _parse(parser, argv)
    if args is None:
        return code
    try:
        result = download(args.corpus, args.dir, mirror=args.mirror,
                          progressbar=not args.no_progress and err.is_terminal,
                          progress=lambda msg: console.print(f"[dim]{msg}[/]", highlight=False))
    except CorpusError as e:
        return _error(err, str(e))
    folder = Path(result["folder"])
    for record in result["files"]:
        check = "verified" if record["verified"] else "recorded, no known hash"
        console.print(f"  {record['file']}  sha256 {record['sha256']} ({check})", highlight=False)
    console.print(f"[green]downloaded {args.corpus}[/] into {folder}", highlight=False)
    if args.corpus == "multi30k":
        console.print(f"prepare it with: deepinit data prepare multi30k --raw {folder}", highlight=False)
    elif args.corpus == "iwslt14":
        console.print(f"prepare it with: deepinit data prepare iwslt14 --raw {folder / 'de-en.tgz'}",
                      highlight=False)
    elif args.corpus == "tinyshakespeare":
        # data=shakespeare_char finds the default download folder itself; another needs data.dir
        where = f" data.dir={shlex.quote(str(folder))}" if args.dir else ""
        console.print(f"train on it with: deepinit train task=lm data=shakespeare_char{where}",
                      highlight=False, soft_wrap=True)
    else:
        console.print(f"prepare it with: deepinit data prepare wmt14-en-de --raw {folder}", highlight=False)
    return 0


@contextlib.contextmanager
def _line_bars(enabled: bool, progress) -> Iterator[tuple]:
    """(tick, say): tick(stage, done, total) draws one bar per stage on stderr (lines done, time
    left); say(message) prints above the bars (through `progress` when they are not drawn)."""
    bars = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("lines"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=not enabled)
    tasks: dict[str, int] = {}

    def tick(stage: str, done: int, total: int | None) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total)
        bars.update(tasks[stage], completed=done, total=total)

    def say(message: str) -> None:
        if enabled:
            bars.console.print(f"[dim]{message}[/]", highlight=False)
        else:
            progress(message)

    with bars:
        yield tick, say


def main_prepare(argv: Sequence[str]) -> int:
    """`deepinit data prepare iwslt14|multi30k|wmt14-en-de [--raw PATH] [--out DIR]`; exit code 0
    or 2. Without --raw the raw files are downloaded first (as `deepinit data download NAME`)."""
    console, err = Console(), Console(stderr=True)
    default_raw = default_multi30k_raw()
    parser = argparse.ArgumentParser(
        prog="deepinit data prepare", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Prepare a corpus from its raw files. Without --raw they are downloaded first\n"
                    "(as `deepinit data download NAME`) and their SHA-256 is kept in OUT/prepare.json.\n"
                    + WHERE_HELP,
        epilog="corpora: iwslt14, multi30k, wmt14-en-de\n\n"
               "wmt14-en-de runs fairseq's prepare-wmt14en2de.sh (--recipe fairseq: valid = every\n"
               "100th training line, 40,000 merges) or Transformer-Clinic's wmt14en-de.sh, the data\n"
               "of the paper presets (--recipe admin: newstest2013 valid, 32,764 merges). About\n"
               "4.5M sentence pairs: roughly 40 CPU-minutes of tokenizing and BPE, divided among\n"
               "--workers (docs/data.md).")
    parser.add_argument("corpus", choices=list(CORPORA))
    parser.add_argument("--raw", help="iwslt14: de-en.tgz; multi30k: the folder of raw/*.gz "
                        f"(default for multi30k: {default_raw} when present, else downloaded); "
                        "wmt14-en-de: the folder of the five .tgz archives (or of what "
                        "`deepinit data download wmt14-en-de` unpacked there)")
    parser.add_argument("--out", help="output folder (default: data/CORPUS)")
    parser.add_argument("--bpe-merges", type=int, default=None,
                        help=f"iwslt14, wmt14-en-de: joint BPE merges (default: iwslt14 "
                             f"{IWSLT14_BPE_MERGES}; wmt14-en-de "
                             + ", ".join(f"{r.bpe_merges} with --recipe {name}"
                                         for name, r in WMT14_RECIPES.items()) + ")")
    parser.add_argument("--bpe-learner", choices=["tokenizers", "subword-nmt"],
                        default="tokenizers",
                        help="iwslt14, wmt14-en-de: which learner (default tokenizers)")
    parser.add_argument("--codes", help="iwslt14, wmt14-en-de: apply these subword-nmt codes "
                        "instead of learning a BPE (e.g. fairseq's code file)")
    parser.add_argument("--recipe", choices=list(WMT14_RECIPES), default="fairseq",
                        help="wmt14-en-de: fairseq's prepare-wmt14en2de.sh (default) or "
                             "Transformer-Clinic's wmt14en-de.sh (admin)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="wmt14-en-de: processes for the tokenizer and the BPE "
                             "(default: the number of CPUs, %(default)s here)")
    _fetch_options(parser)
    args, code = _parse(parser, argv)
    if args is None:
        return code
    if args.corpus not in PREPARED:
        return _error(err, f"{args.corpus}: `deepinit data prepare` is not implemented for it; "
                      f"`deepinit data download {args.corpus}` fetches the raw files (docs/data.md)")
    if args.workers < 1:
        return _error(err, f"--workers must be at least 1, got {args.workers}")
    out = Path(args.out or Path("data") / args.corpus)
    bars = not args.no_progress and err.is_terminal

    def progress(msg: str) -> None:
        console.print(f"[dim]{msg}[/]", highlight=False)

    try:
        raw, downloads = args.raw, None
        if raw is None and args.corpus == "multi30k" and default_raw.is_dir():
            raw = default_raw
        if raw is None:
            fetched = download(args.corpus, mirror=args.mirror, progress=progress, progressbar=bars)
            downloads = fetched["files"]
            raw = Path(fetched["folder"]) / ("de-en.tgz" if args.corpus == "iwslt14" else "")
        if args.corpus == "iwslt14":
            merges = IWSLT14_BPE_MERGES if args.bpe_merges is None else args.bpe_merges
            counts = prepare_iwslt14(raw, out, bpe_merges=merges,
                                     bpe_learner=args.bpe_learner, codes=args.codes,
                                     progress=progress, downloads=downloads)
        elif args.corpus == "wmt14-en-de":
            with _line_bars(bars, progress) as (tick, say):
                counts = prepare_wmt14(raw, out, recipe=args.recipe, bpe_merges=args.bpe_merges,
                                       bpe_learner=args.bpe_learner, codes=args.codes,
                                       workers=args.workers, progress=say, tick=tick,
                                       downloads=downloads)
        else:
            counts = prepare_multi30k(raw, out, progress=progress, downloads=downloads)
    except CorpusError as e:  # PrepareError, DownloadError, BPE/reading errors: one line
        return _error(err, str(e))
    except ValueError as e:
        return _error(err, str(e))
    sizes = ", ".join(f"{k} {v}" for k, v in counts.items() if isinstance(v, int))
    console.print(f"[green]prepared {args.corpus}[/] in {out}: {sizes}")
    if args.corpus == "wmt14-en-de":
        console.print(f"use it with: deepinit data=custom data.dir={out.resolve()} data.source_lang=en "
                      f"data.target_lang=de data.bpe=none, or DEEPINIT_WMT14_DIR={out.resolve()} "
                      "for the paper-scale presets", highlight=False, soft_wrap=True)
    else:
        console.print(f"use it with: deepinit data={args.corpus} data.dir={out.resolve()}")
    return 0


COMMANDS = {"download": main_download, "prepare": main_prepare}


def main(argv: Sequence[str]) -> int:
    """`deepinit data download|prepare ...` (the CLI's `data` verb)."""
    argv = list(argv)
    parser = argparse.ArgumentParser(
        prog="deepinit data", formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="deepinit data {download,prepare} NAME [options]",
        description="download NAME   fetch a corpus's raw files into the per-user cache\n"
                    "prepare NAME    prepare a corpus (iwslt14, multi30k, wmt14-en-de) from its raw\n"
                    "                files, downloading them first unless --raw PATH is given\n\n"
                    + WHERE_HELP,
        epilog=CORPORA_HELP + "\n\n`deepinit data COMMAND --help` shows a command's options.")
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    parser.print_usage(sys.stderr)
    what = f"unknown command {argv[0]!r}" if argv else "a command is required"
    print(f"deepinit data: error: {what} (download, prepare)", file=sys.stderr)
    return 2
