"""A table that gathers several suites' arms (the all-schemes table, runner/tables/all_schemes.py):
each arm's statistics as in its own suite's report, and each row compared with a baseline arm,
paired by seed."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from runner.decode.signature import signature_note
from runner.files import atomic_write_text
from runner.sweep.report import markdown_table
from runner.tables.claims import selector_matches
from runner.tables.report import (
    BLEU_LAST_NOTE,
    MEAN_WORDS,
    SLOPE_NOTE,
    arm_columns,
    arm_row,
    arms_of,
    has_bleu_last,
    provenance,
)
from runner.tables.rulebook import NOT_TRAINED
from runner.tables.statistics import holm, paired_t_test, summarize
from runner.tables.suite import SuiteCell, cell_outcome, finite_mean, finite_values, results_dir, suite_decodes


@dataclass
class TableRows:
    """Some arms of one suite, as rows of a table that gathers several suites' arms."""

    suite: str  # the target whose records these are
    cells: list[SuiteCell]
    drop: tuple[str, ...] = ()  # axes that the table's section fixes, left out of the row names
    note: str = ""  # how these rows differ from the table's common recipe ("" when they do not)


def _scored_by_seed(members: Sequence[SuiteCell], metric: str = "bleu") -> dict[int, float]:
    """An arm's metric by seed, over the seeds that trained to the end (not diverged, collapsed or
    stalled: what the means average)."""
    decoded = suite_decodes(members)
    return {c.seed: c.record[metric] for c in members if c.record is not None
            and cell_outcome(c.record, decoded) in ("ok", "below_bar")
            and c.record.get(metric) is not None and math.isfinite(c.record[metric])}


def baseline_comparisons(rows: Sequence[Sequence[SuiteCell]], base: Sequence[SuiteCell],
                         metric: str = "bleu") -> list[str]:
    """Each row's difference from the baseline arm, paired by seed: mean [95% paired-t interval],
    the two-sided paired t-test's p and Holm's p over the rows compared ("-" for the baseline
    itself and for fewer than 2 pairs)."""
    base_by_seed = _scored_by_seed(base, metric)
    diffs: list[Optional[list[float]]] = []
    for members in rows:
        by_seed = _scored_by_seed(members, metric)
        common = sorted(set(by_seed) & set(base_by_seed))
        same = [c.record for c in members] == [c.record for c in base]
        diffs.append(None if same or len(common) < 2 else [by_seed[s] - base_by_seed[s] for s in common])
    tested = [i for i, d in enumerate(diffs) if d is not None]
    pvalues = [paired_t_test(diffs[i], alternative="two-sided") for i in tested]
    adjusted = dict(zip(tested, holm(pvalues)))
    raw = dict(zip(tested, pvalues))
    out = []
    for i, d in enumerate(diffs):
        if d is None:
            out.append("baseline" if [c.record for c in rows[i]] == [c.record for c in base] else "-")
            continue
        s = summarize(d)
        out.append(f"{s.mean:+.2f} [{s.ci_low:+.2f}, {s.ci_high:+.2f}] p={raw[i]:.2g}, Holm {adjusted[i]:.2g}")
    return out


BASELINE_NOTE = ("vs {name}: the row's BLEU (tok) minus the baseline's on the same seeds, mean [95% paired-t "
                 "interval], the two-sided paired t-test's p and Holm's correction over the section's rows "
                 "(seeds that did not train are left out of both).")


def render_combined(title: str, intro: str, sections: Sequence[tuple[str, Sequence[TableRows]]],
                    baseline: Optional[tuple[str, dict]] = None) -> str:
    """One markdown page of several suites' arms, a table per section: each arm's statistics as in
    its own suite's report, the rows sorted by the share of their seeds that did not train, then by
    mean BLEU (arms without a record last). `baseline` (suite, selector) names an arm each section
    is compared with, paired by seed (a last column)."""
    done = [c.record for _, parts in sections for part in parts for c in part.cells if c.record is not None]
    planned = sum(len(part.cells) for _, parts in sections for part in parts)
    last = any(has_bleu_last(part.cells) for _, parts in sections for part in parts)
    base_name = " ".join(f"{k}={v}" for k, v in (baseline[1] if baseline else {}).items())
    header = ["arm", "suite", *arm_columns(last), "CPU min", *([f"vs {base_name}"] if baseline else [])]
    lines = [f"# {title}", "", intro, "",
             f"{len(done)} of {planned} cells trained. Each arm: {MEAN_WORDS} Rows: "
             "the arms whose seeds all trained first, by mean BLEU, then those with seeds that did not "
             "train, then those without a record. The claims and their verdicts are in each suite's "
             "own report (results/<suite>/real/report.md).", "",
             provenance(done), ""]
    for heading, parts in sections:
        rows, notes, arm_cells = [], [], []
        base = next((members for part in parts if baseline and part.suite == baseline[0]
                     for arm, members in arms_of(part.cells).items() if selector_matches(dict(arm), baseline[1])), None)
        for part in parts:
            for arm, members in arms_of(part.cells).items():
                name = " ".join(f"{k}={v}" for k, v in arm if k not in part.drop) or "all"
                records = [c.record for c in members if c.record is not None]
                decoded = suite_decodes(part.cells)
                failed = sum(cell_outcome(r, decoded) in NOT_TRAINED for r in records)
                bleu = finite_mean(finite_values(records, "bleu"))
                order = (failed / len(records), -bleu if bleu is not None else math.inf) if records else (2.0, 0.0)
                rows.append((order, [name, part.suite, *arm_row(members, last=last, decoded=decoded)]))
                arm_cells.append(members)
                if part.note:
                    notes.append(f"- {name} ({part.suite}): {part.note}")
        if base is not None:
            for row, text in zip(rows, baseline_comparisons(arm_cells, base)):
                row[1].append(text)
        elif baseline:
            rows = [(order, [*row, "-"]) for order, row in rows]
        rows.sort(key=lambda row: row[0])  # stable: arms without a record keep their order, last
        lines += [f"## {heading}", "", markdown_table(header, [row for _, row in rows]), "", *notes,
                  *([""] if notes else [])]
    signature = signature_note(done)  # the sacreBLEU column's true signature
    lines += [SLOPE_NOTE, "", *([BASELINE_NOTE.format(name=base_name), ""] if baseline else []),
              *([signature, ""] if signature else []), *([BLEU_LAST_NOTE, ""] if last else [])]
    return "\n".join(lines)


def write_combined(name: str, title: str, intro: str, sections: Sequence[tuple[str, Sequence[TableRows]]],
                   baseline: Optional[tuple[str, dict]] = None) -> Path:
    out = results_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    text = render_combined(title, intro, sections, baseline)
    atomic_write_text(out / "report.md", text)  # several suites rewrite this page
    return out / "report.md"
