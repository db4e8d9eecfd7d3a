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
    MEAN_WORDS,
    SLOPE_NOTE,
    arm_columns,
    arm_row,
    arms_of,
    bleu_last_note,
    checkpoints_averaged,
    has_bleu_last,
    provenance,
)
from runner.tables.rulebook import NOT_TRAINED
from runner.tables.statistics import holm, paired_t_test, summarize
from runner.tables.suite import (
    SuiteCell,
    cell_outcome,
    cell_preset,
    finite_mean,
    finite_values,
    results_dir,
    suite_decodes,
)


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


@dataclass(frozen=True)
class Comparison:
    """A row against its section's baseline arm, paired by seed: the differences (row minus
    baseline, in the metric's own sign), the two-sided paired t-test's p and Holm's p over the
    section's rows. `diffs` None: the baseline itself, or fewer than 2 seeds in common."""

    baseline: bool = False
    diffs: Optional[list[float]] = None
    p: Optional[float] = None
    holm_p: Optional[float] = None

    def text(self) -> str:
        if self.diffs is None:
            return "baseline" if self.baseline else "-"
        s = summarize(self.diffs)
        return f"{s.mean:+.2f} [{s.ci_low:+.2f}, {s.ci_high:+.2f}] p={self.p:.2g}, Holm {self.holm_p:.2g}"


def compare_with_baseline(rows: Sequence[Sequence[SuiteCell]], base: Sequence[SuiteCell],
                          metric: str = "bleu") -> list[Comparison]:
    """Each row against the baseline arm, paired by seed over the seeds both trained (Comparison);
    Holm's correction runs over the rows compared."""
    base_by_seed = _scored_by_seed(base, metric)
    diffs: list[Optional[list[float]]] = []
    is_base = [list(members) == list(base) for members in rows]  # the same cells, not equal records
    for members, same in zip(rows, is_base):
        by_seed = _scored_by_seed(members, metric)
        common = sorted(set(by_seed) & set(base_by_seed))
        diffs.append(None if same or len(common) < 2 else [by_seed[s] - base_by_seed[s] for s in common])
    tested = [i for i, d in enumerate(diffs) if d is not None]
    pvalues = [paired_t_test(diffs[i], alternative="two-sided") for i in tested]
    adjusted = dict(zip(tested, holm(pvalues)))
    raw = dict(zip(tested, pvalues))
    return [Comparison(baseline=same, diffs=d, p=raw.get(i), holm_p=adjusted.get(i))
            for i, (d, same) in enumerate(zip(diffs, is_base))]


def baseline_comparisons(rows: Sequence[Sequence[SuiteCell]], base: Sequence[SuiteCell],
                         metric: str = "bleu") -> list[str]:
    """Each row's difference from the baseline arm, paired by seed: mean [95% paired-t interval],
    the two-sided paired t-test's p and Holm's p over the rows compared ("-" for the baseline
    itself and for fewer than 2 pairs)."""
    return [c.text() for c in compare_with_baseline(rows, base, metric)]


@dataclass(frozen=True)
class TableMetric:
    """What a gathered table ranks its rows by and compares them with the baseline on."""

    key: str = "bleu"  # the record's field
    label: str = "BLEU (tok)"  # its column's name
    higher_is_better: bool = True


BLEU = TableMetric()
VALID_LOSS = TableMetric("best_valid_loss", "best valid loss", higher_is_better=False)

BASELINE_NOTE = ("vs {name}: the row's {label} minus the baseline's on the same seeds, mean [95% paired-t "
                 "interval], the two-sided paired t-test's p and Holm's correction over the section's rows "
                 "(seeds that did not train are left out of both).")


@dataclass
class SectionRow:
    """One arm in a section of a gathered table."""

    name: str  # the arm's axes, less those the section fixes
    suite: str
    members: list[SuiteCell]
    failed: int  # seeds that did not train (rule book outcomes)
    records: int  # seeds with a record
    comparison: Optional[Comparison] = None  # against the section's baseline arm

    @property
    def method(self) -> Optional[str]:
        return next((v for k, v in self.members[0].arm.items() if k == "method"), None) if self.members else None


