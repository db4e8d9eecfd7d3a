"""`deepinit data download|prepare NAME`: fetch a corpus's raw files into the per-user cache
(runner/data/download.py), or prepare a corpus from them (runner/data/prepare.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from rich.console import Console

from runner.data.corpus import CorpusError
from runner.data.download import CORPORA, DOWNLOADS_FOLDER, MIRROR_ENV, download
from runner.data.prepare import IWSLT14_BPE_MERGES, default_multi30k_raw, prepare_iwslt14, prepare_multi30k

PREPARED = ("iwslt14", "multi30k")  # corpora `data prepare` knows; wmt14-en-de is download only
CORPORA_HELP = "corpora:\n" + "\n".join(f"  {name:<12} {c.about}" for name, c in CORPORA.items())
WHERE_HELP = (f"Downloads go to DATA_ROOT/{DOWNLOADS_FOLDER}/NAME, where DATA_ROOT is $DEEPINIT_DATA_ROOT,\n"
              "else $XDG_CACHE_HOME/deepinit/data (~/.cache/deepinit/data); see docs/data.md.")


def _error(err: Console, message: str) -> int:
    """One line on stderr, exit code 2 (no traceback)."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
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
    else:
        console.print("deepinit has no prepare step for it; the unpacked folders hold the files "
                      "fairseq's prepare-wmt14en2de.sh reads", highlight=False)
    return 0


def main_prepare(argv: Sequence[str]) -> int:
    """`deepinit data prepare iwslt14|multi30k [--raw PATH] [--out DIR]`; exit code 0 or 2.
    Without --raw the raw files are downloaded first (as `deepinit data download NAME`)."""
    console, err = Console(), Console(stderr=True)
    default_raw = default_multi30k_raw()
    parser = argparse.ArgumentParser(
        prog="deepinit data prepare", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Prepare a corpus from its raw files. Without --raw they are downloaded first\n"
                    "(as `deepinit data download NAME`) and their SHA-256 is kept in OUT/prepare.json.\n"
                    + WHERE_HELP,
        epilog="corpora: iwslt14, multi30k (wmt14-en-de can be downloaded, not prepared)")
    parser.add_argument("corpus", choices=list(CORPORA))
    parser.add_argument("--raw", help="iwslt14: de-en.tgz; multi30k: the folder of raw/*.gz "
                        f"(default for multi30k: {default_raw} when present, else downloaded)")
    parser.add_argument("--out", help="output folder (default: data/CORPUS)")
    parser.add_argument("--bpe-merges", type=int, default=IWSLT14_BPE_MERGES,
                        help="iwslt14: joint BPE merges (default 10000, as fairseq)")
    parser.add_argument("--bpe-learner", choices=["tokenizers", "subword-nmt"],
                        default="tokenizers", help="iwslt14: which learner (default tokenizers)")
    parser.add_argument("--codes", help="iwslt14: apply these subword-nmt codes instead of "
                        "learning a BPE (e.g. fairseq's code file)")
    _fetch_options(parser)
    args, code = _parse(parser, argv)
    if args is None:
        return code
    if args.corpus not in PREPARED:
        return _error(err, f"{args.corpus}: `deepinit data prepare` is not implemented for it; "
                      f"`deepinit data download {args.corpus}` fetches and unpacks the raw files "
                      "(docs/data.md)")
    out = Path(args.out or Path("data") / args.corpus)

    def progress(msg: str) -> None:
        console.print(f"[dim]{msg}[/]", highlight=False)

    try:
        raw, downloads = args.raw, None
        if raw is None and args.corpus == "multi30k" and default_raw.is_dir():
            raw = default_raw
        if raw is None:
            fetched = download(args.corpus, mirror=args.mirror, progress=progress,
                               progressbar=not args.no_progress and err.is_terminal)
            downloads = fetched["files"]
            raw = Path(fetched["folder"]) / ("de-en.tgz" if args.corpus == "iwslt14" else "")
        if args.corpus == "iwslt14":
            counts = prepare_iwslt14(raw, out, bpe_merges=args.bpe_merges,
                                     bpe_learner=args.bpe_learner, codes=args.codes,
                                     progress=progress, downloads=downloads)
        else:
            counts = prepare_multi30k(raw, out, progress=progress, downloads=downloads)
    except CorpusError as e:  # PrepareError, DownloadError, BPE/reading errors: one line
        return _error(err, str(e))
    except ValueError as e:
        return _error(err, str(e))
    sizes = ", ".join(f"{k} {v}" for k, v in counts.items() if isinstance(v, int))
    console.print(f"[green]prepared {args.corpus}[/] in {out}: {sizes}")
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
                    "prepare NAME    prepare a corpus (iwslt14, multi30k) from its raw files,\n"
                    "                downloading them first unless --raw PATH is given\n\n"
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
