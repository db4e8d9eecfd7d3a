"""Statistics over seeds and pre-registered claim verdicts for reproduction tables.

Each trained cell (one seed of one arm) is a `Record`; a paper's claim is a `Claim` (written in a
YAML file before the runs, hence "pre-registered"); `judge` turns a claim and the records into a
`Verdict`: "reproduced", "not reproduced", "inconclusive" or "not run", with one line of numbers
saying what was measured. The rules below are fixed in advance so that a verdict cannot be chosen
after seeing the numbers.

Statistics
    Mean, sample standard deviation (ddof=1) and the Student-t 95% confidence interval of the mean
    (scipy.stats.t); differences between arms are paired by seed (the same seed gives the same data
    order and the same initial draw), which removes the seed-to-seed variance both arms share, and
    get the paired-t interval. A percentile bootstrap (Efron & Tibshirani 1993, ch. 13) is used only
    with at least 10 values: with 3 seeds its 95% interval is exactly [min, max] and covers the mean
    about 75% of the time. "better" is decided by a one-sided paired t-test, with Holm's correction
    over a table's comparisons against one baseline, and reports the minimum detectable effect at
    80% power (noncentral t, scipy.stats.nct). Counts of discordant pairs use the exact two-sided
    sign test (Conover 1999, *Practical Nonparametric Statistics*, 3rd ed., sec. 3.4), which on
    diverged/not-diverged pairs is McNemar's exact test (McNemar 1947).

    Which rules apply is the rule book's (runner/tables/rulebook.py): `judge` and `judge_all` take its
    version; the records' statuses carry its outcomes (ok = trained, diverged, collapsed, stalled,
    below_bar, failed). What follows is version 2, with version 1's differences in brackets.

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
       stalled or fell below the BLEU bar; v1: none diverged or stalled); not reproduced when
       none did; inconclusive otherwise.

    "fails_to_train" (A fails: every cell diverged or stalled; the complement of "trains", for a
       paper whose "failed" does not say whether the loss blew up or plateaued): reproduced when
       every cell of A diverged or stalled; not reproduced when none did; inconclusive otherwise.

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
       failed when it diverged or stalled, for a model size at which a setting that does not
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
          difference lies above 0, not reproduced when below, else inconclusive.]
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
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from scipy import optimize, stats

from runner.console import fmt
from runner.run.status import FAILED_TO_TRAIN, OK
from runner.tables.rulebook import CURRENT, NOT_TRAINED, OUTCOMES, TRAINED, RuleBook, rulebook

# a Record's status: its outcome under the rule book, "ok" for trained: a way of not training
# (rule book v2 adds collapsed and below_bar; v1 records only diverged and stalled), or "failed"
# (a crash: not evidence)
STATUSES = tuple(OK if o == TRAINED else o for o in OUTCOMES)
# a difference, a mean of differences or an interval's end: signed, 2 decimals, e-notation below 0.01
_signed = partial(fmt, spec="+.2f", small=0.01, small_spec="+.2e")
KINDS = ("better", "diverges", "trains", "fails_to_train", "more_diverged", "more_failed", "same_best",
         "matches", "less_spread")
TWO_ARM_KINDS = ("better", "more_diverged", "more_failed", "matches", "less_spread")
METRIC_KINDS = ("better", "same_best", "matches", "less_spread")  # the kinds that compare `metric`
# what a claim's `metric` can name: the metrics each Record carries (runner/tables/suite.py)
METRICS = ("bleu", "sacrebleu", "best_valid_loss", "bleu_last", "loss_spikes")
VERDICTS = ("reproduced", "not reproduced", "underpowered", "inconclusive", "not run")

# Fixed for every verdict: changing them after the runs would be choosing the answer.
_LEVEL = 0.95
_RESAMPLES = 10000
_SEED = 0
_ALPHA = 0.05


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Summary:
    """One metric over seeds: count, mean, sample std (ddof=1) and the 95% Student-t CI of the mean."""

    n: int
    mean: float | None
    std: float | None  # sample std, ddof=1; None when n < 2
    ci_low: float | None  # Student-t CI of the mean; None when n < 2
    ci_high: float | None


def _as_finite_array(values: Sequence[float]) -> np.ndarray:
    x = np.asarray(list(values), dtype=float)
    if x.ndim != 1:
        raise ValueError(f"expected a flat sequence of numbers, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"values must be finite, got {x.tolist()}")
    return x


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")


def bootstrap_mean_ci(values: Sequence[float], level: float = 0.95, resamples: int = 10000,
                      seed: int = 0, min_values: int = 10) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of `values` (Efron & Tibshirani 1993, ch. 13).

    Draws `resamples` samples of len(values) with replacement using numpy.random.default_rng(seed),
    takes each one's mean, and returns the (1-level)/2 and (1+level)/2 quantiles of those means.
    Deterministic for a fixed seed. Needs at least `min_values` finite values (10): with fewer,
    the percentile interval is close to the range of the values (with 3, exactly [min, max]) and
    covers the mean far less often than its level says. Only rule book v1's verdicts, kept beside
    the current ones, call it with fewer (min_values=2).
    """
    x = _as_finite_array(values)
    _check_level(level)
    if x.size < max(2, min_values):
        raise ValueError(f"a bootstrap CI needs at least {max(2, min_values)} values, got {x.size}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    # All equal: every resample has the same mean. Return the value itself rather than a sum / n
    # that may differ from it in the last bit.
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    means = x[idx].mean(axis=1)
    alpha = 1.0 - level
    lo, hi = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


def summarize(values: Sequence[float], level: float = 0.95) -> Summary:
    """Summary of `values` (one metric over seeds): n, mean, sample std (ddof=1) and the Student-t
    confidence interval of the mean (`t_mean_ci`). std and the interval are None when n < 2; mean
    is None when n == 0."""
    x = _as_finite_array(values)
    n = int(x.size)
    if n == 0:
        return Summary(n=0, mean=None, std=None, ci_low=None, ci_high=None)
    mean = float(x.mean())
    if n < 2:
        return Summary(n=n, mean=mean, std=None, ci_low=None, ci_high=None)
    lo, hi = t_mean_ci(x, level=level)
    return Summary(n=n, mean=mean, std=float(x.std(ddof=1)), ci_low=lo, ci_high=hi)


def t_mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Student's t confidence interval of the mean: mean -/+ t_{(1+level)/2, n-1} * s / sqrt(n)
    (scipy.stats.t). Its coverage is `level` when the values are normal; with 2 or 3 seeds it is
    wide (t = 12.7 and 4.3), as it must be."""
    x = _as_finite_array(values)
    _check_level(level)
    if x.size < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {x.size}")
    mean = float(x.mean())
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    half = float(stats.t.ppf((1 + level) / 2, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean - half, mean + half


def paired_t_test(diffs: Sequence[float], alternative: str = "greater") -> float:
    """p-value of a paired t-test on `diffs` (A - B per seed, signed so that positive means A
    better): one-sided that their mean is greater than 0 by default, or "two-sided"
    (scipy.stats.ttest_1samp). All-equal differences have no spread: p is 0 when they are nonzero
    in the tested direction, 1 otherwise."""
    x = _as_finite_array(diffs)
    if x.size < 2:
        raise ValueError(f"a paired t-test needs at least 2 pairs, got {x.size}")
    if alternative not in ("greater", "two-sided"):
        raise ValueError(f"alternative must be 'greater' or 'two-sided', got {alternative!r}")
    if np.all(x == x[0]):
        return 0.0 if (x[0] > 0 or (alternative == "two-sided" and x[0] != 0)) else 1.0
    return float(stats.ttest_1samp(x, 0.0, alternative=alternative).pvalue)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test
    procedure"), in the order given: the i-th smallest p times (m - i + 1), capped at 1 and made
    non-decreasing along the sorted order. Rejecting where the adjusted p < alpha controls the
    family-wise error rate at alpha. (Written here: scipy.stats offers only false-discovery
    control, and statsmodels would be a large dependency for these few lines.)"""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted


def t_test_power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the one-sided paired t-test at `alpha` with n pairs when the true mean difference
    is `effect` and the differences' SD is `sd`: P(T' > t_{1-alpha, n-1}) for T' noncentral t with
    n-1 degrees of freedom and noncentrality effect * sqrt(n) / sd (scipy.stats.nct)."""
    if n < 2 or sd <= 0:
        raise ValueError(f"power needs n >= 2 and sd > 0, got n={n}, sd={sd}")
    crit = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(crit, n - 1, effect * math.sqrt(n) / sd))


def min_detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.80) -> float:
    """The smallest true mean difference that the one-sided paired t-test at `alpha` with n pairs
    detects with probability `power`, given the differences' SD (scipy.optimize.brentq on
    `t_test_power`)."""
    if sd <= 0:
        raise ValueError(f"sd must be > 0, got {sd}")
    gap = lambda d: t_test_power(d, sd, n, alpha) - power
    hi = sd
    while gap(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-12 * sd))


def pairs_needed(sd: float, effect: float, alpha: float = 0.05, power: float = 0.80,
                 most: int = 200) -> Optional[int]:
    """The fewest seed pairs whose one-sided paired t-test detects `effect` with `power`, given the
    differences' SD (None when `most` pairs are not enough, or effect or sd is not positive)."""
    if effect <= 0 or sd <= 0:
        return None
    for n in range(2, most + 1):
        if t_test_power(effect, sd, n, alpha) >= power:
            return n
    return None


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95) -> Summary:
    """Summary of a[s] - b[s] over the seeds s present in both `a` and `b` (metric by seed), with
    the paired Student-t interval of the mean difference.

    Pairing by seed (same seed = same data order and initial draw) removes the variance both arms
    share; seeds present in only one mapping are left out.
    """
    common = sorted(set(a) & set(b))
    return summarize([a[s] - b[s] for s in common], level=level)


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test p-value of `wins` against `losses` under Binomial(wins + losses, 1/2).

    p = min(1, 2 * P(X >= max(wins, losses))) (Conover 1999, sec. 3.4); ties are excluded by the
    caller. 1.0 when wins + losses == 0 (no evidence either way).
    """
    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be >= 0, got {wins}, {losses}")
    n = wins + losses
    if n == 0:
        return 1.0
    k = max(wins, losses)
    # Exact rational arithmetic: no rounding in the tail sum, however many pairs.
    tail = Fraction(sum(math.comb(n, i) for i in range(k, n + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))


def tost_paired(diffs: Sequence[float], margin: float) -> float:
    """p-value of the paired two one-sided tests (TOST; Schuirmann 1987) that the mean of `diffs`
    lies inside (-margin, +margin): the larger of the one-sided t-tests of mean > -margin and of
    mean < +margin (scipy.stats.ttest_1samp). Equivalence at alpha when p < alpha, which is the
    (1 - 2 alpha) paired-t interval lying inside the margin. All-equal differences have no spread:
    p is 0 when they lie inside the margin, 1 otherwise."""
    x = _as_finite_array(diffs)
    if x.size < 2:
        raise ValueError(f"a paired TOST needs at least 2 pairs, got {x.size}")
    if not margin > 0:
        raise ValueError(f"the equivalence margin must be > 0, got {margin}")
    if np.all(x == x[0]):
        return 0.0 if abs(float(x[0])) < margin else 1.0
    above_low = stats.ttest_1samp(x, -margin, alternative="greater").pvalue
    below_high = stats.ttest_1samp(x, margin, alternative="less").pvalue
    return float(max(above_low, below_high))


def variance_ratio_test(a: Sequence[float], b: Sequence[float]) -> float:
    """p-value of the one-sided F-test that `a` varies less than `b`: F = var(b) / var(a) (sample
    variances, ddof=1) against F(n_b - 1, n_a - 1) (scipy.stats.f). It assumes normal values and
    is unpaired. (Written here: scipy.stats offers the distribution, not this test.) A spread of 0
    in `a` against a positive one in `b` gives p = 0; no spread in either gives p = 1."""
    x, y = _as_finite_array(a), _as_finite_array(b)
    if x.size < 2 or y.size < 2:
        raise ValueError(f"an F-test needs at least 2 values per group, got {x.size} and {y.size}")
    var_a, var_b = float(x.var(ddof=1)), float(y.var(ddof=1))
    if var_a == 0:
        return 0.0 if var_b > 0 else 1.0
    return float(stats.f.sf(var_b / var_a, y.size - 1, x.size - 1))


def detectable_variance_ratio(n_a: int, n_b: int, alpha: float = 0.05, power: float = 0.80) -> float:
    """The smallest true ratio var(b) / var(a) that `variance_ratio_test` detects at `alpha` with
    probability `power`: F / ratio follows F(n_b - 1, n_a - 1), so the ratio is the test's critical
    value over that distribution's (1 - power) quantile."""
    if n_a < 2 or n_b < 2:
        raise ValueError(f"needs at least 2 values per group, got {n_a} and {n_b}")
    critical = stats.f.ppf(1 - alpha, n_b - 1, n_a - 1)
    return float(critical / stats.f.ppf(1 - power, n_b - 1, n_a - 1))


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


