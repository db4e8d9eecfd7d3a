"""Pre-registered claim verdicts for reproduction tables (the statistics they use:
runner/tables/statistics.py; claims and records: runner/tables/claims.py).

Each trained cell (one seed of one arm) is a `Record`; a paper's claim is a `Claim` (written in a
YAML file before the runs, hence "pre-registered"); `judge` turns a claim and the records into a
`Verdict`: "reproduced", "not reproduced", "inconclusive", "underpowered" (rule book v2) or "not
run", with one line of numbers saying what was measured. The rules below are fixed in advance so
that a verdict cannot be chosen after seeing the numbers.

Statistics
    Mean, sample standard deviation (ddof=1) and the Student-t 95% confidence interval of the mean
    (scipy.stats.t); differences between arms are paired by seed (the same seed gives the same data
    order and the same initial draw), which removes the seed-to-seed variance both arms share, and
    get the paired-t interval, at every number of seeds. The percentile bootstrap (Efron & Tibshirani
    1993, ch. 13) is rule book v1's only: with 3 seeds its 95% interval is exactly [min, max] and
    covers the mean about 75% of the time. "better" is decided by a one-sided paired t-test, with Holm's correction
    over a table's comparisons against one baseline, and reports the minimum detectable effect at
    80% power (noncentral t, scipy.stats.nct). Counts of discordant pairs use the exact two-sided
    sign test (Conover 1999, *Practical Nonparametric Statistics*, 3rd ed., sec. 3.4), which on
    diverged/not-diverged pairs is McNemar's exact test (McNemar 1947).

    Which rules apply is the rule book's (runner/tables/rulebook.py): `judge` and `judge_all` take its
    version; the records' statuses carry its outcomes (ok = trained, diverged, collapsed, stalled,
    below_bar, failed). What follows is version 2, with version 1's differences in brackets and
    versions 3's and 4's in "[v3: ...]" and "[v4: ...]".

Decision rules (`judge`)
    Selectors: a claim's `a` and `b` select records whose arm contains every key/value of the
    selector (subset match); a list value matches any of its values (e.g. `optim.lr: [0.001,
    0.002]` keeps a claim to the part of a grid it was written for). A record matching both
    selectors is an error (ill-formed claim).

    0. Records with status "failed" (a crash) are ignored: they are not evidence. If an arm then
       has no record, the verdict is "not run".

    "diverges" (A diverges): reproduced when every cell of A diverged (status "diverged"); not
       reproduced when none did; inconclusive otherwise. Measured: "k of n seeds diverged".

    "trains" (A trains): reproduced when every cell of A trained (none diverged, collapsed,
       stalled or fell below the BLEU bar of a decoding suite; v1: none diverged or stalled); not
       reproduced when none did; inconclusive otherwise.

    "fails_to_train" (A fails: every cell did not train; the complement of "trains", for a paper
       whose "failed" does not say whether the loss blew up or plateaued): reproduced when no
       cell of A trained (v2: each diverged, collapsed, stalled or fell below the BLEU bar; v1:
       diverged or stalled); not reproduced when every cell did; inconclusive otherwise.

    `min_bleu` (rule book v1 only; v2 applies one bar to every decoding suite) ("trains" and
       "fails_to_train" only; optional): the lowest final BLEU (tok) at which
       an "ok" cell counts as trained. Without it, "trained" means only "neither diverged nor
       stalled", and the stall label's bar (best valid NLL 0.1 nats below the unigram NLL) lets a
       model that barely passed word frequencies count as trained. With it, an "ok" cell whose
       BLEU is below the bar, or missing, counts as not trained ("below the BLEU bar") exactly like
       a stalled one. A preset sets it for its setting, before any cell of the claim's arm runs.
       `bleu_metric` (with `min_bleu`; default "bleu", the record's BLEU of the averaged
       checkpoints) names the metric the bar reads: "bleu_last" is the BLEU of the cell's last
       checkpoint alone (scored at the end of training with trainer.final_bleu_last, or
       measured on its run folder afterwards).

    "more_diverged" (A diverges in more of its cells than B; for grids where A and B each select
       many cells): cells are paired by the arm axes other than those a selector fixes to one
       value (an axis a selector lists several values of stays a pairing axis), plus the seed.
       wins = pairs where A diverged and B did not, losses = the reverse;
       p = sign_test(wins, losses), two-sided. Reproduced when wins > losses and p < 0.05; not reproduced when
       wins <= losses; inconclusive otherwise. When the two arms have records but no cell pairs
       up, there is nothing to compare: inconclusive.

    "more_failed" (A fails in more of its cells than B): "more_diverged" with a cell counted as
       failed when it did not train (v2: diverged, collapsed, stalled or below the BLEU bar; v1:
       diverged or stalled), for a model size at which a setting that does not
       train plateaus rather than blows up (the complement of "more_diverged", as
       "fails_to_train" is of "diverges").

    "better" (A's metric is better than B's; direction by `higher_is_better`):
       1. Pair cells as for "more_diverged" (normally: by seed); a cell without a partner in the
          other arm is not evidence either way. If any paired cell of A or B did not train (v1:
          diverged or stalled): reproduced when B has more such cells than A and A has none; not
          reproduced when A has more than B; otherwise go on.
       2. Keep the pairs where both cells trained and have the metric; with fewer than 2,
          inconclusive. The paired difference A - B (B - A when lower is better, so that positive
          means A better) is tested one-sided (H1: mean > 0). The "better" claims of one table
          against the same baseline `b` are one family: their p-values are Holm-corrected
          (`judge_all`). Reproduced when the corrected p < 0.05; not reproduced when the 95%
          paired-t interval lies below 0; "underpowered" when the claim's `paper_effect` is below
          the minimum detectable effect at 80% power (from the measured SD of the differences);
          inconclusive otherwise. [v1: reproduced when the 95% bootstrap interval of the mean
          difference lies above 0, not reproduced when below, else inconclusive.] [v3: the family
          is every planned "better" claim against `b`, a member without a test entering at p = 0
          when reproduced (by the count of cells that did not train) and at p = 1 otherwise; the
          detectable effect and the seeds needed are at alpha / m for a family of m; a count
          (loss spikes) is tested by the exact one-sided sign test over the pairs, ties left out:
          not reproduced when the reverse test's p < 0.025 (the t path's one-sided level),
          "underpowered" when even every pair favouring A would leave the Holm-corrected p at or
          above alpha, the family's other p-values as they are (a waiting member at 0).]
          [v4 (current): step 1 settles nothing. The pairs whose cells trained, stalled or fell
          below the BLEU bar enter step 2 with their recorded metric; a pair with a cell that
          diverged or collapsed (no final value) is decided by outcome, the cell that blew up
          losing (both: a tie), and the claim then goes to v3's sign test over every pair, the
          others by the sign of their difference.]
       Measured: the mean difference with its paired-t interval, every seed's difference, p (and
       Holm's p), the detectable effect and the seeds the paper's effect would need.

    "same_best" (a setting tuned at one value of `across` is best at every other; e.g. the
       learning rate over depths for depth-muP): among A's "ok" cells, the mean metric over seeds
       per (`across`, `over`) value; the best `over` value per `across` value (a setting with no
       ok seed cannot be best). Reproduced when every `across` value has the same best setting
       and it is inside the grid; inconclusive when that shared best is the grid's first or last
       value (the optimum is not bracketed: beyond the grid the bests may part), or when they
       differ by one step of the `over` grid (numeric order); not reproduced when they differ by
       more (a best at an edge can only move outward on a wider grid, so the distance between
       bests that differ is a lower bound). A setting whose cells all diverged or stalled still
       counts as a grid point (crashed cells are not records). An `across` value with records but
       no ok cell has no best: the claim is then inconclusive, and says which value it is; so is
       one with fewer than two `across` values. The uncertainty of the best: each seed's own best
       per `across` value; a shared best that is not every seed's best reads inconclusive [v1:
       not asked].

    "matches" (A and B are equivalent within the claim's `margin`, in the metric's units; e.g.
       DyT matches LayerNorm): cells of an arm that did not train where the other's did settle it
       (not reproduced). Otherwise the paired differences are tested for equivalence by two
       one-sided paired t-tests against -margin and +margin (`tost_paired`): reproduced when both
       reject at 0.05; not reproduced when the 95% paired-t interval lies wholly outside the margin;
       "underpowered" when the margin is narrower than the half-width of the 90% paired-t interval
       (so even an observed difference of 0 could not show equivalence); inconclusive otherwise.

    "less_spread" (A's seed-to-seed spread of the metric is below B's; e.g. Peri-LN's loss over
       seeds against Pre-LN's): cells that did not train settle it as for "better". Otherwise the
       one-sided F-test of var(B) / var(A) over the ok seeds (`variance_ratio_test`): reproduced
       when p < 0.05; not reproduced when the reverse test (A spreads more) has p < 0.05;
       "underpowered" when the claim's `paper_effect` (a variance ratio) is below the ratio the
       test detects at 80% power (`detectable_variance_ratio`; with 3 seeds per arm it is 76);
       inconclusive otherwise.

    Loss spikes: the metric "loss_spikes" of a record is the number of runs of logged training
    losses more than the rule book's `spike_margin` above the lowest loss logged before them
    (`loss_spikes`), read from the record's training curve; a record without one has no value.

A claim may carry `added`: when and why it was written if not before every run of its arms (e.g. a
second reading of a paper's "failed" after a first seed showed a plateau rather than a blow-up).
Reports print it beside the verdict, and such a claim never replaces the one it complements.

Selector values read from YAML are compared as strings (`claim_from_dict` turns 6 into "6" and
true into "true"), as arm axes are recorded as strings.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Collection, Mapping, Optional, Sequence

import numpy as np
from scipy import stats

from runner.console import fmt
from runner.run.status import FAILED_TO_TRAIN
from runner.tables.claims import (
    KINDS,
    STATUSES,
    TWO_ARM_KINDS,
    Claim,
    Record,
    Selected,
    Verdict,
    selector_matches,
)
from runner.tables.rulebook import (
    BELOW_BAR,
    BLOWN_UP,
    COUNT_METRICS,
    CURRENT,
    NOT_TRAINED,
    RuleBook,
    rulebook,
)
from runner.tables.statistics import (
    bootstrap_mean_ci,
    detectable_variance_ratio,
    holm,
    min_detectable_effect,
    paired_t_test,
    pairs_needed,
    sign_test,
    summarize,
    tost_paired,
    variance_ratio_test,
)

# a difference, a mean of differences or an interval's end: signed, 2 decimals, e-notation below 0.01
_signed = partial(fmt, spec="+.2f", small=0.01, small_spec="+.2e")
# Fixed for every verdict: changing them after the runs would be choosing the answer.
_LEVEL = 0.95
_RESAMPLES = 10000
_SEED = 0



# --------------------------------------------------------------------------- judging


def _select(records: Sequence[Record], selector: Mapping[str, Selected]) -> list[Record]:
    """The non-failed records whose arm matches `selector` (failed cells are not evidence)."""
    return [r for r in records if r.status != "failed" and selector_matches(r.arm, selector)]


def selector_label(selector: Mapping[str, Selected]) -> str:
    """A selector as `key=value,...` (a list of values as `a|b`; the empty selector: all)."""
    return ",".join(f"{k}={'|'.join(v) if isinstance(v, (tuple, list)) else v}"
                    for k, v in selector.items()) or "all"


def _unit(records: Sequence[Record]) -> str:
    # "seeds" when the selector picks one arm, "cells" when it spans several (grids).
    arms = {tuple(sorted(r.arm.items())) for r in records}
    return "seeds" if len(arms) <= 1 else "cells"


def _pair(claim: Claim, a_recs: Sequence[Record], b_recs: Sequence[Record]
          ) -> tuple[list[tuple[Record, Record]], dict[str, Any]]:
    """Pairs of (A cell, B cell) with the same seed and the same values on the other shared axes.

    The key is the seed plus the axes every A and B record has, less those that either selector
    fixes to one value (they are what differs between the arms; an axis given as a list varies
    within an arm, so cells pair on it). Returns the pairs and the key axes / unpaired counts.
    """
    named = {k for sel in (claim.a, claim.b or {}) for k, v in sel.items() if not isinstance(v, (tuple, list))}
    shared = set.intersection(*(set(r.arm) for r in [*a_recs, *b_recs])) - named
    axes = sorted(shared)

    def key(r: Record) -> tuple:
        return (*(r.arm[k] for k in axes), r.seed)

    def index(recs: Sequence[Record], side: str) -> dict[tuple, Record]:
        out: dict[tuple, Record] = {}
        for r in recs:
            k = key(r)
            if k in out:
                raise ValueError(f"claim {claim.id!r}: arm {side} has two records for "
                                 f"{dict(zip(axes, k[:-1]))} seed {k[-1]}; pairing is ambiguous")
            out[k] = r
        return out

    a_by, b_by = index(a_recs, "A"), index(b_recs, "B")
    common = sorted(set(a_by) & set(b_by))  # same axes in every key, so tuples compare
    info = {"pair_axes": axes, "unpaired_a": len(a_by) - len(common), "unpaired_b": len(b_by) - len(common)}
    return [(a_by[k], b_by[k]) for k in common], info


def _count_words(a: Sequence[Record], statuses: Sequence[str]) -> str:
    return ", ".join(f"{sum(r.status == s for r in a)} {s.replace('_', ' ')}" for s in statuses)


def _judge_diverges(claim: Claim, a: Sequence[Record]) -> Verdict:
    n = len(a)
    k = sum(r.status == "diverged" for r in a)
    verdict = "reproduced" if k == n else "not reproduced" if k == 0 else "inconclusive"
    measured = f"{k} of {n} {_unit(a)} diverged ({selector_label(claim.a)})"
    collapsed = sum(r.status == "collapsed" for r in a)
    if collapsed:  # not a divergence (the training loss did not blow up), but the reader should know
        measured += f"; {collapsed} collapsed"
    return Verdict(claim, verdict, measured, {"n": n, "diverged": k, "collapsed": collapsed})


def _below_bleu_bar(claim: Claim, r: Record) -> bool:
    """Rule book v1: an "ok" cell that misses the claim's BLEU bar (or has no BLEU) when the claim
    sets one."""
    if claim.min_bleu is None or r.status != "ok":
        return False
    bleu = r.metrics.get(claim.bleu_metric)
    return bleu is None or not math.isfinite(bleu) or bleu < claim.min_bleu


def _not_trained(claim: Claim, a: Sequence[Record], book: RuleBook) -> tuple[int, dict[str, int], str]:
    """The cells of A that did not train: their number, the count per reason, and those in words."""
    if book.version >= 2:  # the statuses already carry the rule book's outcome, BLEU bar included
        if claim.bleu_metric != book.scored_bleu and book.bleu_bar is not None:
            # a claim written about another checkpoint (the last one) meets the same bar there
            a = [_rebarred(r, claim.bleu_metric, book.bleu_bar) for r in a]
        # a suite that does not decode has no BLEU bar (its book's bleu_bar is None): no count of it
        statuses = NOT_TRAINED if book.bleu_bar is not None else tuple(s for s in NOT_TRAINED if s != BELOW_BAR)
        counts = {s: sum(r.status == s for r in a) for s in statuses}
        words = _count_words(a, statuses)
        if book.bleu_bar is not None:
            words = words.replace("below bar", f"below {book.bleu_bar:g} BLEU"
                                  + (" of the last checkpoint" if claim.bleu_metric == "bleu_last" else ""))
        return sum(counts.values()), counts, words
    counts = {"diverged": sum(r.status == "diverged" for r in a),
              "stalled": sum(r.status == "stalled" for r in a)}
    words = f"{counts['diverged']} diverged, {counts['stalled']} stalled"
    if claim.min_bleu is not None:
        counts["below_bleu_bar"] = sum(_below_bleu_bar(claim, r) for r in a)
        words += f", {counts['below_bleu_bar']} below {claim.min_bleu:g} BLEU"
        if claim.bleu_metric == "bleu_last":
            words += " of the last checkpoint"
    return sum(counts.values()), counts, words


def _rebarred(r: Record, metric: str, bar: float) -> Record:
    """A trained or below-bar record judged against the BLEU bar on `metric` instead."""
    if r.status not in ("ok", "below_bar"):
        return r
    value = r.metrics.get(metric)
    below = value is None or not math.isfinite(value) or value < bar
    return Record(r.arm, r.seed, "below_bar" if below else "ok", r.metrics)


def _judge_trains(claim: Claim, a: Sequence[Record], book: RuleBook) -> Verdict:
    n = len(a)
    bad, counts, words = _not_trained(claim, a, book)
    verdict = "reproduced" if bad == 0 else "not reproduced" if bad == n else "inconclusive"
    measured = f"{n - bad} of {n} {_unit(a)} trained ({selector_label(claim.a)}; {words})"
    return Verdict(claim, verdict, measured, {"n": n, "trained": n - bad, **counts})


def _judge_fails_to_train(claim: Claim, a: Sequence[Record], book: RuleBook) -> Verdict:
    n = len(a)
    bad, counts, words = _not_trained(claim, a, book)
    verdict = "reproduced" if bad == n else "not reproduced" if bad == 0 else "inconclusive"
    measured = f"{bad} of {n} {_unit(a)} failed to train ({selector_label(claim.a)}; {words})"
    return Verdict(claim, verdict, measured, {"n": n, "failed": bad, **counts})


def _bad_statuses(book: RuleBook) -> tuple[str, ...]:
    """What does not count as trained in a comparison: v1 diverged or stalled; v2 every way of not
    training (collapsed and below the BLEU bar too)."""
    return NOT_TRAINED if book.version >= 2 else FAILED_TO_TRAIN


def _judge_more_failed(claim: Claim, a: Sequence[Record], b: Sequence[Record], book: RuleBook,
                       failed: tuple[str, ...] = ("diverged",)) -> Verdict:
    """"more_diverged" (failed = diverged) and "more_failed" (every way of not training): the exact
    two-sided sign test over the discordant pairs at the rule book's alpha."""
    pairs, info = _pair(claim, a, b)
    wins = sum(ra.status in failed and rb.status not in failed for ra, rb in pairs)
    losses = sum(rb.status in failed and ra.status not in failed for ra, rb in pairs)
    p = sign_test(wins, losses)
    a_div = sum(r.status in failed for r in a)
    b_div = sum(r.status in failed for r in b)
    what = " or ".join(s.replace("_", " ") for s in failed)
    details = {"pairs": len(pairs), "wins": wins, "losses": losses, "p": p,
               "a_diverged": a_div, "a_n": len(a), "b_diverged": b_div, "b_n": len(b), **info}
    if not pairs:
        verdict = "inconclusive"
    elif wins > losses and p < book.alpha:
        verdict = "reproduced"
    elif wins <= losses:
        verdict = "not reproduced"
    else:
        verdict = "inconclusive"
    measured = (f"{selector_label(claim.a)} {what} in {a_div} of {len(a)} cells, {selector_label(claim.b or {})} in "
                f"{b_div} of {len(b)}; over {len(pairs)} paired cells only A {what} in {wins}, only B in "
                f"{losses} (sign test p={p:.3g})")
    return Verdict(claim, verdict, measured, details)