def section_rows(parts: Sequence[TableRows], baseline: Optional[tuple[str, dict]] = None,
                 metric: TableMetric = BLEU) -> list[SectionRow]:
    """The arms of one section, in the order of its parts, each compared with the section's
    baseline arm when the section has it."""
    rows: list[SectionRow] = []
    for part in parts:
        decoded = suite_decodes(part.cells)
        for arm, members in arms_of(part.cells).items():
            records = [c.record for c in members if c.record is not None]
            rows.append(SectionRow(
                name=" ".join(f"{k}={v}" for k, v in arm if k not in part.drop) or "all",
                suite=part.suite, members=list(members),
                failed=sum(cell_outcome(r, decoded) in NOT_TRAINED for r in records), records=len(records)))
    base = next((members for part in parts if baseline and part.suite == baseline[0]
                 for arm, members in arms_of(part.cells).items() if selector_matches(dict(arm), baseline[1])), None)
    if base is not None:
        for row, comparison in zip(rows, compare_with_baseline([r.members for r in rows], base, metric.key)):
            row.comparison = comparison
    return rows


def render_combined(title: str, intro: str, sections: Sequence[tuple[str, Sequence[TableRows]]],
                    baseline: Optional[tuple[str, dict]] = None, metric: TableMetric = BLEU,
                    closing: Sequence[str] = ()) -> str:
    """One markdown page of several suites' arms, a table per section: each arm's statistics as in
    its own suite's report, the rows sorted by the share of their seeds that did not train, then by
    the mean of `metric`, best first (arms without a record last). `baseline` (suite, selector)
    names an arm each section is compared with on `metric`, paired by seed (a last column);
    `closing` lines go after the tables' notes."""
    done = [c.record for _, parts in sections for part in parts for c in part.cells if c.record is not None]
    planned = sum(len(part.cells) for _, parts in sections for part in parts)
    last = any(has_bleu_last(part.cells) for _, parts in sections for part in parts)
    last_note = bleu_last_note([checkpoints_averaged(cell_preset(part.cells[0])) for _, parts in sections
                                for part in parts if part.cells and has_bleu_last(part.cells)]) if last else ""
    base_name = " ".join(f"{k}={v}" for k, v in (baseline[1] if baseline else {}).items())
    header = ["arm", "suite", *arm_columns(last), "CPU min", *([f"vs {base_name}"] if baseline else [])]
    lines = [f"# {title}", "", intro, "",
             f"{len(done)} of {planned} cells have a record. Each arm: {MEAN_WORDS} Rows: "
             f"the arms whose seeds all trained first, by mean {metric.label.split(' (')[0]}, then those "
             "with seeds that did not train, then those without a record. The claims and their "
             "verdicts are in each suite's own report (results/<suite>/real/report.md).", "",
             provenance(done), ""]
    sign = -1.0 if metric.higher_is_better else 1.0
    for heading, parts in sections:
        rows, notes = [], []
        section = section_rows(parts, baseline, metric)
        for row in section:
            records = [c.record for c in row.members if c.record is not None]
            decoded = suite_decodes(next(p.cells for p in parts if p.suite == row.suite))
            value = finite_mean(finite_values(records, metric.key))
            order = ((row.failed / row.records, sign * value if value is not None else math.inf)
                     if row.records else (2.0, 0.0))
            cells = [row.name, row.suite, *arm_row(row.members, last=last, decoded=decoded)]
            if baseline:
                cells.append(row.comparison.text() if row.comparison is not None else "-")
            rows.append((order, cells))
        for part in parts:
            if part.note:
                notes += [f"- {name} ({part.suite}): {part.note}" for name in
                          (r.name for r in section if r.suite == part.suite and r.members[0] in part.cells)]
        rows.sort(key=lambda row: row[0])  # stable: arms without a record keep their order, last
        lines += [f"## {heading}", "", markdown_table(header, [row for _, row in rows]), "", *notes,
                  *([""] if notes else [])]
    signature = signature_note(done)  # the sacreBLEU column's true signature
    lines += [SLOPE_NOTE, "", *([BASELINE_NOTE.format(name=base_name, label=metric.label), ""] if baseline else []),
              *([signature, ""] if signature else []), *([last_note, ""] if last else []), *closing]
    return "\n".join(lines)


def write_combined(name: str, title: str, intro: str, sections: Sequence[tuple[str, Sequence[TableRows]]],
                   baseline: Optional[tuple[str, dict]] = None, metric: TableMetric = BLEU,
                   closing: Sequence[str] = ()) -> Path:
    out = results_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    text = render_combined(title, intro, sections, baseline, metric, closing)
    atomic_write_text(out / "report.md", text)  # several suites rewrite this page
    return out / "report.md"