# --------------------------------------------------------------------------- records and claims


@dataclass(frozen=True)
class Record:
    """One trained cell: one seed of one arm, its final status and its metrics."""

    arm: dict[str, str]  # the arm's axes, e.g. {"method": "admin", "warmup": "none"} (everything except the seed)
    seed: int
    status: str  # one of STATUSES
    metrics: dict[str, float | None] = field(default_factory=dict)


Selected = str | tuple[str, ...]  # one selector value: the arm's value, or any of several


@dataclass(frozen=True)
class Claim:
    """A paper's claim, pre-registered: which arms it compares, how, and on which metric."""

    id: str
    text: str  # the paper's claim in words, with its source (table/figure)
    kind: str  # one of KINDS
    a: dict[str, Selected]  # selector of arm A (subset match on Record.arm)
    b: dict[str, Selected] | None = None  # selector of arm B (TWO_ARM_KINDS)
    metric: str = "bleu"  # "better", "same_best": the metric compared
    higher_is_better: bool = True
    over: str | None = None  # "same_best": the setting whose best value is compared (e.g. optim.lr)
    across: str | None = None  # "same_best": the axis it must transfer across (e.g. model.layers)
    added: str | None = None  # when and why, for a claim not written before every run of its arms
    min_bleu: float | None = None  # "trains"/"fails_to_train": an "ok" cell below this BLEU is not trained
    bleu_metric: str = "bleu"  # the metric min_bleu reads: "bleu" (averaged checkpoints) or "bleu_last"
    # "better": the effect the paper reports, in the metric's units, positive = A better (e.g.
    # 28.58 - 28.26 = 0.32 BLEU); rule book v2 compares it with the minimum detectable effect
    paper_effect: float | None = None
    margin: float | None = None  # "matches": the equivalence margin, in the metric's units


