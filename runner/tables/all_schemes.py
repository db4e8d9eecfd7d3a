"""`deepinit reproduce all-schemes`: one table of every scheme at Table 2's deep real-tier setting,
gathered from the records of the real-tier suites that train it, and the same table for the
language-model task from the LM tier's records, with a line per method on whether its rank against
Pre-LN agrees between the two tasks (trains nothing). Both are rewritten after each cell of those
suites (refresh_all_schemes)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from runner.tables.claims import selector_matches
from runner.tables.combined import (
    BLEU,
    VALID_LOSS,
    TableMetric,
    TableRows,
    render_combined,
    section_rows,
    write_combined,
)
from runner.tables.plan import real_suite
from runner.tables.rulebook import rank_vs_baseline, ranking_agreement, rulebook
from runner.tables.targets import TARGETS


@dataclass(frozen=True)
class TableSource:
    """The arms of one suite that belong in a section of the all-schemes table."""

    target: str
    select: dict = field(default_factory=dict)  # a claim-style selector on the arms ({}: every arm)
    note: str = ""  # how its rows differ from the common recipe, for the reader


ALL_SCHEMES = "all-schemes"
ALL_SCHEMES_TITLE = "Every scheme at the deep setting: real-data tier"
ALL_SCHEMES_INTRO = (
    "The arms of every suite that trains Table 2's deep real-tier recipe (Multi30k De->En, 64-128-2 "
    "at 12+12 layers, Adam (0.9, 0.98) lr 1e-3, 2,000 updates, seeds 1 to 3, tokenized BLEU with beam 5 "
    "of the last 5 checkpoints averaged), without warmup and with Table 2's 500 warmup updates: each "
    "method in its paper's placement, the rest of the recipe the same (a note says where a row's "
    "differs). Written from the records in results/ by `deepinit reproduce all-schemes` and after each "
    "cell of these suites.")
# The sections and their suites; tests/tables/test_all_schemes.py composes every arm and checks that the
# recipe is the same but for the options the arm's `method=` sets (the SGD control's optimizer among
# them) and, between the sections, the warmup.
ALL_SCHEMES_SECTIONS: dict[str, tuple[TableSource, ...]] = {
    "Without warmup": (
        TableSource("table2", {"warmup.updates": "0"}),
        TableSource("schemes-postln"), TableSource("schemes-other"),
        TableSource("schemes-norms"), TableSource("schemes-scaling"),
        # T-Fixup paper, Fig. 3c: Post-LN trained with SGD instead of Adam, the control that shows
        # the no-warmup failure is Adam's
        TableSource("sgd-control", note="SGD with momentum 0.9 at lr 0.1 instead of Adam (T-Fixup's "
                    "Fig. 3c control)"),
    ),
    "With 500 warmup updates": (
        TableSource("table2", {"warmup.updates": "500"}),
        TableSource("schemes-norms-warmup"), TableSource("schemes-scaling-warmup"),
    ),
}


# every row is compared with Table 2's Pre-LN arm of its section, paired by seed
ALL_SCHEMES_BASELINE = ("table2", {"method": "pre_ln"})


ALL_SCHEMES_SEEDS = (1, 2, 3)  # every suite's seeds (Table 2 trains more for two of its arms)


# The language-model task: the LM tier's arms at 24 layers (lr 1e-3; depth-muP's other learning
# rates are its transfer grid), in the same two sections, compared with its Pre-LN on the best
# validation loss; then each method's rank against Pre-LN in the two tasks.
LM_ALL_SCHEMES = "all-schemes-lm"
LM_ALL_SCHEMES_TITLE = "Every scheme the language-model tier trains, beside translation"
LM_ALL_SCHEMES_INTRO = (
    "The arms of the language-model tier (`deepinit reproduce lm --scale real`: character-level "
    "Shakespeare, decoder-only, 128 wide at 24 layers, AdamW lr 1e-3 with cosine decay, 4,000 "
    "updates, seeds 1 to 3), without warmup and with nanoGPT's 100 warmup updates: each method in its "
    "paper's placement, the rest of the recipe the same. Ranked and compared with Pre-LN on the best "
    "validation loss (nats; lower is better), so the BLEU columns are empty. The last section sets "
    "each method's rank against Pre-LN here beside its rank in the translation table "
    "(results/all-schemes/real/report.md). Written from the records in results/ by `deepinit "
    "reproduce all-schemes` and after each cell of the LM tier.")
LM_ALL_SCHEMES_SECTIONS: dict[str, tuple[TableSource, ...]] = {
    # the planned arms: the controls added later change the recipe (method=deepnorm_untied its tied
    # output, method=dyt_embed_scale its embeddings' scale), so they are no schemes of this table
    # and no members of its Holm family
    "Without warmup": (TableSource("lm", {"warmup.updates": "0", "model.layers": "24", "optim.lr": "0.001",
                                          "method": ["post_ln", "pre_ln", "deepnorm", "sigma_reparam_post_ln"]}),),
    "With 100 warmup updates": (
        TableSource("lm", {"warmup.updates": "100", "model.layers": "24", "optim.lr": "0.001",
                           "method": ["post_ln", "pre_ln", "ln_scaling", "mix_ln", "peri_ln", "dyt",
                                      "depth_mup"]}),),
}
LM_ALL_SCHEMES_BASELINE = ("lm", {"method": "pre_ln"})
# the LM section each translation section's ranks are set beside
SECTION_PAIRS = {"Without warmup": "Without warmup", "With 100 warmup updates": "With 500 warmup updates"}


def all_schemes_cells(source: TableSource) -> list:
    """The cells of `source`'s suite that it puts in the table (seeds 1 to 3), with their records."""
    return [c for c in real_suite(TARGETS[source.target]).cells
            if selector_matches(c.arm, source.select) and c.seed in ALL_SCHEMES_SEEDS]


