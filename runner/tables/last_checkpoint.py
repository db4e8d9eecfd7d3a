"""BLEU of each real-tier cell's last checkpoint beside the average that its record scores
(`deepinit reproduce TARGET --last-checkpoint-bleu`).

The real tier scores the average of the last 5 checkpoints (saved every 200 of 2,000 updates), as
the papers do; there those 5 checkpoints span the last few percent of training, here they span 40%
(updates 1,200 to 2,000). Where a validation curve still falls steeply, that average mixes
weights of very different quality. Cells trained with trainer.final_bleu_last carry the last
checkpoint's BLEU in their record (bleu_last); for cells trained before that option, this measures
it on their run folders, without touching the folders or the records. The suite reports read its
output beside the records (runner/tables/records.py, LAST_CHECKPOINT_FILE).

For every cell folder of the suite's run folders (default `outputs/reproduce/TARGET-real`) whose
result.json matches a record of results/TARGET/real/records.jsonl (same overrides and seed, same
BLEU), it decodes test with the cell's own decoding settings twice: the averaged checkpoints the
record scored (a check: the BLEU must equal the record's) and checkpoint_last.pt alone. It
appends one line per cell to results/TARGET/real/last-checkpoint-bleu.jsonl (skipping cells
already there) and rewrites its table, last-checkpoint-bleu.md, from that file.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch

from runner.files import atomic_write_text
from runner.run.evaluate import evaluate_run
from runner.run.folder import environment
from runner.sweep.plan import canonical
from runner.tables.records import LAST_CHECKPOINT_FILE, Records, cell_key, results_root

TABLE_FILE = "last-checkpoint-bleu.md"
CHECK_TOLERANCE = 0.01  # BLEU points: the re-decoded average must give the record's score


def matching_record(records: Records, cell: Path, result: dict) -> dict | None:
    """The record of a run folder: the one keyed by its result-changing overrides (as the suites
    key them), if it scored the same BLEU."""
    lines = (cell / ".hydra" / "overrides.yaml").read_text().splitlines()
    record = records.get(sorted(canonical([line[2:].strip() for line in lines if line.startswith("- ")])))
    return record if record is not None and record.get("bleu") == result.get("bleu") else None


def decode(cell: Path, names: list[str], settings: dict) -> dict:
    """evaluate_run on a scratch folder that links the cell's files, so that nothing in the cell
    folder changes (evaluate_run writes eval/ beside the checkpoints)."""
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("dict.src.txt", "dict.tgt.txt", *names):
            (Path(scratch) / name).symlink_to(cell / name)
        # average_last=len(names) over exactly these numbered files; a single name is scored alone
        return evaluate_run(scratch, "test", settings["beam"], settings["lenpen"], len(names),
                            settings["max_len_a"], settings["max_len_b"], update_result=False,
                            echo=lambda *a, **k: None,
                            checkpoint=names[0] if len(names) == 1 else None)


def measure(target: str, suite_dir: Path, echo: Callable[[str], None] = print) -> int:
    """Measure every cell of SUITE_DIR that has a matching record of results/TARGET/real and no
    line yet in its last-checkpoint-bleu.jsonl, then rewrite last-checkpoint-bleu.md. Returns the
    number of cells measured."""
    torch.set_num_threads(1)
    measured = 0
    tier = results_root() / target / "real"
    records = Records.load(tier)
    out = tier / LAST_CHECKPOINT_FILE
    done = {cell_key(json.loads(line)["overrides"]) for line in out.read_text().splitlines()} if out.exists() else set()
    env = environment(torch.device("cpu"), "fp32")
    measured_with = {key: env[key] for key in ("device_name", "torch", "deepinit", "git_commit")}
    for cell in sorted(p for p in suite_dir.iterdir() if (p / "result.json").is_file()):
        result = json.loads((cell / "result.json").read_text())
        record = matching_record(records, cell, result)
        if record is None or result.get("status") != "ok" or "test" not in result.get("eval", {}):
            continue
        if cell_key(record["overrides"]) in done:
            continue
        settings = result["eval"]["test"]
        averaged = decode(cell, settings["checkpoints"], settings)
        if abs(averaged["bleu"] - record["bleu"]) > CHECK_TOLERANCE:
            sys.stderr.write(f"{cell.name}: the re-decoded average gives {averaged['bleu']:.2f} BLEU, "
                             f"the record {record['bleu']:.2f}; not measured\n")
            continue
        last = decode(cell, ["checkpoint_last.pt"], settings)
        line = {"overrides": record["overrides"], "seed": record["seed"], "arm": record["arm"],
                "averaged_checkpoints": settings["checkpoints"], "bleu_averaged": record["bleu"],
                "bleu_averaged_redecoded": averaged["bleu"], "bleu_last": last["bleu"],
                "sacrebleu_last": last["sacrebleu"], "valid_loss_last": result["valid_loss"],
                "best_valid_loss": record["best_valid_loss"],
                "beam": settings["beam"], "lenpen": settings["lenpen"],
                "record_commit": record["machine"]["git_commit"],
                "measured_with": measured_with}
        with out.open("a") as f:
            f.write(json.dumps(line) + "\n")
        measured += 1
        echo(f"{cell.name}: averaged {record['bleu']:.2f}, last {last['bleu']:.2f}")
    if out.exists():
        write_table(target, [json.loads(line) for line in out.read_text().splitlines()],
                    tier / TABLE_FILE)
    return measured


def write_table(target: str, lines: list[dict], path: Path) -> None:
    """last-checkpoint-bleu.md from the jsonl's lines."""
    rows = sorted(lines, key=lambda r: (sorted(r["arm"].items()), r["seed"]))
    gains = [r["bleu_last"] - r["bleu_averaged"] for r in rows]
    text = [f"# {target}: BLEU of the last checkpoint beside the average of the last 5",
            "",
            f"Written by `deepinit reproduce {target} --last-checkpoint-bleu` from last-checkpoint-bleu.jsonl. "
            "Both decode "
            "test2016 with the cell's own settings (beam, length penalty); 'averaged' is the record's "
            "BLEU (tokenized), re-decoded as a check.",
            "",
            "| arm | seed | best valid loss | BLEU averaged | BLEU last | last - averaged |",
            "|---|---|---|---|---|---|"]
    for r, gain in zip(rows, gains):
        arm = " ".join(f"{k}={v}" for k, v in r["arm"].items())
        text.append(f"| {arm} | {r['seed']} | {r['best_valid_loss']:.3f} | {r['bleu_averaged']:.2f} "
                    f"| {r['bleu_last']:.2f} | {gain:+.2f} |")
    text += ["", f"{len(rows)} cells; the last checkpoint scores higher in "
                 f"{sum(g > 0 for g in gains)} of them."]
    atomic_write_text(path, "\n".join(text) + "\n")