@dataclass(frozen=True)
class Verdict:
    """The verdict on one claim, with one line of what was measured and the numbers behind it."""

    claim: Claim
    verdict: str  # "reproduced" | "not reproduced" | "inconclusive" | "not run"
    measured: str
    details: dict = field(default_factory=dict)


def _selector_value(v: Any) -> str:
    # YAML reads `true` as a bool and `6` as an int; arms record axes as strings.
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _selector(d: Any, what: str) -> dict[str, Selected]:
    if not isinstance(d, Mapping):
        raise ValueError(f"claim {what} must be a mapping of axis to value, got {d!r}")
    out: dict[str, Selected] = {}
    for k, v in d.items():
        if isinstance(v, Sequence) and not isinstance(v, str):
            if not v or any(isinstance(x, (Mapping, list, tuple)) for x in v):
                raise ValueError(f"claim {what}: {k} must be a value or a non-empty list of values, got {v!r}")
            out[str(k)] = tuple(_selector_value(x) for x in v)
        else:
            out[str(k)] = _selector_value(v)
    return out


_CLAIM_KEYS = ("id", "text", "kind", "a", "b", "metric", "higher_is_better", "over", "across",
               "added", "min_bleu", "bleu_metric", "paper_effect", "margin")
BLEU_METRICS = ("bleu", "bleu_last")  # what min_bleu can read