def _metric_diff(claim: Claim, ra: Record, rb: Record) -> Optional[float]:
    """A - B of the claim's metric, signed so that positive means A better; None when either
    cell lacks a finite value."""
    va, vb = ra.metrics.get(claim.metric), rb.metrics.get(claim.metric)
    if va is None or vb is None or not (math.isfinite(va) and math.isfinite(vb)):
        return None
    return (1.0 if claim.higher_is_better else -1.0) * (float(va) - float(vb))


def _ok_diffs(claim: Claim, pairs: Sequence[tuple[Record, Record]]) -> list[tuple[int, float]]:
    """(seed, A - B) of the claim's metric over the pairs where both cells are ok with a finite
    value, signed so that positive means A better."""
    return [(ra.seed, d) for ra, rb in pairs if ra.status == "ok" and rb.status == "ok"
            and (d := _metric_diff(claim, ra, rb)) is not None]


def _bad_cells(claim: Claim, a: Sequence[Record], b: Sequence[Record], book: RuleBook
               ) -> tuple[list[tuple[Record, Record]], dict[str, Any], str, Optional[str]]:
    """The seed pairs of a two-arm comparison, its details, a line counting the cells of each arm
    that did not train, and the verdict those settle alone ("reproduced" when only B has such cells,
    "not reproduced" when A has more; None when the metric must decide). The cells are counted over
    the seed-matched pairs only, so that a seed one arm lacks cannot tip the verdict (with the same
    seeds in both arms this is every cell)."""
    pairs, info = _pair(claim, a, b)
    bad = _bad_statuses(book)
    a_bad = sum(ra.status in bad for ra, _ in pairs)
    b_bad = sum(rb.status in bad for _, rb in pairs)
    la, lb = selector_label(claim.a), selector_label(claim.b or {})
    details: dict[str, Any] = {"a_n": len(a), "a_bad": a_bad, "b_n": len(b), "b_bad": b_bad, **info}
    line = (f"{'/'.join(s.replace('_', ' ') for s in bad)}: {la} {a_bad} of {len(pairs)}, "
            f"{lb} {b_bad} of {len(pairs)}")
    if info["unpaired_a"] or info["unpaired_b"]:
        line += (f" paired cells ({info['unpaired_a']} of {la} and {info['unpaired_b']} of {lb} "
                 "without a partner left out)")
    settled = ("reproduced" if b_bad > a_bad == 0 else "not reproduced" if a_bad > b_bad else None)
    return pairs, details, line, settled