def _sections(sections: dict[str, tuple[TableSource, ...]]) -> list[tuple[str, list[TableRows]]]:
    """Each row is named by its arm less the keys its source fixes to one value (a key the source
    lets take several values, such as a list of methods, still tells the rows apart)."""
    def fixed(select) -> tuple[str, ...]:
        return tuple(k for k, v in select.items() if not isinstance(v, (list, tuple)))

    return [(heading, [TableRows(source.target, all_schemes_cells(source), fixed(source.select), source.note)
                       for source in sources])
            for heading, sources in sections.items()]


def all_schemes_sections() -> list[tuple[str, list[TableRows]]]:
    return _sections(ALL_SCHEMES_SECTIONS)


def lm_all_schemes_sections() -> list[tuple[str, list[TableRows]]]:
    return _sections(LM_ALL_SCHEMES_SECTIONS)


def _ranks(parts, baseline, metric: TableMetric) -> dict[str, tuple[str, str]]:
    """{method: (rank against the baseline, the comparison's text)} of one section's rows."""
    book = rulebook()
    rows = section_rows(parts, baseline, metric)
    base = next((r for r in rows if r.comparison is not None and r.comparison.baseline), None)
    base_complete = base is not None and base.records == len(base.members)
    higher = metric.higher_is_better
    out = {}
    for row in rows:
        if row.method is None or row is base or row.comparison is None:
            continue
        c = row.comparison
        rank = rank_vs_baseline(c.diffs, c.holm_p, row.failed,
                                base_complete and row.records == len(row.members), higher, book)
        out.setdefault(row.method, (rank, c.text()))
    return out


def ranking_agreement_lines() -> list[str]:
    """The closing section of the LM page: per method in both tables, its rank against Pre-LN in
    each task (rule book v2's "rank vs baseline") and whether they agree ("ranking agreement")."""
    translation = dict(all_schemes_sections())
    lm = dict(lm_all_schemes_sections())
    lines = ["## Rank against Pre-LN: language model and translation", "",
             "Each method's rank against Pre-LN in its section of each table, by the rule book's "
             "\"rank vs baseline\" (the paired t-test of the table's \"vs\" column, Holm-corrected over "
             "the section's rows, at alpha 0.05; \"fails\" when a seed did not train), and whether the "
             "two tasks agree (\"ranking agreement\"). Translation ranks on BLEU, the language model on "
             "the best validation loss.", ""]
    for lm_heading, translation_heading in SECTION_PAIRS.items():
        lm_ranks = _ranks(lm[lm_heading], LM_ALL_SCHEMES_BASELINE, VALID_LOSS)
        tr_ranks = _ranks(translation[translation_heading], ALL_SCHEMES_BASELINE, BLEU)
        lines += [f"**{lm_heading}** (translation: {translation_heading.lower()}):", ""]
        for method, (lm_rank, lm_text) in lm_ranks.items():
            lm_part = f"{lm_rank}" + (f" ({lm_text} nats)" if lm_text != "-" else "")
            if method not in tr_ranks:
                lines.append(f"- {method}: {lm_part} in the language model; not in this section of "
                             "the translation table.")
                continue
            tr_rank, tr_text = tr_ranks[method]
            tr_part = f"{tr_rank}" + (f" ({tr_text} BLEU)" if tr_text != "-" else "")
            verdict = ranking_agreement(lm_rank, tr_rank)
            lines.append(f"- {method}: **{verdict}**. Language model: {lm_part}; translation: {tr_part}.")
        lines.append("")
    return lines


def render_lm_all_schemes() -> str:
    return render_combined(LM_ALL_SCHEMES_TITLE, LM_ALL_SCHEMES_INTRO, lm_all_schemes_sections(),
                           LM_ALL_SCHEMES_BASELINE, VALID_LOSS, ranking_agreement_lines())


def write_all_schemes() -> Path:
    """results/all-schemes/real/report.md and results/all-schemes-lm/real/report.md from the
    records of the suites they gather; the first's path."""
    write_combined(LM_ALL_SCHEMES, LM_ALL_SCHEMES_TITLE, LM_ALL_SCHEMES_INTRO, lm_all_schemes_sections(),
                   LM_ALL_SCHEMES_BASELINE, VALID_LOSS, ranking_agreement_lines())
    return write_combined(ALL_SCHEMES, ALL_SCHEMES_TITLE, ALL_SCHEMES_INTRO, all_schemes_sections(),
                          ALL_SCHEMES_BASELINE)


def feeds_all_schemes(target: str) -> bool:
    return any(source.target == target for table in (ALL_SCHEMES_SECTIONS, LM_ALL_SCHEMES_SECTIONS)
               for sources in table.values() for source in sources)


def refresh_all_schemes() -> None:
    """Rewrite the all-schemes page after a cell of a suite that feeds it; a failure to write it
    is a warning, never a reason to lose the suite's own report."""
    try:
        write_all_schemes()
    except (OSError, ValueError, KeyError) as err:
        print(f"deepinit reproduce: could not rewrite the {ALL_SCHEMES} table ({err}); "
              f"`deepinit reproduce {ALL_SCHEMES}` writes it", file=sys.stderr)