def claim_from_dict(d: Mapping) -> Claim:
    """A `Claim` from a YAML mapping with the same keys as its fields.

    Raises ValueError naming an unknown kind, an unknown key (a typo would otherwise silently
    change the claim), a missing required key, or a missing `b` for kinds that compare two arms.
    """
    unknown = sorted(set(d) - set(_CLAIM_KEYS))
    if unknown:
        raise ValueError(f"claim {d.get('id', '?')!r}: unknown key(s) {unknown}; known: {list(_CLAIM_KEYS)}")
    missing = [k for k in ("id", "text", "kind", "a") if k not in d]
    if missing:
        raise ValueError(f"claim {d.get('id', '?')!r}: missing key(s) {missing}")
    kind = str(d["kind"])
    if kind not in KINDS:
        raise ValueError(f"claim {d['id']!r}: unknown kind {kind!r}; known: {list(KINDS)}")
    b = d.get("b")
    if kind in TWO_ARM_KINDS and b is None:
        raise ValueError(f"claim {d['id']!r}: kind {kind!r} needs a selector b")
    if kind == "same_best" and not (d.get("over") and d.get("across")):
        raise ValueError(f"claim {d['id']!r}: kind 'same_best' needs `over` and `across` axes")
    min_bleu = d.get("min_bleu")
    if min_bleu is not None:
        if kind not in ("trains", "fails_to_train"):
            raise ValueError(f"claim {d['id']!r}: min_bleu applies to kinds 'trains' and 'fails_to_train' only, "
                             f"not {kind!r}")
        if isinstance(min_bleu, bool) or not isinstance(min_bleu, (int, float)) or not 0 <= min_bleu <= 100:
            raise ValueError(f"claim {d['id']!r}: min_bleu must be a number from 0 to 100, got {min_bleu!r}")
    bleu_metric = str(d.get("bleu_metric", "bleu"))
    if "bleu_metric" in d and min_bleu is None:
        raise ValueError(f"claim {d['id']!r}: bleu_metric names the metric that min_bleu reads; set min_bleu too")
    if bleu_metric not in BLEU_METRICS:
        raise ValueError(f"claim {d['id']!r}: bleu_metric must be one of {list(BLEU_METRICS)}, got {bleu_metric!r}")
    if str(d.get("metric", "bleu")) not in METRICS:
        raise ValueError(f"claim {d['id']!r}: metric must be one of {list(METRICS)}, got {d.get('metric')!r}")
    paper_effect = d.get("paper_effect")
    if paper_effect is not None:
        if kind not in ("better", "less_spread"):
            raise ValueError(f"claim {d['id']!r}: paper_effect applies to kinds 'better' and 'less_spread' "
                             f"only, not {kind!r}")
        if isinstance(paper_effect, bool) or not isinstance(paper_effect, (int, float)) or paper_effect <= 0:
            raise ValueError(f"claim {d['id']!r}: paper_effect must be a positive number (the paper's "
                             f"difference, A better; for less_spread the ratio var(B) / var(A)), got {paper_effect!r}")
        if kind == "less_spread" and paper_effect <= 1:
            raise ValueError(f"claim {d['id']!r}: a less_spread paper_effect is a variance ratio var(B) / var(A) "
                             f"above 1, got {paper_effect!r}")
    margin = d.get("margin")
    if (margin is None) != (kind != "matches"):
        raise ValueError(f"claim {d['id']!r}: " + ("kind 'matches' needs a margin (the equivalence margin in "
                                                   "the metric's units)" if margin is None
                                                   else f"margin applies to kind 'matches' only, not {kind!r}"))
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin <= 0):
        raise ValueError(f"claim {d['id']!r}: margin must be a positive number, got {margin!r}")
    higher = d.get("higher_is_better", True)
    if not isinstance(higher, bool):
        raise ValueError(f"claim {d['id']!r}: higher_is_better must be true or false, got {higher!r}")
    return Claim(id=str(d["id"]), text=str(d["text"]), kind=kind, a=_selector(d["a"], "a"),
                 b=None if b is None else _selector(b, "b"), metric=str(d.get("metric", "bleu")),
                 higher_is_better=higher,
                 over=None if d.get("over") is None else str(d["over"]),
                 across=None if d.get("across") is None else str(d["across"]),
                 added=None if d.get("added") is None else str(d["added"]),
                 min_bleu=None if min_bleu is None else float(min_bleu), bleu_metric=bleu_metric,
                 paper_effect=None if paper_effect is None else float(paper_effect),
                 margin=None if margin is None else float(margin))


