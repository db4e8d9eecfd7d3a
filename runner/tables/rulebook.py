"""The rule book: what a trained cell's outcome is called and how a claim is decided, versioned.

One rule book judges every reproduction suite, the records trained before it included, so that
the same claim word means the same thing in every table. A version never changes once written;
a new reading is a new version, and reports show the verdicts of the version before it beside
the current ones wherever the two differ (runner/tables/evidence.py `judge_all`).

Every version judges runs trained with the same run-time rules, which the runs apply while they
train: the divergence bound (10 nats of training loss per token) and its patience (50
consecutive updates), and the stall margin (0.1 nats). The rule book states them
(`divergence_bound`, `divergence_patience`, `stall_margin`) and `check_preset` refuses a
reproduction preset that sets other values.

Version 1 (the rules the first reports used):
    - A cell's status is the one its run recorded: "diverged" (training loss NaN/inf, or above
      `trainer.divergence.loss_bound` for `patience` updates), "stalled" (it ended without its best
      validation NLL getting `stall_margin` nats below the unigram NLL), else "ok".
    - The BLEU bar is per claim (a claim's `min_bleu`, in some suites only).
    - Intervals: the 95% percentile bootstrap of the mean; with 2 or 3 seeds that is the range of
      the seeds, which covers the mean about 50% / 75% of the time, not 95%.
    - "better": reproduced when the bootstrap interval of the paired difference lies above 0.
    - "same_best": the best setting of the seed-averaged metric, with no uncertainty.

Version 2:
    - Outcome of a cell, first match wins:
        diverged   as recorded by the run (the training-loss rule above, unchanged);
        collapsed  the validation loss ends more than `collapse_margin` nats above its best and
                   above the unigram NLL: it learned something, then lost it (a rise the training
                   loss rule does not see, e.g. 6.2 -> 8.6 nats with 8.97 for uniform prediction).
                   The loss is the one the run trains on and records per validation, so in the
                   label-smoothed translation suites it is the smoothed loss (0.5 to 1.0 nats above
                   the NLL, median 0.94 in table2's records), compared with the unsmoothed unigram
                   NLL;
        stalled    as recorded by the run (best validation NLL not `stall_margin` below unigram);
        below_bar  it decoded the test split and its BLEU (tok) on the scored checkpoint is below
                   `bleu_bar`, or is missing;
        trained    none of the above.
      Suites that do not decode (validation loss only) have no BLEU bar; their "trained" reads
      the losses alone, and their reports say so.
    - The scored checkpoint is the one the suite's preset names (`bleu` in its records: the
      average of its last `trainer.eval_average_last` checkpoints); a suite trained until its
      curves flatten also records the last checkpoint (`bleu_last`) and the average of the
      checkpoints taken after the curve flattened. A claim written about the last checkpoint
      (`bleu_metric: bleu_last`) meets the same bar on that checkpoint's BLEU.
    - A diverged cell whose loss at update 0 is already above the divergence bound blew up at
      initialization, not during training; reports say which (records before version 2 have no
      loss at update 0, and read "unknown").
    - Intervals: Student-t 95% intervals of the mean (mean -/+ t(0.975, n-1) s / sqrt(n)); paired
      Student-t intervals for differences between arms that share seeds; at every number of seeds
      (no bootstrap: the arms with 10 seeds get Student-t intervals too). Their coverage assumes
      roughly normal values over seeds.
    - "better": a one-sided paired t-test of A - B > 0 at `alpha`; the "better" claims of one
      table that compare against the same baseline arm are one family, their p-values corrected
      by Holm's step-down method. Reproduced when the corrected p < alpha; not reproduced when the
      paired-t 95% interval lies below 0 (A is worse); otherwise "underpowered" when the paper's
      effect is smaller than the minimum detectable effect at `power` (from the measured SD of the
      paired differences), else inconclusive. Every seed pair is listed.
    - "same_best": the setting with the best seed-averaged metric at each depth (as version 1),
      and also each seed's own best; reproduced only when every seed agrees with the shared best.
    - Written after the rules above, for claims no earlier suite makes (the language-model tier),
      so no earlier verdict changes:
        loss spikes  a cell's count of spikes: runs of logged training losses (each the mean over
                     its log interval) more than `spike_margin` nats above the lowest logged loss
                     before them; read from the record's training curve ("loss_spikes").
        "matches"    equivalence within a margin the claim states, in the metric's units: two
                     one-sided paired t-tests (TOST, Schuirmann 1987) of the paired difference
                     against -margin and +margin at `alpha` each. Reproduced when both reject (the
                     paired-t 90% interval lies inside the margin); not reproduced when the paired-t
                     95% interval lies wholly outside it; otherwise "underpowered" when the margin
                     is narrower than the half-width of the 90% paired-t interval (even an observed
                     difference of 0 could not show equivalence), else inconclusive.
        "less_spread" A's seed-to-seed SD of the metric below B's: one-sided F-test of the
                     variance ratio var(B) / var(A) at `alpha` (unpaired; it assumes normal
                     values). Reproduced when it rejects; not reproduced when the reverse test
                     (A more spread) rejects; otherwise "underpowered" when the ratio it detects at
                     `power` exceeds the claim's `paper_effect` (a ratio of variances), else
                     inconclusive.
        rank vs baseline  a row of a gathered table (the all-schemes tables) against its
                     section's baseline arm, on the table's metric, paired by seed: "fails" when
                     a seed of the row did not train; "better" / "worse" when the two-sided paired
                     t-test's Holm-corrected p (over the section's rows) is below `alpha`, in the
                     metric's better / worse direction; "no difference detected" otherwise, with
                     at least 2 seed pairs; "incomplete" while the row or the baseline lacks
                     planned seeds.
        ranking agreement a method in both tasks' tables (same warmup section): "agree" when
                     its two ranks are the same; "disagree" when one is better and the other
                     worse, or one fails and the other does not; "detected in one task only"
                     when one is better or worse and the other shows no difference;
                     "undecided" while either is incomplete.

Version 3: version 2, with three changes to "better" claims, written before any claim
they change was final (the language-model tier's spike claim and Table 2's Admin claim were
"incomplete"; no finished suite's verdict changes):
    - The Holm family is the table's planned "better" claims against one baseline, whatever their
      outcome: a claim settled by the count of cells that did not train (no t-test) enters with
      p = 0 when reproduced and p = 1 otherwise, as does any other member without a test (fewer
      than 2 seed pairs, not run) at p = 1. Version 2 left settled claims out, which is p = 0
      for all of them: a claim whose own arm failed made the others' correction smaller.
    - The minimum detectable effect and the seeds a paper's effect needs are computed at
      alpha / m for a family of m claims (the level Holm tests the smallest p at), not at alpha:
      what the corrected test can detect, not what one uncorrected test could.
    - A count (loss spikes per run) is compared by the exact one-sided sign test over the seed
      pairs (ties left out), not the t-test: with 3 pairs each one spike apart the t-test's p is
      0 (no spread), the sign test's 1/8. Not reproduced when the reverse sign test's p is below
      (1 - level) / 2 = 0.025 (the t path's one-sided level); "underpowered" when even every pair
      favouring A would leave the Holm-corrected p at alpha or more, the family's other p-values
      as they are (3 pairs: the smallest p is 1/8); else inconclusive.

Version 4 (current): version 3, with one change to "better" claims, written when all three claims
it touches had final verdicts, none of which it changes (a claim of the Lipschitz suite, its
last-checkpoint twin, and the language-model tier's Mix-LN over Post-LN):
    - Versions 1 to 3 settle a "better" claim without a test when only B has cells that did not
      train (reproduced), or A has more of them (not reproduced): one stalled baseline seed against
      none decided it, at no stated alpha. Version 4 tests every such claim. A cell that stalled or
      is below the BLEU bar finished its run, and its metric says where it got: it enters the
      paired t-test with its recorded value like a trained cell. A cell that diverged or collapsed
      has no final value to compare (its best metric predates the blow-up): a pair with one is
      decided by outcome, the cell that blew up losing (both blew up: a tie), and the claim is then
      decided by the exact one-sided sign test over every pair (the others by the sign of their
      difference), with version 3's rules for a sign test's verdict. In the Holm family these
      claims enter with their test's p, like any other.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from runner.config import ConfigError, DivergenceConfig
from runner.run.status import DIVERGED, FAILED, OK, STALLED, run_status

# A cell's outcome: its run's status (runner/run/status.py) as this rule book reads it; "ok"
# reads "trained", and v2 adds collapsed and below_bar.
TRAINED, COLLAPSED, BELOW_BAR = "trained", "collapsed", "below_bar"
OUTCOMES = (TRAINED, DIVERGED, COLLAPSED, STALLED, BELOW_BAR, FAILED)
NOT_TRAINED = (DIVERGED, COLLAPSED, STALLED, BELOW_BAR)
# not trained with no final value to compare: the best metric predates the blow-up (v4)
BLOWN_UP = (DIVERGED, COLLAPSED)


@dataclass(frozen=True)
class RuleBook:
    """One version of the rules; never edited once a report used it (add a version instead)."""

    version: int
    better_test: str  # "bootstrap_ci" (v1) | "paired_t_holm"
    bleu_bar: Optional[float]  # None: per claim (v1 `min_bleu`)
    collapse_margin: Optional[float]  # nats; None: no "collapsed" outcome
    same_best_per_seed: bool  # "same_best" needs every seed's own best to agree
    alpha: float = 0.05  # one-sided, per test (Holm-corrected within a family in v2)
    level: float = 0.95  # intervals
    power: float = 0.80  # minimum detectable effect
    # The run applies these three while it trains (trainer.divergence; it records "diverged" and
    # "stalled"), so a reproduction preset must set the rule book's values: check_preset refuses
    # one that does not, and reports read them from here.
    # nats of training loss per token above which an update counts as bad: above uniform prediction
    # over the largest vocabulary the suites use (Multi30k's joint BPE, about 7,900 types: 8.97)
    divergence_bound: float = 10.0
    # consecutive bad updates that make a run "diverged"
    divergence_patience: int = 50
    # nats below the unigram NLL the best validation NLL must reach, else the run "stalled"
    stall_margin: float = 0.1
    scored_bleu: str = "bleu"  # the record's metric a BLEU bar and a BLEU table read
    # nats above the lowest earlier logged training loss that make a spike: in the task=lm anchor's
    # runs (results/lm/nanogpt-cpu) the logged loss moves by an SD of 0.011-0.014 nats from one
    # 50-update log to the next after update 1,000 (largest rise 0.019), so 0.3 is a rise noise
    # does not make at any log interval down to a few updates
    spike_margin: float = 0.3
    # "better" claims' Holm family: "tested" (v2: the members that reached a t-test; one settled by
    # the count of cells that did not train is left out) or "planned" (v3: every "better" claim of
    # the table against the same baseline, a settled one at p = 0 when reproduced, else p = 1)
    holm_family: str = "tested"
    # the level the minimum detectable effect and the seeds needed are computed at: "alpha" (v2)
    # or "family" (v3: alpha / the family's size, the level Holm's first step tests at)
    power_level: str = "alpha"
    # "better" on a count (loss spikes): "t" (v2: the paired t-test) or "sign" (v3: the exact
    # one-sided sign test over the seed pairs, scipy.stats.binomtest)
    count_test: str = "t"
    # a "better" claim with cells that did not train: "settle" (v1-v3: decided by counting them,
    # without a test) or "test" (v4: stalled and below-bar cells enter the t-test with their
    # values; a pair with a diverged or collapsed cell is decided by outcome in a sign test)
    not_trained_pairs: str = "settle"


RULEBOOKS: dict[int, RuleBook] = {
    1: RuleBook(version=1, better_test="bootstrap_ci", bleu_bar=None, collapse_margin=None,
                same_best_per_seed=False),
    # 10 BLEU: the bar the first suites set per claim (a model at 10 BLEU translates; one that
    # learned word frequencies only scores 0-3 on Multi30k), now applied to every decoded cell.
    # 0.5 nats: ten times the seed-to-seed SD of the trained arms' best validation losses (<= 0.05
    # in table2) and far above the noise between two evaluations of one run.
    2: RuleBook(version=2, better_test="paired_t_holm", bleu_bar=10.0,
                collapse_margin=0.5, same_best_per_seed=True),
    3: RuleBook(version=3, better_test="paired_t_holm", bleu_bar=10.0,
                collapse_margin=0.5, same_best_per_seed=True, holm_family="planned",
                power_level="family", count_test="sign"),
    4: RuleBook(version=4, better_test="paired_t_holm", bleu_bar=10.0,
                collapse_margin=0.5, same_best_per_seed=True, holm_family="planned",
                power_level="family", count_test="sign", not_trained_pairs="test"),
}
CURRENT = 4
# the metrics that count events: integers a t-test's normal model does not fit
COUNT_METRICS = ("loss_spikes",)


def rulebook(version: int = CURRENT) -> RuleBook:
    try:
        return RULEBOOKS[version]
    except KeyError:
        raise ValueError(f"no rule book version {version}; known: {sorted(RULEBOOKS)}") from None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def collapsed(record: Mapping[str, Any], book: RuleBook) -> bool:
    """Whether the record's validation loss ended more than the margin above its best and above
    the unigram NLL (rule book v2)."""
    if book.collapse_margin is None:
        return False
    curve = [loss for _, loss in record.get("valid_curve") or [] if _finite(loss)]
    unigram = record.get("valid_unigram_nll")
    if len(curve) < 2 or not _finite(unigram):
        return False
    final, best = curve[-1], min(curve)
    return final > best + book.collapse_margin and final > unigram


def outcome(record: Mapping[str, Any], book: RuleBook, decoded: Optional[bool] = None) -> str:
    """A record's outcome under `book`: one of OUTCOMES.

    Under version 1 the outcome is the recorded status ("ok" reads "trained"; the claim's own
    BLEU bar applies later). `decoded`: whether the record's suite scores BLEU (None: whether this
    record has a BLEU field that is not None, or the run was not ok)."""
    status = run_status(dict(record)) or FAILED
    if status in (FAILED, DIVERGED):
        return status
    if collapsed(record, book):
        return COLLAPSED
    if status == STALLED:
        return STALLED
    if status != OK:
        return FAILED
    if book.bleu_bar is not None:
        bleu = record.get(book.scored_bleu)
        decodes = decoded if decoded is not None else bleu is not None
        if decodes and (not _finite(bleu) or bleu < book.bleu_bar):
            return BELOW_BAR
    return TRAINED


# the preset keys that apply the rule book's run-time rules, and the rule book field of each
RUN_RULES = {"trainer.divergence.loss_bound": "divergence_bound",
             "trainer.divergence.patience": "divergence_patience",
             "trainer.divergence.stall_margin": "stall_margin"}


def check_preset(preset: Mapping[str, Any], name: str, book: Optional[RuleBook] = None) -> None:
    """Raise ConfigError naming the key when a reproduction preset (sweeps/<name>.yaml, as loaded)
    sets a run-time rule (the divergence bound and patience, the stall margin) to another value
    than the rule book that judges its records; a key the preset leaves out takes the trainer's
    default, which must agree too (runner/config/schema.py DivergenceConfig)."""
    book = book or rulebook()
    defaults = DivergenceConfig()
    for dotted, field_name in RUN_RULES.items():
        node: Any = preset
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        value = node if node is not None else getattr(defaults, dotted.rsplit(".", 1)[1])
        wanted = getattr(book, field_name)
        try:  # YAML reads 1e1 as a string; Hydra as the number
            same = float(value) == float(wanted)
        except (TypeError, ValueError):
            same = False
        if not same:
            where = f"sweeps/{name}.yaml sets {dotted}={value}" if node is not None else (
                f"sweeps/{name}.yaml leaves {dotted} at the trainer's default {value}")
            raise ConfigError(f"{where}; rule book v{book.version} (runner/tables/rulebook.py) judges "
                             f"every suite at {dotted}={wanted}")


def blow_up_cause(record: Mapping[str, Any], bound: Optional[float]) -> str:
    """For a diverged record: "at initialization" when its loss at update 0 was already above the
    divergence bound (or not finite), "during training" when it was below, "unknown" when the
    record has no loss at update 0."""
    initial = record.get("initial_loss")
    if initial is None:
        return "unknown"
    if not _finite(initial) or (bound is not None and initial > bound):
        return "at initialization"
    return "during training"


def describe(book: RuleBook) -> str:
    """One paragraph of the rules, for a report's header."""
    if book.version == 1:
        return ("Rule book v1: statuses as the runs recorded them (diverged, stalled); a BLEU bar "
                "only where a claim set one; 95% percentile-bootstrap intervals; \"better\" when the "
                "bootstrap interval of the paired difference lies above 0.")
    return (f"Rule book v{book.version} (runner/tables/rulebook.py): a cell is diverged (training loss "
            "NaN/inf or above the bound), collapsed (validation loss ends more than "
            f"{book.collapse_margin:g} nats above its best and above the unigram NLL), stalled (best "
            f"validation NLL not {book.stall_margin:g} nats below the unigram NLL), below the bar (a "
            f"decoding suite's BLEU (tok) under {book.bleu_bar:g}) or trained. Intervals are Student-t "
            f"{book.level:.0%} intervals (paired by seed for differences). \"better\" is a one-sided "
            f"paired t-test at alpha {book.alpha:g}, Holm-corrected over a table's claims against the "
            f"same baseline; a claim whose paper-sized effect is below the minimum detectable effect "
            f"at {book.power:.0%} power reads \"underpowered\"."
            + (" The family is every such claim the table plans ("
               + ("one without a test at p = 1" if book.not_trained_pairs == "test" else
                  "a claim settled without a test at p = 0 or 1")
               + "); the detectable effect is at alpha over the family's size; counts (loss "
               "spikes) are compared by the exact sign test." if book.holm_family == "planned" else "")
            + (" Stalled and below-bar cells enter the t-test with their values; a pair with a "
               "diverged or collapsed cell is decided by outcome (the blown-up cell loses) and the "
               "claim by the exact sign test, which reads \"underpowered\" when even every pair "
               "favouring A could not reach alpha." if book.not_trained_pairs == "test" else ""))


