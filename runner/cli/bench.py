"""`deepinit bench`: training and decoding throughput, memory and MFU (runner/bench/)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runner import bench
from runner.bench.entries import DECODE_SENTENCES, LM_PRESETS, PEER_CONFIGS, PRESETS
from runner.bench.run import run_bench
from runner.cli.compose import compose


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="deepinit bench", description=bench.__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="*", default=None,
                   help=f"of {', '.join([*PRESETS, *LM_PRESETS])} (default: tiny small ci, + base on "
                        "CUDA; lm-nanogpt-cpu: task=lm's nanoGPT CPU preset)")
    # strings: key=value words after --depths are overrides (resolve_args moves them, as for --presets)
    p.add_argument("--depths", nargs="*", default=[6, 50, 100, 200],
                   help="layers per stack for the depth scaling entries (none: skip)")
    p.add_argument("--depth-max-tokens", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=None, help="untimed updates (default per preset)")
    p.add_argument("--steps", type=int, default=None, help="updates per timed window")
    p.add_argument("--windows", type=int, default=None, help="timed windows (repeats)")
    p.add_argument("--decode-sentences", type=int, default=DECODE_SENTENCES)
    p.add_argument("--no-decode", action="store_true")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off", "both"],
                   help="torch.compile the model (auto: on CUDA; both: every preset eager and "
                        "compiled, as entries NAME-eager and NAME-compiled)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: a few updates of the ci preset (or of --presets) and one "
                        "2+2-layer depth entry (or --depths); the CPU peak measured for 0.2 s per "
                        "matrix size, not 1.5 s")
    p.add_argument("--peak-gflops", type=float, default=None, metavar="G",
                   help="MFU against G GFLOP/s (a datasheet figure, or one measured before) instead "
                        "of the CPU's measured fp32 matmul peak or the GPU's datasheet bf16 peak")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON path (default outputs/bench/bench-<time>.json; with --peer "
                        "outputs/bench/bench-peer-<time>.json)")
    p.add_argument("--work", type=Path, default=Path("outputs/bench/work"),
                   help="scratch folder: corpus text, data cache, run folders")
    p.add_argument("--peer", action="store_true",
                   help="only the side-by-side: deepinit and fairseq alternating (make bench-peer)")
    p.add_argument("--reference", action="store_true",
                   help="also time the same training step in plain PyTorch (torch.nn.Transformer), "
                        "alternating with deepinit's, --reps times")
    p.add_argument("--peer-configs", nargs="*", default=list(PEER_CONFIGS),
                   choices=list(PEER_CONFIGS))
    p.add_argument("--peer-tools", type=Path, default=None,
                   help="--peer: the folder of peer_setup.sh / peer_train_bench.sh (make bench-peer "
                        "passes PEER_TOOLS)")
    p.add_argument("--reps", type=int, default=3,
                   help="--peer, --reference: alternating runs per side and configuration")
    p.add_argument("--decode-reps", type=int, default=3,
                   help="--peer: how many of the runs also decode (default: all three, since one "
                        "decoding run per side moves by 10-25%% between calls)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after each entry's timed windows, profile N more training updates with "
                        "torch.profiler (not in the timed figures): the operators by self time "
                        "(the GPU's on CUDA) go to <JSON stem>.<entry>.profile.txt, a Chrome/Perfetto "
                        "trace to <JSON stem>.<entry>.trace.json, the top 10 into the JSON and the "
                        "printed table")
    p.add_argument("--quiet-wait", type=int, default=20,
                   help="--peer: seconds the peer script waits for a quiet machine before each run")
    p.add_argument("override", nargs="*", help="extra config overrides for every entry (key=value)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        return run_bench(args, argv, compose)
    except KeyboardInterrupt:  # outside the entries (run_bench keeps the finished ones): one line
        sys.stderr.write("deepinit bench: interrupted\n")
        return 130
