"""`deepinit eval RUN_DIR`: decode a split of a finished run and score it (BLEU)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from runner.config import ConfigError
from runner.console import progress_lines
from runner.data.corpus import CorpusError
from runner.run.evaluate import EvalError, evaluate_run


def fewer_checkpoints(used: list[str], average_last: int, run_dir: str) -> str | None:
    """The warning when --average-last asked for more checkpoints than the run kept."""
    if average_last <= 1 or len(used) >= average_last:
        return None
    what = ("no numbered checkpoints, so checkpoint_last.pt alone was scored"
            if used == ["checkpoint_last.pt"] else
            "only 1 numbered checkpoint, so it was scored alone" if len(used) == 1 else
            f"only {len(used)} numbered checkpoints, so those {len(used)} were averaged")
    return (f"deepinit: warning: --average-last {average_last}: {run_dir} has {what} "
            "(trainer.keep_checkpoints=K keeps the last K when training)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="deepinit eval", description="Decode a split of a run and score it (BLEU).")
    parser.add_argument("run_dir", help="a run folder (holds checkpoint_*.pt)")
    parser.add_argument("--split", default="test", help="split name (default: test)")
    parser.add_argument("--beam", type=int, default=5, help="beam size; 1 = greedy (default 5)")
    parser.add_argument("--lenpen", type=float, default=1.0,
                        help="length penalty: score / len**lenpen (default 1)")
    parser.add_argument("--average-last", type=int, default=10,
                        help="average the last K numbered checkpoints (default 10; 0/1: "
                             "checkpoint_last.pt)")
    parser.add_argument("--checkpoint", default=None,
                        help="score this one checkpoint instead (e.g. checkpoint_best.pt)")
    parser.add_argument("--max-len-a", type=float, default=0.0,
                        help="max output length = a * source length + b (default a=0)")
    parser.add_argument("--max-len-b", type=int, default=200, help="(default b=200)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="source tokens per batch")
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per batch")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto (default cpu)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    parser.add_argument("--no-result", action="store_true",
                        help="do not add the scores to result.json")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return 2 if exc.code else 0
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.max_tokens < 1 or args.batch_size < 1:
            raise EvalError("--max-tokens and --batch-size must be positive")
        with progress_lines():  # on a pipe or in a log: a line every tenth of the sentences
            record = evaluate_run(args.run_dir, args.split, args.beam, args.lenpen, args.average_last,
                                  args.max_len_a, args.max_len_b, args.max_tokens, args.batch_size,
                                  args.device, update_result=not args.no_result,
                                  checkpoint=args.checkpoint)
    except (EvalError, ConfigError, CorpusError) as err:
        sys.stderr.write(f"deepinit: error: {err}\n")
        return 2
    ckpts = record["checkpoints"]
    if args.checkpoint is None and (warning := fewer_checkpoints(ckpts, args.average_last, args.run_dir)):
        sys.stderr.write(warning + "\n")
    used = ckpts[0] if len(ckpts) == 1 else f"average of {len(ckpts)} ({ckpts[0]} .. {ckpts[-1]})"
    print(f"{args.run_dir} {record['split']}: {record['sentences']} sentences, beam {record['beam']}, "
          f"lenpen {record['lenpen']}, {used}, {record['sentences_per_s']:.1f} sentences/s")
    print(f"BLEU (tokenized, the papers' protocol): {record['bleu']:.2f}")
    print(f"sacreBLEU (detokenized): {record['sacrebleu']:.2f}  {record['sacrebleu_signature']}")
    print(f"hypotheses: {Path(args.run_dir) / 'eval' / (record['split'] + '.hyp')}")
    return 0