def loss_spikes(curve: Sequence[Sequence[float]], margin: float) -> Optional[int]:
    """The number of loss spikes in a training curve [(update, loss), ...]: runs of consecutive
    logged losses more than `margin` above the lowest finite loss logged before them (rule book v2's
    `spike_margin`). None for a curve of fewer than 2 finite losses (nothing to compare)."""
    losses = [float(loss) for _, loss in curve if loss is not None and math.isfinite(loss)]
    if len(losses) < 2:
        return None
    spikes, inside, lowest = 0, False, losses[0]
    for loss in losses[1:]:
        above = loss > lowest + margin
        spikes += above and not inside
        inside = above
        lowest = min(lowest, loss)
    return spikes


# Ranks of a row against its section's baseline, and how two tasks' ranks of a method compare
# (version 2's "rank vs baseline" and "ranking agreement", above).
BETTER, WORSE, NO_DIFFERENCE, FAILS, INCOMPLETE = (
    "better", "worse", "no difference detected", "fails", "incomplete")
AGREE, DISAGREE, ONE_TASK, UNDECIDED = "agree", "disagree", "detected in one task only", "undecided"


def rank_vs_baseline(diffs: Optional[Sequence[float]], holm_p: Optional[float], failed: int,
                     complete: bool, higher_is_better: bool, book: RuleBook) -> str:
    """A row's rank against its baseline: `diffs` the paired differences (row minus baseline),
    `holm_p` their two-sided paired t-test's Holm-corrected p, `failed` the row's seeds that did
    not train, `complete` whether the row and the baseline have all their planned seeds."""
    if not complete:
        return INCOMPLETE
    if failed:
        return FAILS
    if diffs is None or len(diffs) < 2 or holm_p is None or holm_p >= book.alpha:
        return NO_DIFFERENCE
    mean = sum(diffs) / len(diffs)
    return BETTER if (mean > 0) == higher_is_better else WORSE


def ranking_agreement(first: str, second: str) -> str:
    """How one method's ranks in two tasks compare (rank_vs_baseline's words)."""
    if INCOMPLETE in (first, second):
        return UNDECIDED
    if first == second:
        return AGREE
    if FAILS in (first, second) or {first, second} == {BETTER, WORSE}:
        return DISAGREE
    return ONE_TASK
