"""A reproduction suite on real data (`SCALE=real` on CPU, `SCALE=gpu` on one GPU): its cells and
the verdicts on its claims.

Each cell is one seed of one arm of a preset in sweeps/, trained by one process (`python -m
runner.run`, on the config `deepinit train` would compose: runner/tables/pool.py). A finished cell's
record is written to results/<target>/<tier>/records.jsonl at once (runner/tables/records.py), so an
interrupted suite keeps what it finished, and a later call (on this machine or another) trains only
the cells that have no record yet. The preset's `sweep.claims` are the pre-registered decision rules
(runner/tables/evidence.py), judged here on the records under a rule book
(runner/tables/rulebook.py); runner/tables/report.py writes the suite's report.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from runner.console import fmt
from runner.run.folder import folder_name
from runner.sweep.plan import canonical, load_preset, norm_key, plan_cells, run_only
from runner.tables.claims import METRIC_KINDS, Claim, Record, Verdict, claim_from_dict, selector_matches
from runner.tables.evidence import judge_all
from runner.tables.records import Records, cell_key, results_root
from runner.tables.rulebook import CURRENT, loss_spikes, outcome, rulebook

SEED_AXIS = "trainer.seed"


@dataclass
class SuiteCell:
    overrides: list[str]  # what the cell's config is composed from (the preset, the cell's axes, extras)
    key: list[str]  # the result-changing overrides, canonical (the record's identity)
    arm: dict[str, str]  # the axes other than the seed
    seed: int
    record: Optional[dict] = None
    bleu_last_measured: Optional[float] = None  # the last checkpoint's BLEU, measured on the run folder afterwards

    @property
    def name(self) -> str:
        return folder_name(self.key, "default")

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.arm.items()) + f" seed={self.seed}"


def plan(preset: str, extra: Sequence[str] = ()) -> list[SuiteCell]:
    """The preset's cells in the preset's axis order, without the arms its `sweep.exclude`
    lists (each a {axis: value} selector). Extra overrides that change no result (e.g.
    trainer.device=cpu) reach every cell's command but not its key.

    An extra override of a preset axis (`model.layers=6`, `++trainer.seed=2`: part of a suite)
    is written with the preset's own spelling of the key and stays in the arm, so the cell is
    the whole suite's cell (the same command, key, arm and seed), and the preset's exclusions
    and claims still see it."""
    spec = load_preset(preset)
    spelling = {norm_key(k): k for k in ((spec.get("hydra") or {}).get("sweeper") or {}).get("params") or {}}
    preset_axes = list(spelling)
    cells, fixed = plan_cells(preset, extra, respell=True)

    def respelled(key: str) -> str:
        return key if key.startswith("~") else spelling.get(norm_key(key), key)

    cells = [{respelled(k): v for k, v in axes.items()} for axes in cells]
    fixed = [f"{respelled(k)}={v}" for k, _, v in (o.partition("=") for o in fixed)]
    pinned = {norm_key(k): v for k, _, v in (o.partition("=") for o in fixed) if not k.startswith("~")}
    # each a selector as in a claim: a list value matches any of its values
    exclude = [{k: tuple(str(x) for x in v) if isinstance(v, (list, tuple)) else str(v) for k, v in sel.items()}
               for sel in (spec.get("sweep") or {}).get("exclude") or []]
    out = []
    for axes in cells:
        overrides = [f"+sweep={preset}", *(f"{k}={v}" for k, v in axes.items()), *fixed, *run_only(extra)]
        swept = {norm_key(k): v for k, v in axes.items()}
        clean = {k: swept.get(k, pinned.get(k)) for k in preset_axes if k in swept or k in pinned}
        clean.update((k, v) for k, v in swept.items() if k not in clean)  # axes the command line added
        if any(selector_matches(clean, sel) for sel in exclude):
            continue
        seed = int(clean.pop(SEED_AXIS, pinned.get(SEED_AXIS, 1)))
        out.append(SuiteCell(overrides, sorted(canonical(overrides)), clean, seed))
    return out


def results_dir(target: str, tier: str = "real") -> Path:
    return results_root() / target / tier


def attach_records(cells: Sequence[SuiteCell], records: Records) -> None:
    for cell in cells:
        cell.record = records.get(cell.key)
        cell.bleu_last_measured = records.bleu_last.get(cell_key(cell.key))


def seed_major(cells: Sequence[SuiteCell]) -> list[SuiteCell]:
    """The cells without a record, every arm's first seed before any arm's second: a partial
    suite covers every arm."""
    return sorted((c for c in cells if c.record is None), key=lambda c: c.seed)


def cell_preset(cell: SuiteCell) -> Optional[str]:
    """The name of the preset (sweeps/<name>.yaml) a cell was planned from (None without one)."""
    return next((o.split("=", 1)[1] for o in cell.overrides if o.startswith("+sweep=")), None)


def load_preset_value(cell: SuiteCell, dotted: str) -> Optional[float]:
    """A number the cell's preset sets (None when it does not)."""
    preset = cell_preset(cell)
    node: object = load_preset(preset) if preset else {}
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, bool):
        return float(node)
    return float(node) if isinstance(node, (int, float)) else None


# ----------------------------------------------------------------------------- numbers in tables
def fmt_number(value: Optional[float], spec: str) -> str:
    """`value` formatted with `spec`, "-" when it is missing or not finite (runner/console.py fmt)."""
    return fmt(value, spec, show_nan=False, show_inf=False)