def _judge_matches(claim: Claim, a: Sequence[Record], b: Sequence[Record], book: RuleBook) -> Verdict:
    """Equivalence of A and B within the claim's margin (rule book v2, paired TOST)."""
    pairs, details, bad_line, settled = _bad_cells(claim, a, b, book)
    if settled is not None:
        # one arm fails to train where the other trains: they do not match
        return Verdict(claim, "not reproduced", bad_line, details)
    diffs = _ok_diffs(claim, pairs)
    la, lb = selector_label(claim.a), selector_label(claim.b or {})
    margin = float(claim.margin or 0.0)
    details.update({"paired": len(diffs), "margin": margin})
    if len(diffs) < 2:
        return Verdict(claim, "inconclusive",
                       f"{claim.metric}: only {len(diffs)} paired ok seed(s) with the metric, need 2", details)
    values = [d for _, d in diffs]
    s = summarize(values, level=book.level)
    assert s.mean is not None and s.std is not None and s.ci_low is not None and s.ci_high is not None
    p = tost_paired(values, margin)
    # the half-width of the (1 - 2 alpha) interval: the TOST cannot pass with a margin narrower
    # than this, even when the observed difference is 0
    half = float(stats.t.ppf(1 - book.alpha, s.n - 1)) * s.std / math.sqrt(s.n)
    details.update({"mean_diff": s.mean, "std_diff": s.std, "ci_low": s.ci_low, "ci_high": s.ci_high,
                    "level": book.level, "p_tost": p, "half_width": half,
                    "diffs": {str(seed): d for seed, d in diffs}})
    if p < book.alpha:
        verdict = "reproduced"
    elif s.ci_low > margin or s.ci_high < -margin:
        verdict = "not reproduced"
    elif margin < half:
        verdict = "underpowered"
    else:
        verdict = "inconclusive"
    sign = "" if claim.higher_is_better else ", lower is better"
    head = f"{la} - {lb}" if claim.higher_is_better else f"{lb} - {la}"  # positive = A better
    measured = (f"{head} {claim.metric} {_signed(s.mean)} [95% paired t {_signed(s.ci_low)}, "
                f"{_signed(s.ci_high)}] over {s.n} paired seeds{sign} ({_seed_pairs(diffs)}); equivalence "
                f"margin +/-{margin:g}: TOST p={p:.3g}; the narrowest margin {s.n} seeds could show: "
                f"{half:.3g}")
    return Verdict(claim, verdict, measured, details)


