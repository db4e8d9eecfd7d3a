"""`deepinit analyze WHAT`: the papers' diagnostic figures (runner/analysis/)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rich.console import Console

from runner.analysis import DEFAULT_CONFIGS, common, dependency, early_training, grad_norms, mode_gap, output_change
from runner.cli.compose import compose
from runner.config import ConfigError
from runner.data.corpus import CorpusError
from runner.run import folder


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepinit analyze",
                                     description="the papers' diagnostic figures")
    sub = parser.add_subparsers(dest="what", required=True)

    def common_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("args", nargs="*", metavar="OVERRIDE|RUN_DIR",
                       help="key=value overrides applied to every configuration, or finished "
                            "run folders (their config and checkpoints are reused)")
        p.add_argument("--config", action="append", default=[], metavar="OVERRIDES",
                       help='one configuration, e.g. "norm=post init=admin" (repeatable)')
        p.add_argument("--out", type=Path, default=None, help="output folder")
        p.add_argument("--sentences", type=int, default=32,
                       help="training pairs in the fixed input batch x0")
        p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")

    p = sub.add_parser("output-change", help="Admin Fig. 4")
    common_args(p)
    p.add_argument("--depths", default="2,4,8,16", help="layers per stack, comma-separated")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--eps", type=float, default=0.01,
                   help="random perturbation, relative to each weight tensor's std")
    p.add_argument("--lr", type=float, default=None, help="Adam step size (default optim.lr)")
    p.add_argument("--output", choices=("encoder", "decoder"), default="encoder",
                   help="which output the plot shows (both are in the JSON)")

    p = sub.add_parser("grad-norms", help="Admin Fig. 3")
    common_args(p)
    p.add_argument("--depth", type=int, default=None, help="layers per stack (default: config)")
    p.add_argument("--seeds", default="1,2,3")

    p = sub.add_parser("dependency", help="Admin Figs. 7/8")
    common_args(p)
    p.add_argument("--depth", type=int, default=None, help="layers per stack (default: config)")
    p.add_argument("--seed", type=int, default=None, help="init seed (default trainer.seed)")

    p = sub.add_parser("mode-gap", help="a checkpoint's train/valid loss with dropout on and off")
    p.add_argument("checkpoint", type=Path, help="a checkpoint_*.pt of a run")
    p.add_argument("batches", type=int, nargs="?", default=8,
                   help="the first N batches of train and valid (default 8)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default outputs/analysis/mode-gap)")

    p = sub.add_parser("early-training", help="T-Fixup Figs. 2, 3a/b")
    common_args(p)
    p.add_argument("--updates", type=int, default=100, help="K: updates to follow")
    p.add_argument("--warmup-updates", type=int, default=4000,
                   help="warmup length of the 'with warmup' arm (T-Fixup's baseline: 4000)")
    return parser


def _settings(ns):
    overrides = [a for a in ns.args if not common.is_run_dir(a)]
    runs = [a for a in ns.args if common.is_run_dir(a)]
    bad = [a for a in overrides if "=" not in a]
    if bad:
        raise ConfigError(f"{bad[0]!r}: neither a key=value override nor a run folder "
                          "(a folder with .hydra/config.yaml)")
    configs = list(ns.config) + runs
    return common.settings_from(configs, overrides, DEFAULT_CONFIGS[ns.what], compose)


def _mode_gap(ns) -> int:
    """The JSON on stdout (what `> FILE` keeps) and in OUT/mode_gap.json."""
    if ns.batches < 1:
        sys.stderr.write(f"deepinit: error: batches={ns.batches}: expected >= 1\n")
        return 2
    if not ns.checkpoint.is_file():
        sys.stderr.write(f"deepinit: error: {ns.checkpoint}: no such checkpoint\n")
        return 2
    try:
        result = mode_gap.run(ns.checkpoint, ns.batches)
    except (ConfigError, CorpusError) as err:
        sys.stderr.write(f"deepinit: error: {err}\n")
        return 2
    out = ns.out or Path("outputs") / "analysis" / ns.what
    folder.write_json(out / "mode_gap.json", result, indent=1)
    print(json.dumps(result, indent=1))
    sys.stderr.write(f"wrote {out / 'mode_gap.json'}\n")
    return 0


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    if ns.what == "mode-gap":
        return _mode_gap(ns)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    console = Console()
    out = ns.out or Path("outputs") / "analysis" / ns.what
    log = lambda msg: console.log(msg)  # noqa: E731
    try:
        if ns.sentences < 1:
            raise ConfigError(f"--sentences={ns.sentences}: expected >= 1")
        settings = _settings(ns)
        stem = ns.what.replace("-", "_")
        out.mkdir(parents=True, exist_ok=True)
        pngs = []
        if ns.what == "output-change":
            mod = output_change
            depths = common.parse_ints(ns.depths)
            result = mod.run(settings, depths, common.parse_ints(ns.seeds), ns.eps, ns.sentences,
                             ns.lr, progress=log)
            pngs.append(out / f"{stem}.png")
            mod.plot(result, pngs[0], ns.output)
        elif ns.what == "grad-norms":
            mod = grad_norms
            result = mod.run(settings, ns.depth, common.parse_ints(ns.seeds), ns.sentences,
                             progress=log)
            pngs.append(out / f"{stem}.png")
            mod.plot(result, pngs[0])
        elif ns.what == "dependency":
            mod = dependency
            result = mod.run(settings, ns.depth, ns.seed, ns.sentences, progress=log)
            pngs.append(out / f"{stem}.png")
            mod.plot(result, pngs[0])
        else:
            mod = early_training
            if ns.updates < 1:
                raise ConfigError(f"--updates={ns.updates}: expected >= 1")
            result = mod.run(settings, ns.updates, ns.warmup_updates, progress=log)
            pngs += [out / "early_training_histograms.png", out / "early_training_ln_norms.png"]
            mod.plot_histograms(result, pngs[0])
            mod.plot_ln_norms(result, pngs[1])
        tables = mod.summary(result)
        result["command"] = ["deepinit", "analyze", *argv]
        folder.write_json(out / f"{stem}.json", result, indent=1)
    except (ConfigError, CorpusError) as err:
        sys.stderr.write(f"deepinit: error: {err}\n")
        return 2
    for table in tables:
        console.print(table)
    console.print(f"wrote {out / f'{stem}.json'} and {', '.join(str(p) for p in pngs)}")
    return 0