def finite_mean(values: Sequence[Optional[float]]) -> Optional[float]:
    """The mean of the finite values, None when there are none."""
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return sum(kept) / len(kept) if kept else None


def finite_values(records: Sequence[dict], key: str, ok_only: bool = True) -> list[float]:
    """`key` of each record (of each ok record when `ok_only`) where it is a finite number: what
    every table and figure of a report averages."""
    return [r[key] for r in records if (r["status"] == "ok" or not ok_only)
            and r.get(key) is not None and math.isfinite(r[key])]


# ----------------------------------------------------------------------------- outcomes and verdicts
def suite_decodes(cells: Sequence[SuiteCell]) -> bool:
    """Whether the suite scores BLEU (its preset sets trainer.final_bleu, or some record has a
    BLEU): its cells then meet the BLEU bar."""
    if any(c.record is not None and c.record.get("bleu") is not None for c in cells):
        return True
    return any(load_preset_value(c, "trainer.final_bleu") for c in cells[:1])


def cell_outcome(record: dict, decoded: bool, version: int = CURRENT) -> str:
    """The record's outcome under rule book `version` ("trained" reads "ok", the evidence status)."""
    result = outcome(record, rulebook(version), decoded=decoded)
    return "ok" if result == "trained" else result


def evidence_records(cells: Sequence[SuiteCell], version: int = CURRENT) -> list[Record]:
    """The cells' records as evidence, each status its outcome under rule book `version`."""
    decoded = suite_decodes(cells)
    spike_margin = rulebook(version).spike_margin
    out = []
    for cell in cells:
        r = cell.record
        if r is None:
            continue
        spikes = loss_spikes(r["train_curve"], spike_margin) if r.get("train_curve") else None
        out.append(Record(arm=dict(cell.arm), seed=cell.seed, status=cell_outcome(r, decoded, version),
                          metrics={**{k: r.get(k) for k in ("bleu", "sacrebleu", "best_valid_loss")},
                                   "bleu_last": cell_bleu_last(cell),
                                   "loss_spikes": None if spikes is None else float(spikes)}))
    return out


def cell_bleu_last(cell: SuiteCell) -> Optional[float]:
    """The BLEU of the cell's last checkpoint: in its record (trainer.final_bleu_last), or
    measured on its run folder afterwards (last-checkpoint-bleu.jsonl)."""
    value = (cell.record or {}).get("bleu_last")
    return value if value is not None else cell.bleu_last_measured


def _reads_bleu_last(claim) -> bool:
    return claim.bleu_metric == "bleu_last" or (claim.kind in METRIC_KINDS and claim.metric == "bleu_last")


def _has_evidence(cell: SuiteCell, claim) -> bool:
    """Whether a cell has what the claim reads: its record, and for a claim judged on the last
    checkpoint's BLEU an ok cell also needs that number (a cell that diverged or stalled has no
    BLEU to read, nor has one whose final scoring failed: both count as they do for BLEU)."""
    if cell.record is None:
        return False
    if not _reads_bleu_last(claim) or cell.record["status"] != "ok" or cell.record.get("bleu") is None:
        return True
    return cell_bleu_last(cell) is not None


def preset_claims(preset: str) -> list[Claim]:
    """The claims a preset (sweeps/<preset>.yaml) writes under sweep.claims."""
    return [claim_from_dict(raw) for raw in (load_preset(preset).get("sweep") or {}).get("claims") or []]


def verdicts(preset: str, cells: Sequence[SuiteCell], version: int = CURRENT) -> list[Verdict]:
    """Each claim judged on the records under rule book `version`; a claim whose arms still miss
    planned cells gets the verdict "incomplete" (what the finished cells show so far stays in
    `measured`), so a partial suite never reads as a result; so does a "better" claim whose
    verdict could still change with the p of a Holm family member that misses cells (judge_all's
    `waiting`)."""
    claims = preset_claims(preset)
    progress = {}  # claim id -> (cells with evidence, cells its arms plan)
    for claim in claims:
        selected = [c for c in cells  # an empty selector {} picks every cell
                    if any(selector_matches(c.arm, sel) for sel in (claim.a, claim.b) if sel is not None)]
        if claim.b is not None:  # two arms: a planned seed the other arm does not plan pairs with nothing
            seeds = [{c.seed for c in cells if selector_matches(c.arm, sel)} for sel in (claim.a, claim.b)]
            selected = [c for c in selected if c.seed in seeds[0] & seeds[1]]
        progress[claim.id] = (sum(_has_evidence(c, claim) for c in selected), len(selected))
    waiting = {cid for cid, (done, planned) in progress.items() if done < planned}
    book = rulebook(version)
    if not suite_decodes(cells):  # validation loss only: no BLEU bar applies (rule book v2)
        book = dataclasses.replace(book, bleu_bar=None)
    judged = judge_all(claims, evidence_records(cells, version), book, waiting=waiting)
    out = []
    for claim, verdict in zip(claims, judged):
        done, planned = progress[claim.id]
        if done < planned:
            what = "have a record measured on their last checkpoint" if _reads_bleu_last(claim) else "have a record"
            verdict = Verdict(claim, "incomplete",
                              f"{done} of {planned} cells {what}; so far: {verdict.measured}",
                              {**verdict.details, "provisional_verdict": verdict.verdict})
        out.append(verdict)
    return out