def _judge_less_spread(claim: Claim, a: Sequence[Record], b: Sequence[Record], book: RuleBook) -> Verdict:
    """A's seed-to-seed spread of the metric below B's (rule book v2, one-sided F-test)."""
    _, details, bad_line, settled = _bad_cells(claim, a, b, book)
    if settled is not None:
        return Verdict(claim, settled, bad_line, details)
    la, lb = selector_label(claim.a), selector_label(claim.b or {})

    def ok_values(recs: Sequence[Record]) -> list[float]:
        return [float(r.metrics[claim.metric]) for r in recs if r.status == "ok"
                and r.metrics.get(claim.metric) is not None and math.isfinite(r.metrics[claim.metric])]

    va, vb = ok_values(a), ok_values(b)
    details.update({"a_values": va, "b_values": vb})
    if len(va) < 2 or len(vb) < 2:
        return Verdict(claim, "inconclusive", f"{claim.metric}: {len(va)} ok seeds of {la} and {len(vb)} of "
                       f"{lb} with the metric, need 2 each", details)
    sd_a, sd_b = float(np.std(va, ddof=1)), float(np.std(vb, ddof=1))
    p = variance_ratio_test(va, vb)
    p_reverse = variance_ratio_test(vb, va)
    detectable = detectable_variance_ratio(len(va), len(vb), book.alpha, book.power)
    details.update({"sd_a": sd_a, "sd_b": sd_b, "p": p, "p_reverse": p_reverse,
                    "detectable_ratio": detectable})
    if p < book.alpha:
        verdict = "reproduced"
    elif p_reverse < book.alpha:
        verdict = "not reproduced"
    elif claim.paper_effect is not None and claim.paper_effect < detectable:
        verdict = "underpowered"
    else:
        verdict = "inconclusive"
    ratio = "inf" if sd_a == 0 else f"{(sd_b / sd_a) ** 2:.3g}"
    measured = (f"{claim.metric} SD over seeds: {la} {sd_a:.3g} ({len(va)} ok seeds), {lb} {sd_b:.3g} "
                f"({len(vb)}); variance ratio B/A {ratio}, one-sided F-test p={p:.3g}; ratio detectable "
                f"at {book.power:.0%} power: {detectable:.3g}"
                + (f" (paper's: {claim.paper_effect:g})" if claim.paper_effect is not None else ""))
    return Verdict(claim, verdict, measured, details)