# --------------------------------------------------------------------------- judging


def selector_matches(arm: Mapping[str, Any], selector: Mapping[str, Selected]) -> bool:
    """Whether an arm has every key of `selector` with its value (or one of its values, for a list)."""
    def one(actual: str, wanted: Selected | list[str]) -> bool:
        return actual in wanted if isinstance(wanted, (tuple, list)) else actual == wanted
    return all(k in arm and one(str(arm[k]), v) for k, v in selector.items())


def _select(records: Sequence[Record], selector: Mapping[str, Selected]) -> list[Record]:
    """The non-failed records whose arm matches `selector` (failed cells are not evidence)."""
    return [r for r in records if r.status != "failed" and selector_matches(r.arm, selector)]


def _label(selector: Mapping[str, Selected]) -> str:
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
    measured = f"{k} of {n} {_unit(a)} diverged ({_label(claim.a)})"
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
        counts = {s: sum(r.status == s for r in a) for s in NOT_TRAINED}
        words = _count_words(a, NOT_TRAINED)
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
    measured = f"{n - bad} of {n} {_unit(a)} trained ({_label(claim.a)}; {words})"
    return Verdict(claim, verdict, measured, {"n": n, "trained": n - bad, **counts})


def _judge_fails_to_train(claim: Claim, a: Sequence[Record], book: RuleBook) -> Verdict:
    n = len(a)
    bad, counts, words = _not_trained(claim, a, book)
    verdict = "reproduced" if bad == n else "not reproduced" if bad == 0 else "inconclusive"
    measured = f"{bad} of {n} {_unit(a)} failed to train ({_label(claim.a)}; {words})"
    return Verdict(claim, verdict, measured, {"n": n, "failed": bad, **counts})


