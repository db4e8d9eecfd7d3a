"""`deepinit reproduce all-schemes`: one table of every scheme at Table 2's deep real-tier setting,
gathered from the records of the real-tier suites that train it (trains nothing). It is
rewritten after each cell of those suites (refresh_all_schemes)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from runner.tables.claims import selector_matches
from runner.tables.combined import TableRows, write_combined
from runner.tables.plan import real_suite
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


def all_schemes_cells(source: TableSource) -> list:
    """The cells of `source`'s suite that it puts in the table (seeds 1 to 3), with their records."""
    return [c for c in real_suite(TARGETS[source.target]).cells
            if selector_matches(c.arm, source.select) and c.seed in ALL_SCHEMES_SEEDS]


def all_schemes_sections() -> list[tuple[str, list[TableRows]]]:
    return [(heading, [TableRows(source.target, all_schemes_cells(source), tuple(source.select), source.note)
                       for source in sources])
            for heading, sources in ALL_SCHEMES_SECTIONS.items()]


def write_all_schemes() -> Path:
    """results/all-schemes/real/report.md from the records of the suites it gathers."""
    return write_combined(ALL_SCHEMES, ALL_SCHEMES_TITLE, ALL_SCHEMES_INTRO, all_schemes_sections(),
                                ALL_SCHEMES_BASELINE)


def feeds_all_schemes(target: str) -> bool:
    return any(source.target == target for sources in ALL_SCHEMES_SECTIONS.values() for source in sources)


def refresh_all_schemes() -> None:
    """Rewrite the all-schemes page after a cell of a suite that feeds it; a failure to write it
    is a warning, never a reason to lose the suite's own report."""
    try:
        write_all_schemes()
    except (OSError, ValueError, KeyError) as err:
        print(f"deepinit reproduce: could not rewrite the {ALL_SCHEMES} table ({err}); "
              f"`deepinit reproduce {ALL_SCHEMES}` writes it", file=sys.stderr)