def _seed_pairs(diffs: Sequence[tuple[int, float]]) -> str:
    return ", ".join(f"seed {seed} {_signed(d + 0.0)}" for seed, d in diffs)  # + 0.0: -0.0 reads 0


def _power_alpha(book: RuleBook, family_size: int) -> float:
    """The level the detectable effect and the seeds needed are computed at: alpha (v2), or alpha
    over the family's size (v3: the level Holm tests the smallest p at)."""
    return book.alpha / max(1, family_size) if book.power_level == "family" else book.alpha


def _tested_diffs(claim: Claim, pairs: Sequence[tuple[Record, Record]]
                  ) -> tuple[list[tuple[int, float]], list[tuple[int, float, str]]]:
    """Rule book v4's evidence of a "better" claim: (seed, A - B) of the metric, positive = A
    better, over the pairs whose cells both finished without a blow-up (trained, stalled or below
    the BLEU bar) with a finite value; and (seed, +1 | -1 | 0, words) for each pair with a diverged
    or collapsed cell, decided by outcome (the cell that blew up loses; both: a tie)."""
    diffs, by_outcome = [], []
    for ra, rb in pairs:
        a_up, b_up = ra.status in BLOWN_UP, rb.status in BLOWN_UP
        if a_up or b_up:
            score = 0.0 if a_up and b_up else -1.0 if a_up else 1.0
            words = (f"both {ra.status}" if a_up and b_up and ra.status == rb.status else
                     f"A {ra.status}, B {rb.status}" if a_up and b_up else
                     f"A {ra.status}" if a_up else f"B {rb.status}")
            by_outcome.append((ra.seed, score, words))
        elif (d := _metric_diff(claim, ra, rb)) is not None:
            diffs.append((ra.seed, d))
    return diffs, by_outcome