def _bad_statuses(book: RuleBook) -> tuple[str, ...]:
    """What does not count as trained in a comparison: v1 diverged or stalled; v2 every way of not
    training (collapsed and below the BLEU bar too)."""
    return NOT_TRAINED if book.version >= 2 else FAILED_TO_TRAIN


def _judge_more_failed(claim: Claim, a: Sequence[Record], b: Sequence[Record],
                       failed: tuple[str, ...] = ("diverged",)) -> Verdict:
    """"more_diverged" (failed = diverged) and "more_failed" (every way of not training)."""
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
    elif wins > losses and p < _ALPHA:
        verdict = "reproduced"
    elif wins <= losses:
        verdict = "not reproduced"
    else:
        verdict = "inconclusive"
    measured = (f"{_label(claim.a)} {what} in {a_div} of {len(a)} cells, {_label(claim.b or {})} in "
                f"{b_div} of {len(b)}; over {len(pairs)} paired cells only A {what} in {wins}, only B in "
                f"{losses} (sign test p={p:.3g})")
    return Verdict(claim, verdict, measured, details)


def _ok_diffs(claim: Claim, pairs: Sequence[tuple[Record, Record]]) -> list[tuple[int, float]]:
    """(seed, A - B) of the claim's metric over the pairs where both cells are ok with a finite
    value, signed so that positive means A better."""
    sign = 1.0 if claim.higher_is_better else -1.0
    diffs = []
    for ra, rb in pairs:
        va, vb = ra.metrics.get(claim.metric), rb.metrics.get(claim.metric)
        if ra.status != "ok" or rb.status != "ok" or va is None or vb is None:
            continue
        if not (math.isfinite(va) and math.isfinite(vb)):
            continue
        diffs.append((ra.seed, sign * (float(va) - float(vb))))
    return diffs


