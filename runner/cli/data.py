"""`deepinit data prepare iwslt14|multi30k`: a corpus prepared from its raw files
(runner/data/prepare.py)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from rich.console import Console

from runner.data.corpus import CorpusError
from runner.data.prepare import IWSLT14_BPE_MERGES, default_multi30k_raw, prepare_iwslt14, prepare_multi30k


def main_prepare(argv: Sequence[str]) -> int:
    """`deepinit data prepare iwslt14|multi30k --raw PATH --out DIR`; exit code 0 or 2."""
    console, err = Console(), Console(stderr=True)
    default_raw = default_multi30k_raw()
    parser = argparse.ArgumentParser(prog="deepinit data prepare",
                                     description="Prepare a corpus from its raw files (no downloads).")
    parser.add_argument("corpus", choices=["iwslt14", "multi30k"])
    parser.add_argument("--raw", help="iwslt14: de-en.tgz; multi30k: the folder of raw/*.gz "
                        f"(default for multi30k: {default_raw} when present)")
    parser.add_argument("--out", help="output folder (default: data/CORPUS)")
    parser.add_argument("--bpe-merges", type=int, default=IWSLT14_BPE_MERGES,
                        help="iwslt14: joint BPE merges (default 10000, as fairseq)")
    parser.add_argument("--bpe-learner", choices=["tokenizers", "subword-nmt"],
                        default="tokenizers", help="iwslt14: which learner (default tokenizers)")
    parser.add_argument("--codes", help="iwslt14: apply these subword-nmt codes instead of "
                        "learning a BPE (e.g. fairseq's code file)")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    out = Path(args.out or Path("data") / args.corpus)

    def progress(msg: str) -> None:
        console.print(f"[dim]{msg}[/]")

    try:
        if args.corpus == "iwslt14":
            counts = prepare_iwslt14(args.raw, out, bpe_merges=args.bpe_merges,
                                     bpe_learner=args.bpe_learner, codes=args.codes,
                                     progress=progress)
        else:
            raw = args.raw or (default_raw if default_raw.is_dir() else None)
            counts = prepare_multi30k(raw, out, progress=progress)
    except CorpusError as e:  # PrepareError and BPE/reading errors: one line, no traceback
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        return 2
    except ValueError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        return 2
    sizes = ", ".join(f"{k} {v}" for k, v in counts.items() if isinstance(v, int))
    console.print(f"[green]prepared {args.corpus}[/] in {out}: {sizes}")
    console.print(f"use it with: deepinit data={args.corpus} data.dir={out.resolve()}")
    return 0


def main(argv: Sequence[str]) -> int:
    """`deepinit data prepare ...` (the CLI's `data` verb)."""
    argv = list(argv)
    if not argv or argv[0] != "prepare":
        Console(stderr=True).print("usage: deepinit data prepare iwslt14|multi30k --raw PATH "
                                   "[--out DIR]", highlight=False)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return main_prepare(argv[1:])