def _judge_better(claim: Claim, a: Sequence[Record], b: Sequence[Record], book: RuleBook,
                  family_size: int = 1) -> Verdict:
    pairs, details, bad_line, settled = _bad_cells(claim, a, b, book)
    if settled is not None and book.not_trained_pairs == "settle":
        return Verdict(claim, settled, bad_line, details)
    a_bad, b_bad = details["a_bad"], details["b_bad"]
    la, lb = selector_label(claim.a), selector_label(claim.b or {})
    # Written so that a positive number always means "A better".
    head = f"{la} - {lb}" if claim.higher_is_better else f"{lb} - {la}"
    suffix = "" if not (a_bad or b_bad) else f" ({bad_line})"
    lower = "" if claim.higher_is_better else ", lower is better"
    if book.not_trained_pairs == "test":
        diffs, by_outcome = _tested_diffs(claim, pairs)
        details["paired"] = len(diffs) + len(by_outcome)
        if by_outcome:
            return _judge_better_by_outcome(claim, diffs, by_outcome, details, book, head, lower, suffix)
    else:
        diffs = _ok_diffs(claim, pairs)
        details["paired"] = len(diffs)
    if len(diffs) < 2:
        which = "paired seed(s)" if book.not_trained_pairs == "test" else "paired ok seed(s)"
        measured = f"{claim.metric}: only {len(diffs)} {which} with the metric, need 2{suffix}"
        return Verdict(claim, "inconclusive", measured, details)
    values = [d for _, d in diffs]
    favour = sum(d > 0 for d in values)
    if book.better_test == "bootstrap_ci":  # rule book v1, kept to show where verdicts changed
        lo, hi = bootstrap_mean_ci(values, level=_LEVEL, resamples=_RESAMPLES, seed=_SEED, min_values=2)
        mean = float(np.mean(values))
        details.update({"mean_diff": mean, "ci_low": lo, "ci_high": hi, "pairs_favouring_a": favour})
        verdict = "reproduced" if lo > 0 else "not reproduced" if hi < 0 else "inconclusive"
        measured = (f"{head} {claim.metric} {_signed(mean)} [95% bootstrap {_signed(lo)}, {_signed(hi)}] over "
                    f"{len(values)} paired seeds{lower}; {favour} of {len(values)} favour {la}{suffix}")
        return Verdict(claim, verdict, measured, details)

    s = summarize(values, level=book.level)
    assert s.mean is not None and s.std is not None and s.ci_low is not None and s.ci_high is not None
    power_alpha = _power_alpha(book, family_size)
    if book.count_test == "sign" and claim.metric in COUNT_METRICS:
        return _judge_better_count(claim, diffs, details, book, head, lower, suffix)
    p = paired_t_test(values)
    details.update({"mean_diff": s.mean, "std_diff": s.std, "ci_low": s.ci_low, "ci_high": s.ci_high,
                    "level": book.level, "higher_is_better": claim.higher_is_better, "p": p,
                    "pairs_favouring_a": favour, "diffs": {str(seed): d for seed, d in diffs}})
    at = "" if power_alpha == book.alpha else f" at alpha {power_alpha:.3g}"
    if s.std > 0:
        mde = min_detectable_effect(s.std, s.n, power_alpha, book.power)
        power_words = f"detectable at {book.power:.0%} power{at}: {_signed(mde).lstrip('+')}"
    else:  # every pair differs by the same amount: no spread to size an effect by
        mde = None if book.power_level == "family" else 0.0
        power_words = f"detectable at {book.power:.0%} power{at}: " + ("n/a (no spread)" if mde is None else
                                                                        _signed(mde).lstrip('+'))
    details["mde"] = mde
    if claim.paper_effect is not None:
        needed = pairs_needed(s.std, claim.paper_effect, power_alpha, book.power) if s.std > 0 else s.n
        details.update({"paper_effect": claim.paper_effect, "pairs_needed": needed})
        power_words += (f"; paper's effect {_signed(claim.paper_effect).lstrip('+')} needs "
                        + (f"{needed} seeds" if needed is not None else "more than 200 seeds"))
    # the verdict before the family's Holm correction (judge_all finishes it)
    verdict = _better_verdict(details, p, book)
    measured = (f"{head} {claim.metric} {_signed(s.mean)} [95% paired t {_signed(s.ci_low)}, {_signed(s.ci_high)}] "
                f"over {s.n} paired seeds{lower} ({_seed_pairs(diffs)}); one-sided p={p:.3g}; "
                f"{power_words}{suffix}")
    return Verdict(claim, verdict, measured, details)


def _one_sided_sign(wins: int, losses: int) -> float:
    """The exact one-sided sign test's p of `wins` against `losses` (scipy.stats.binomtest); 1 with
    no untied pair."""
    n = wins + losses
    return float(stats.binomtest(wins, n, 0.5, alternative="greater").pvalue) if n else 1.0


def _sign_details(claim: Claim, scores: Sequence[tuple[int, float]], best_p: float, details: dict
                  ) -> tuple[int, int, float]:
    """Fill a sign-tested claim's details from its (seed, score) pairs (ties left out); returns
    (wins, losses, p). Judged alone the best case is best_p itself (judge_all sets it for the
    family)."""
    wins, losses = sum(d > 0 for _, d in scores), sum(d < 0 for _, d in scores)
    p = _one_sided_sign(wins, losses)
    details.update({"test": "sign", "p": p, "p_reverse": _one_sided_sign(losses, wins), "wins": wins,
                    "losses": losses, "best_p": best_p, "best_p_holm": best_p,
                    "higher_is_better": claim.higher_is_better, "pairs_favouring_a": wins,
                    "diffs": {str(seed): d for seed, d in scores}})
    return wins, losses, p


def _judge_better_count(claim: Claim, diffs: Sequence[tuple[int, float]], details: dict, book: RuleBook,
                        head: str, lower: str, suffix: str) -> Verdict:
    """Rule book v3's "better" on a count (loss spikes): the exact one-sided sign test over the
    seed pairs, ties left out (scipy.stats.binomtest)."""
    best_p = 0.5 ** len(diffs)  # every pair favouring A
    wins, losses, p = _sign_details(claim, diffs, best_p, details)
    untied = wins + losses
    measured = (f"{head} {claim.metric} over {len(diffs)} paired seeds{lower} ({_seed_pairs(diffs)}): "
                f"{wins} favour A, {losses} favour B, {len(diffs) - untied} tied; one-sided sign test "
                f"p={p:.3g}; the smallest p {len(diffs)} pairs can give: {best_p:.3g}{suffix}")
    return Verdict(claim, _better_verdict(details, p, book), measured, details)


def _judge_better_by_outcome(claim: Claim, diffs: Sequence[tuple[int, float]],
                             by_outcome: Sequence[tuple[int, float, str]], details: dict, book: RuleBook,
                             head: str, lower: str, suffix: str) -> Verdict:
    """Rule book v4's "better" where a pair has a cell that diverged or collapsed: the exact
    one-sided sign test over every pair, those pairs decided by outcome and the others by the sign
    of their difference, ties left out (scipy.stats.binomtest), read as v3 reads a count's."""
    scores = sorted([(seed, d) for seed, d in diffs] + [(seed, d) for seed, d, _ in by_outcome])
    # the best case: every pair that could favour A doing so; a pair decided against A (A blew
    # up) stays a loss and one where both blew up a tie
    forced_losses = sum(score < 0 for _, score, _ in by_outcome)
    open_pairs = len(scores) - forced_losses - sum(score == 0.0 for _, score, _ in by_outcome)
    best_p = _one_sided_sign(open_pairs, forced_losses) if open_pairs else 1.0
    wins, losses, p = _sign_details(claim, scores, best_p, details)
    untied = wins + losses
    details["by_outcome"] = len(by_outcome)
    words = {seed: w for seed, _, w in by_outcome}
    listed = ", ".join(f"seed {seed} {words[seed]}" if seed in words else f"seed {seed} {_signed(d + 0.0)}"
                       for seed, d in scores)
    measured = (f"{head} {claim.metric} over {len(scores)} paired seeds{lower}, a pair with a blown-up cell "
                f"decided by outcome ({listed}): {wins} favour A, {losses} favour B, {len(scores) - untied} "
                f"tied; one-sided sign test p={p:.3g}; the smallest p these pairs can give: "
                f"{best_p:.3g}{suffix}")
    return Verdict(claim, _better_verdict(details, p, book), measured, details)