def _bad_cells(claim: Claim, a: Sequence[Record], b: Sequence[Record], book: RuleBook
               ) -> tuple[list[tuple[Record, Record]], dict[str, Any], str, Optional[str]]:
    """The seed pairs of a two-arm comparison, its details, a line counting the cells of each arm
    that did not train, and the verdict those settle alone ("reproduced" when only B has such cells,
    "not reproduced" when A has more; None when the metric must decide)."""
    pairs, info = _pair(claim, a, b)
    bad = _bad_statuses(book)
    a_bad = sum(ra.status in bad for ra, _ in pairs)
    b_bad = sum(rb.status in bad for _, rb in pairs)
    la, lb = _label(claim.a), _label(claim.b or {})
    details: dict[str, Any] = {"a_n": len(a), "a_bad": a_bad, "b_n": len(b), "b_bad": b_bad, **info}
    line = (f"{'/'.join(s.replace('_', ' ') for s in bad)}: {la} {a_bad} of {len(pairs)}, "
            f"{lb} {b_bad} of {len(pairs)}")
    settled = ("reproduced" if b_bad > a_bad == 0 else "not reproduced" if a_bad > b_bad else None)
    return pairs, details, line, settled


def _judge_matches(claim: Claim, a: Sequence[Record], b: Sequence[Record], book: RuleBook) -> Verdict:
    """Equivalence of A and B within the claim's margin (rule book v2, paired TOST)."""
    pairs, details, bad_line, settled = _bad_cells(claim, a, b, book)
    if settled is not None:
        # one arm fails to train where the other trains: they do not match
        return Verdict(claim, "not reproduced", bad_line, details)
    diffs = _ok_diffs(claim, pairs)
    la, lb = _label(claim.a), _label(claim.b or {})
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
    la, lb = _label(claim.a), _label(claim.b or {})

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
    return ", ".join(f"seed {seed} {_signed(d)}" for seed, d in diffs)


def _judge_better(claim: Claim, a: Sequence[Record], b: Sequence[Record], book: RuleBook) -> Verdict:
    # Bad cells are counted over the seed-matched pairs only, so that a seed one arm lacks cannot
    # tip the verdict (with the same seeds in both arms this is every cell).
    pairs, info = _pair(claim, a, b)
    bad = _bad_statuses(book)
    a_bad = sum(ra.status in bad for ra, _ in pairs)
    b_bad = sum(rb.status in bad for _, rb in pairs)
    la, lb = _label(claim.a), _label(claim.b or {})
    details: dict[str, Any] = {"a_n": len(a), "a_bad": a_bad, "b_n": len(b), "b_bad": b_bad, **info}
    what = "/".join(s.replace("_", " ") for s in bad)
    bad_line = f"{what}: {la} {a_bad} of {len(pairs)}, {lb} {b_bad} of {len(pairs)}"
    unpaired = info["unpaired_a"] + info["unpaired_b"]
    if unpaired:
        bad_line += (f" paired cells ({info['unpaired_a']} of {la} and {info['unpaired_b']} of {lb} "
                     "without a partner left out)")
    if a_bad or b_bad:
        if b_bad > a_bad and a_bad == 0:
            return Verdict(claim, "reproduced", bad_line, details)
        if a_bad > b_bad:
            return Verdict(claim, "not reproduced", bad_line, details)

    diffs = _ok_diffs(claim, pairs)
    details["paired"] = len(diffs)
    # Written so that a positive number always means "A better".
    head = f"{la} - {lb}" if claim.higher_is_better else f"{lb} - {la}"
    suffix = "" if not (a_bad or b_bad) else f" ({bad_line})"
    if len(diffs) < 2:
        measured = f"{claim.metric}: only {len(diffs)} paired ok seed(s) with the metric, need 2{suffix}"
        return Verdict(claim, "inconclusive", measured, details)
    values = [d for _, d in diffs]
    favour = sum(d > 0 for d in values)
    lower = "" if claim.higher_is_better else ", lower is better"
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
    p = paired_t_test(values)
    details.update({"mean_diff": s.mean, "std_diff": s.std, "ci_low": s.ci_low, "ci_high": s.ci_high,
                    "level": book.level, "higher_is_better": claim.higher_is_better, "p": p,
                    "pairs_favouring_a": favour, "diffs": {str(seed): d for seed, d in diffs}})
    mde = min_detectable_effect(s.std, s.n, book.alpha, book.power) if s.std > 0 else 0.0
    details["mde"] = mde
    power_words = f"detectable at {book.power:.0%} power: {_signed(mde).lstrip('+')}"
    if claim.paper_effect is not None:
        needed = pairs_needed(s.std, claim.paper_effect, book.alpha, book.power) if s.std > 0 else s.n
        details.update({"paper_effect": claim.paper_effect, "pairs_needed": needed})
        power_words += (f"; paper's effect {_signed(claim.paper_effect).lstrip('+')} needs "
                        + (f"{needed} seeds" if needed is not None else "more than 200 seeds"))
    # the verdict before the family's Holm correction (judge_all finishes it)
    verdict = _better_verdict(details, p, book)
    measured = (f"{head} {claim.metric} {_signed(s.mean)} [95% paired t {_signed(s.ci_low)}, {_signed(s.ci_high)}] "
                f"over {s.n} paired seeds{lower} ({_seed_pairs(diffs)}); one-sided p={p:.3g}; "
                f"{power_words}{suffix}")
    return Verdict(claim, verdict, measured, details)


