"""Committed evidence: compact per-cell records of a reproduction target under results/.

    results/<target>/<tier>/records.jsonl   one JSON line per trained cell (one seed of one arm)
    results/<target>/<tier>/report.md       the table, the claims and their verdicts
    results/<target>/<tier>/curves.png      validation loss curves by arm

A record holds what a reader needs to audit a number: the cell's overrides and seed, status,
losses, BLEU (tokenized and sacreBLEU), updates, wall time, the validation and training curves, and where and
with what it ran (CPU or GPU name, threads, torch and deepinit versions, git commit). A later run
of the target reuses the records it finds (same overrides, same seed) instead of training again,
so a suite can be completed over several sittings.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from runner.files import atomic_write_text
from runner.run import folder
from runner.run.status import FAILED, run_status

RESULT_FIELDS = ("status", "reason", "diverged_step", "stalled", "updates", "epochs", "train_loss",
                 "valid_loss", "best_valid_loss", "best_valid_nll", "valid_unigram_nll", "bleu",
                 "sacrebleu", "sacrebleu_signature", "bleu_last", "sacrebleu_last", "wall_s",
                 "tokens_per_s", "seconds_per_update", "peak_memory_mb", "parameters",
                 "initial_loss", "first_logged_loss", "stopped_early", "stop_update", "early_stop")
ENV_FIELDS = ("device", "device_name", "threads", "precision", "compile", "compile_scope", "host_allocator",
              "torch", "deepinit", "git_commit", "platform")


def results_root() -> Path:
    """results/ at the top of the checkout ($DEEPINIT_RESULTS overrides it)."""
    env = os.environ.get("DEEPINIT_RESULTS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "results"


def cell_key(overrides: Sequence[str]) -> str:
    """A cell's identity: its result-changing overrides, sorted (seed included)."""
    return ",".join(sorted(overrides))


# Measured on a tier's run folders after training, one JSON line per cell keyed by the record's
# overrides (runner/tables/last_checkpoint.py writes it: deepinit reproduce TARGET --last-checkpoint-bleu):
# {"overrides", "seed", "bleu_last", ...}.
LAST_CHECKPOINT_FILE = "last-checkpoint-bleu.jsonl"


def _jsonl_by_key(path: Path) -> dict[str, dict]:
    by_key: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                by_key[cell_key(entry["overrides"])] = entry
    return by_key


@dataclass
class Records:
    """The records of one target and tier, keyed by cell_key, and the BLEU of each cell's last
    checkpoint where it was measured on the run folder afterwards (`bleu_last`, same keys). Only
    the records are ever written back."""

    path: Path
    by_key: dict[str, dict]
    bleu_last: dict[str, float] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path) -> "Records":
        path = Path(directory) / "records.jsonl"
        by_key = _jsonl_by_key(path)
        # a measurement belongs to the record it was taken beside: same cell, same averaged BLEU
        # (a cell trained again since then has another record, and the old number is dropped)
        bleu_last = {key: entry["bleu_last"]
                     for key, entry in _jsonl_by_key(Path(directory) / LAST_CHECKPOINT_FILE).items()
                     if key in by_key and entry.get("bleu_averaged") == by_key[key].get("bleu")}
        return cls(path, by_key, bleu_last)

    def get(self, overrides: Sequence[str]) -> Optional[dict]:
        return self.by_key.get(cell_key(overrides))

    def put(self, record: dict) -> None:
        self.by_key[cell_key(record["overrides"])] = record

    def save(self) -> None:
        """Atomic rewrite, cells in key order (stable diffs)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, "".join(json.dumps(self.by_key[k], sort_keys=True) + "\n"
                                             for k in sorted(self.by_key)))


def record_from_run(run_dir: Path, overrides: Sequence[str], arm: dict[str, str],
                    seed: int) -> Optional[dict]:
    """The record of a finished run folder (None while it has no result.json)."""
    result = folder.read_result(run_dir)
    if not result:
        return None
    env = folder.read_json(Path(run_dir) / "env.json") or {}
    status = run_status(result) or FAILED
    metrics = folder.read_metrics(run_dir)
    curve = [(r["step"], r["loss"]) for r in metrics if r.get("split") == "valid"]
    # the validation NLL beside the loss trained on (label-smoothed where the preset smooths): what
    # the unigram NLL and the stall rule compare with, kept for rules that read the NLL's curve
    nll_curve = [(r["step"], r["nll_loss"]) for r in metrics if r.get("split") == "valid" and "nll_loss" in r]
    # the logged training loss (each the mean over its log interval): what loss spikes are read from
    train_curve = [(r["step"], r["loss"]) for r in metrics if r.get("split") == "train"]
    record: dict[str, Any] = {
        "overrides": sorted(overrides), "arm": dict(arm), "seed": int(seed),
        **{k: result.get(k) for k in RESULT_FIELDS}, "status": status,
        "valid_curve": curve, "valid_nll_curve": nll_curve, "train_curve": train_curve,
        "machine": {k: env.get(k) for k in ENV_FIELDS},
    }
    return record