def _better_verdict(details: Mapping[str, Any], p_adjusted: float, book: RuleBook) -> str:
    """Rule book v2's to v4's "better" verdict from the (Holm-adjusted) p and the interval and
    power (the sign test, v3's on counts and v4's on pairs with a blown-up cell: the reverse test
    and the smallest p the pairs can give)."""
    if p_adjusted < book.alpha:
        return "reproduced"
    if details.get("test") == "sign":
        # the reverse one-sided test at (1 - level) / 2 = 0.025, the level at which the t path's
        # 95% interval lies below 0
        if details["p_reverse"] < (1.0 - book.level) / 2:
            return "not reproduced"
        return "underpowered" if details["best_p_holm"] >= book.alpha else "inconclusive"
    if details["ci_high"] < 0:
        return "not reproduced"
    effect, mde = details.get("paper_effect"), details.get("mde")
    if effect is not None and mde is not None and effect < mde:
        return "underpowered"
    return "inconclusive"


def numeric_order(value: str) -> tuple:
    """Sort key for a grid axis's values: numbers in numeric order (1e-3 < 2e-3 < 1e-2), then
    anything else by its text."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _bests(claim: Claim, cells: Sequence[Record]) -> tuple[dict[str, str], dict[str, tuple[str, float]]]:
    """The best `over` setting per `across` value by the metric averaged over the given ok cells,
    and the runner-up with its margin."""
    means: dict[str, dict[str, list[float]]] = {}
    for r in cells:
        value = r.metrics.get(claim.metric)
        if r.status == "ok" and value is not None and math.isfinite(value):
            means.setdefault(r.arm.get(claim.across, ""), {}).setdefault(r.arm.get(claim.over, ""), []).append(value)
    best: dict[str, str] = {}
    runner_up: dict[str, tuple[str, float]] = {}
    for across, by_setting in sorted(means.items(), key=lambda kv: numeric_order(kv[0])):
        averaged = {k: sum(v) / len(v) for k, v in by_setting.items()}
        ranked = sorted(averaged, key=averaged.get, reverse=claim.higher_is_better)
        best[across] = ranked[0]
        if len(ranked) > 1:
            runner_up[across] = (ranked[1], abs(averaged[ranked[0]] - averaged[ranked[1]]))
    return best, runner_up


def _judge_same_best(claim: Claim, a: Sequence[Record], book: RuleBook) -> Verdict:
    grid = sorted({r.arm.get(claim.over, "") for r in a}, key=numeric_order)
    best, runner_up = _bests(claim, a)

    def won(across: str) -> str:
        # context: a best that wins by 0.01 nats weighs differently from one that wins by 0.1
        if across not in runner_up:
            return ""
        second, margin = runner_up[across]
        return f" (by {margin:.3f} over {second})"

    measured = (f"best {claim.over} by {claim.across}: "
                + ", ".join(f"{k} -> {v}{won(k)}" for k, v in best.items())
                + f" ({claim.metric}, mean over ok seeds; grid {grid[0]} to {grid[-1]}, {len(grid)} values)")
    details: dict[str, Any] = {"best": best, "grid": grid,
                               "runner_up": {k: {"setting": v[0], "margin": v[1]} for k, v in runner_up.items()}}
    # The uncertainty of the best: each seed's own best per depth, and whether it is the shared one.
    per_seed = {seed: _bests(claim, [r for r in a if r.seed == seed])[0] for seed in sorted({r.seed for r in a})}
    shared = set(best.values())
    agree = [seed for seed, b in per_seed.items()
             if len(shared) == 1 and set(b) == set(best) and set(b.values()) == shared]
    details.update({"per_seed_best": {str(k): v for k, v in per_seed.items()}, "seeds_agreeing": len(agree)})
    if book.same_best_per_seed:
        measured += (f"; each seed's own best ({claim.across}: {claim.over}): "
                     + "; ".join(f"seed {seed} " + ", ".join(f"{k}: {v}" for k, v in b.items())
                                 for seed, b in per_seed.items())
                     + f"; {len(agree)} of {len(per_seed)} seeds agree with the shared best")
    no_best = sorted({r.arm.get(claim.across, "") for r in a} - set(best), key=numeric_order)
    if no_best:
        details["no_ok_cell"] = no_best
        measured += f"; no ok cell at {claim.across}=" + ",".join(no_best)
    if len(best) < 2 or no_best:
        return Verdict(claim, "inconclusive", measured, details)
    positions = [grid.index(v) for v in best.values()]
    spread = max(positions) - min(positions)
    at_edge = spread == 0 and positions[0] in (0, len(grid) - 1)
    if at_edge:
        measured += "; the shared best is at the edge of the grid, so the optimum is not bracketed"
    verdict = ("inconclusive" if at_edge or spread == 1 else "reproduced" if spread == 0
               else "not reproduced")
    if verdict == "reproduced" and book.same_best_per_seed and len(agree) < len(per_seed):
        verdict = "inconclusive"
        measured += "; the shared best is not every seed's best"
    return Verdict(claim, verdict, measured, {**details, "spread_steps": spread, "at_edge": at_edge})


def judge(claim: Claim, records: Sequence[Record], book: RuleBook | int | None = None,
          family_size: int = 1) -> Verdict:
    """The verdict on `claim` from `records` under rule book `book` (default: the current one).

    The records' statuses must already carry the book's outcomes (runner/tables/rulebook.py `outcome`).
    A "better" claim judged alone is its own family; `judge_all` corrects a table's family (and
    passes its size, at which rule book v3 computes the detectable effect)."""
    book = rulebook(CURRENT if book is None else book) if not isinstance(book, RuleBook) else book
    if claim.kind not in KINDS:
        raise ValueError(f"claim {claim.id!r}: unknown kind {claim.kind!r}; known: {list(KINDS)}")
    for r in records:
        if r.status not in STATUSES:
            raise ValueError(f"record {r.arm} seed {r.seed}: unknown status {r.status!r}; known: {list(STATUSES)}")
    a = _select(records, claim.a)
    two_arms = claim.kind in TWO_ARM_KINDS
    if two_arms and claim.b is None:
        raise ValueError(f"claim {claim.id!r}: kind {claim.kind!r} needs a selector b")
    b = _select(records, claim.b) if two_arms and claim.b is not None else []
    if two_arms:
        both = [r for r in a if selector_matches(r.arm, claim.b or {})]
        if both:
            raise ValueError(f"claim {claim.id!r}: record {both[0].arm} matches both selectors")
    arms = ((claim.a, a), (claim.b or {}, b)) if two_arms else ((claim.a, a),)
    empty = [selector_label(sel) for sel, recs in arms if not recs]
    if not a or (two_arms and not b):
        return Verdict(claim, "not run", f"no run of {' and '.join(empty)} (none, or only crashed ones)",
                       {"a_n": len(a), "b_n": len(b)} if two_arms else {"n": 0})
    if claim.kind == "same_best":
        return _judge_same_best(claim, a, book)
    if claim.kind == "diverges":
        return _judge_diverges(claim, a)
    if claim.kind == "trains":
        return _judge_trains(claim, a, book)
    if claim.kind == "fails_to_train":
        return _judge_fails_to_train(claim, a, book)
    if claim.kind == "more_diverged":
        return _judge_more_failed(claim, a, b, book)
    if claim.kind == "more_failed":
        return _judge_more_failed(claim, a, b, book, failed=_bad_statuses(book))
    if claim.kind == "matches":
        return _judge_matches(claim, a, b, book)
    if claim.kind == "less_spread":
        return _judge_less_spread(claim, a, b, book)
    return _judge_better(claim, a, b, book, family_size)


def family_of(claim: Claim) -> str:
    """The family a "better" claim's test belongs to: the table's comparisons against one baseline
    arm (its `b` selector)."""
    return selector_label(claim.b or {})


def judge_all(claims: Sequence[Claim], records: Sequence[Record], book: RuleBook | int | None = None,
              waiting: Collection[str] = ()) -> list[Verdict]:
    """Every claim of one table judged under `book`; from rule book v2 the "better" claims against
    the same baseline arm are one family whose p-values are Holm-corrected (v2: the members that
    reached a test; v3: every planned member, one settled without a test at p = 0 when reproduced,
    else p = 1).

    `waiting`: the ids of claims whose arms still miss planned cells (a partial suite). Holm's
    adjusted p of one member depends on the others' p-values, so a member whose own cells are all
    in is still "incomplete" while its verdict could change with a waiting member's final p: its
    verdict with every waiting member at p = 0 (or, in v2, settled without a test, which v2 leaves
    out of the family: the same adjusted p-values) differs from its verdict with them at p = 1.
    Holm's adjusted p-values only grow as any p grows, so those two bound every outcome; where they
    agree the verdict is final."""
    book = rulebook(CURRENT if book is None else book) if not isinstance(book, RuleBook) else book
    planned: dict[str, list[int]] = {}
    for i, c in enumerate(claims):
        if c.kind == "better":
            planned.setdefault(family_of(c), []).append(i)
    size = {i: len(members) for members in planned.values() for i in members}
    out = [judge(c, records, book, size.get(i, 1) if book.holm_family == "planned" else 1)
           for i, c in enumerate(claims)]
    if book.better_test != "paired_t_holm":
        return out
    for members in planned.values():
        if book.holm_family == "tested":  # v2: the members with a test, and the waiting ones
            members = [i for i in members if "p" in out[i].details or claims[i].id in waiting]
        if not members:
            continue

        def p_of(i: int) -> float:  # v3: a member settled without a test enters at p = 0 or 1
            return out[i].details.get("p", 0.0 if out[i].verdict == "reproduced" else 1.0)

        def verdict_at(i: int, ps: Mapping[int, float], among: Sequence[int],
                       details: dict) -> tuple[str, float, dict]:
            """Member i's verdict with the members `among` at p-values `ps`: Holm's adjusted p and,
            for a count's sign test, the adjusted p it would have had every pair favoured A."""
            p_adj = holm([ps[j] for j in among])[among.index(i)]
            if details.get("test") == "sign":
                best = holm([details["best_p"] if j == i else ps[j] for j in among])[among.index(i)]
                details = {**details, "best_p_holm": best}
            return _better_verdict(details, p_adj, book), p_adj, details

        tested = [i for i in members if "p" in out[i].details]
        counted = tested if book.holm_family == "tested" else members
        unsettled = [i for i in members if claims[i].id in waiting]
        # the family's p-values with every waiting member at p = 0 and at p = 1
        extremes = {x: {j: x if j in unsettled else p_of(j) for j in members} for x in (0.0, 1.0)}
        for i in tested:
            v = out[i]
            verdict, p_adj, details = verdict_at(i, {j: p_of(j) for j in counted}, counted, dict(v.details))
            details = {**details, "p_holm": p_adj, "family_size": len(counted)}
            measured = v.measured
            if len(counted) > 1:
                measured = measured.replace(f"one-sided p={v.details['p']:.3g}",
                                            f"one-sided p={v.details['p']:.3g}, Holm over {len(counted)}: {p_adj:.3g}")
                measured = measured.replace(f"one-sided sign test p={v.details['p']:.3g}",
                                            f"one-sided sign test p={v.details['p']:.3g}, Holm over "
                                            f"{len(counted)}: {p_adj:.3g}")
            if unsettled and i not in unsettled:
                low, high = (verdict_at(i, extremes[x], members, details)[0] for x in (0.0, 1.0))
                if low != high:
                    names = [claims[j].id for j in unsettled]
                    measured = (f"its cells are all in, but its verdict turns on the Holm family's "
                                f"{', '.join(names)}, which still misses cells ({low} or {high}); so far: {measured}")
                    details = {**details, "provisional_verdict": verdict, "waits_for": names}
                    verdict = "incomplete"
            out[i] = Verdict(v.claim, verdict, measured, details)
    return out