def _better_verdict(details: Mapping[str, Any], p_adjusted: float, book: RuleBook) -> str:
    """Rule book v2's "better" verdict from the (Holm-adjusted) p and the interval and power."""
    if p_adjusted < book.alpha:
        return "reproduced"
    if details["ci_high"] < 0:
        return "not reproduced"
    effect = details.get("paper_effect")
    if effect is not None and effect < details["mde"]:
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


def judge(claim: Claim, records: Sequence[Record], book: RuleBook | int | None = None) -> Verdict:
    """The verdict on `claim` from `records` under rule book `book` (default: the current one).

    The records' statuses must already carry the book's outcomes (runner/tables/rulebook.py `outcome`).
    A "better" claim judged alone is its own family; `judge_all` corrects a table's family."""
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
    empty = [_label(sel) for sel, recs in arms if not recs]
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
        return _judge_more_failed(claim, a, b)
    if claim.kind == "more_failed":
        return _judge_more_failed(claim, a, b, failed=_bad_statuses(book))
    if claim.kind == "matches":
        return _judge_matches(claim, a, b, book)
    if claim.kind == "less_spread":
        return _judge_less_spread(claim, a, b, book)
    return _judge_better(claim, a, b, book)


def family_of(claim: Claim) -> str:
    """The family a "better" claim's test belongs to: the table's comparisons against one baseline
    arm (its `b` selector)."""
    return _label(claim.b or {})


def judge_all(claims: Sequence[Claim], records: Sequence[Record], book: RuleBook | int | None = None
              ) -> list[Verdict]:
    """Every claim of one table judged under `book`; in rule book v2 the "better" claims tested
    against the same baseline arm are one family whose p-values are Holm-corrected."""
    book = rulebook(CURRENT if book is None else book) if not isinstance(book, RuleBook) else book
    out = [judge(c, records, book) for c in claims]
    if book.better_test != "paired_t_holm":
        return out
    families: dict[str, list[int]] = {}
    for i, v in enumerate(out):
        if v.claim.kind == "better" and "p" in v.details:
            families.setdefault(family_of(v.claim), []).append(i)
    for members in families.values():
        adjusted = holm([out[i].details["p"] for i in members])
        for i, p_adj in zip(members, adjusted):
            v = out[i]
            details = {**v.details, "p_holm": p_adj, "family_size": len(members)}
            measured = v.measured
            if len(members) > 1:
                measured = measured.replace(f"one-sided p={v.details['p']:.3g}",
                                            f"one-sided p={v.details['p']:.3g}, Holm over {len(members)}: {p_adj:.3g}")
            out[i] = Verdict(v.claim, _better_verdict(details, p_adj, book), measured, details)
    return out
