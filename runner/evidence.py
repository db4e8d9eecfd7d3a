"""Statistics over seeds and pre-registered claim verdicts for reproduction tables.

Each trained cell (one seed of one arm) is a `Record`; a paper's claim is a `Claim` (written in a
YAML file before the runs, hence "pre-registered"); `judge` turns a claim and the records into a
`Verdict`: "reproduced", "not reproduced", "inconclusive" or "not run", with one line of numbers
saying what was measured. The rules below are fixed in advance so that a verdict cannot be chosen
after seeing the numbers.

Statistics
    Mean, sample standard deviation (ddof=1) and a 95% percentile-bootstrap confidence interval of
    the mean (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 13): the seeds are
    resampled with replacement `resamples` times with `numpy.random.default_rng(seed)`, so a
    table is reproducible bit for bit. With fewer than 2 values no spread can be estimated and the
    std and CI are None. Differences between arms are paired by seed (the same seed gives the same
    data order and the same initial draw), which removes the seed-to-seed variance both arms share.
    Counts of discordant pairs use the exact two-sided sign test (Conover 1999, *Practical
    Nonparametric Statistics*, 3rd ed., sec. 3.4), which on diverged/not-diverged pairs is McNemar's
    exact test (McNemar 1947).

Decision rules (`judge`)
    Selectors: a claim's `a` and `b` select records whose arm contains every key/value of the
    selector (subset match); a list value matches any of its values (e.g. `optim.lr: [0.001,
    0.002]` keeps a claim to the part of a grid it was written for). A record matching both
    selectors is an error (ill-formed claim).

    0. Records with status "failed" (a crash) are ignored: they are not evidence. If an arm then
       has no record, the verdict is "not run".

    "diverges" (A diverges): reproduced when every cell of A diverged (status "diverged"); not
       reproduced when none did; inconclusive otherwise. Measured: "k of n seeds diverged".

    "trains" (A trains, i.e. neither diverges nor stalls): reproduced when no cell of A diverged or
       stalled; not reproduced when every cell did; inconclusive otherwise.

    "fails_to_train" (A fails: every cell diverged or stalled; the complement of "trains", for a
       paper whose "failed" does not say whether the loss blew up or plateaued): reproduced when
       every cell of A diverged or stalled; not reproduced when none did; inconclusive otherwise.

    `min_bleu` ("trains" and "fails_to_train" only; optional): the lowest final BLEU (tok) at which
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
          other arm is not evidence either way. If any paired cell of A or B diverged or stalled
          ("bad"): reproduced when B has more bad cells than A and A has none; not reproduced when
          A has more bad cells than B; otherwise go on.
       2. Keep the pairs where both cells are "ok" and both have the metric. With >= 2 pairs,
          the paired difference A - B (B - A when lower is better, so that positive always means
          A better) is summarized: reproduced when the CI's low end > 0, not reproduced when its
          high end < 0, inconclusive when the CI contains 0. With fewer than 2 pairs: inconclusive.
       Measured: the mean difference with its CI and the number of paired seeds, and, as context
       that no verdict uses, how many pairs favour A (named by its selector) and Student's t interval of the mean
       difference. With 3 seeds the percentile bootstrap's 2.5% quantile is the smallest paired
       difference (a resample of three copies of it has probability 1/27 > 2.5%), so "reproduced"
       means that every seed favours A; the t interval is wider.

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
       one with fewer than two `across` values.

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
from typing import Any, Mapping, Sequence

import numpy as np

STATUSES = ("ok", "diverged", "stalled", "failed")
KINDS = ("better", "diverges", "trains", "fails_to_train", "more_diverged", "more_failed", "same_best")
TWO_ARM_KINDS = ("better", "more_diverged", "more_failed")
METRIC_KINDS = ("better", "same_best")  # the kinds that compare `metric`
# what a claim's `metric` can name: the metrics each Record carries (runner/suite.py)
METRICS = ("bleu", "sacrebleu", "best_valid_loss", "bleu_last")
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not run")

# Fixed for every verdict: changing them after the runs would be choosing the answer.
_LEVEL = 0.95
_RESAMPLES = 10000
_SEED = 0
_ALPHA = 0.05


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Summary:
    """One metric over seeds: count, mean, sample std (ddof=1) and percentile-bootstrap CI of the mean."""

    n: int
    mean: float | None
    std: float | None  # sample std, ddof=1; None when n < 2
    ci_low: float | None  # percentile-bootstrap CI of the mean; None when n < 2
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
                      seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of `values` (Efron & Tibshirani 1993, ch. 13).

    Draws `resamples` samples of len(values) with replacement using numpy.random.default_rng(seed),
    takes each one's mean, and returns the (1-level)/2 and (1+level)/2 quantiles of those means.
    Deterministic for a fixed seed. Needs at least 2 finite values.
    """
    x = _as_finite_array(values)
    _check_level(level)
    if x.size < 2:
        raise ValueError(f"a bootstrap CI needs at least 2 values, got {x.size}")
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


def summarize(values: Sequence[float], level: float = 0.95, resamples: int = 10000, seed: int = 0) -> Summary:
    """Summary of `values` (one metric over seeds): n, mean, sample std (ddof=1) and bootstrap CI of the mean.

    std and the CI are None when n < 2; mean is None when n == 0.
    """
    x = _as_finite_array(values)
    n = int(x.size)
    if n == 0:
        return Summary(n=0, mean=None, std=None, ci_low=None, ci_high=None)
    mean = float(x.mean())
    if n < 2:
        return Summary(n=n, mean=mean, std=None, ci_low=None, ci_high=None)
    lo, hi = bootstrap_mean_ci(x, level=level, resamples=resamples, seed=seed)
    return Summary(n=n, mean=mean, std=float(x.std(ddof=1)), ci_low=lo, ci_high=hi)


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 < p <= 0.995) of Student's t with `df` degrees of freedom: bisection on
    its CDF, whose integral from 0 is taken by Simpson's rule on the density (written here because
    the project does not depend on scipy for this one number). Accurate to about 1e-6 for
    p <= 0.975 and 1e-4 at 0.995 (df >= 1); further in the tail the fixed grid is too coarse."""
    if not 0.5 < p <= 0.995 or df < 1:
        raise ValueError(f"expected 0.5 < p <= 0.995 and df >= 1, got p={p}, df={df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t: float, steps: int = 4000) -> float:
        h = t / steps
        f = [math.exp(log_c - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(steps + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def t_mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Student's t confidence interval of the mean: mean -/+ t_{(1+level)/2, n-1} * s / sqrt(n).
    Reported beside the bootstrap interval (never used by a verdict): with 2 or 3 seeds the
    percentile bootstrap's interval is close to the range of the values, much narrower than t's."""
    x = _as_finite_array(values)
    _check_level(level)
    if x.size < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {x.size}")
    half = student_t_quantile((1 + level) / 2, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return float(x.mean()) - half, float(x.mean()) + half


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95,
                      resamples: int = 10000, seed: int = 0) -> Summary:
    """Summary of a[s] - b[s] over the seeds s present in both `a` and `b` (metric by seed).

    Pairing by seed (same seed = same data order and initial draw) removes the variance both arms
    share; seeds present in only one mapping are left out. Seeds are taken in sorted order so the
    bootstrap does not depend on the mappings' insertion order.
    """
    common = sorted(set(a) & set(b))
    return summarize([a[s] - b[s] for s in common], level=level, resamples=resamples, seed=seed)


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


# --------------------------------------------------------------------------- records and claims


@dataclass(frozen=True)
class Record:
    """One trained cell: one seed of one arm, its final status and its metrics."""

    arm: dict[str, str]  # the arm's axes, e.g. {"method": "admin", "warmup": "none"} (everything except the seed)
    seed: int
    status: str  # ok | diverged | stalled | failed
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
               "added", "min_bleu", "bleu_metric")
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
    higher = d.get("higher_is_better", True)
    if not isinstance(higher, bool):
        raise ValueError(f"claim {d['id']!r}: higher_is_better must be true or false, got {higher!r}")
    return Claim(id=str(d["id"]), text=str(d["text"]), kind=kind, a=_selector(d["a"], "a"),
                 b=None if b is None else _selector(b, "b"), metric=str(d.get("metric", "bleu")),
                 higher_is_better=higher,
                 over=None if d.get("over") is None else str(d["over"]),
                 across=None if d.get("across") is None else str(d["across"]),
                 added=None if d.get("added") is None else str(d["added"]),
                 min_bleu=None if min_bleu is None else float(min_bleu), bleu_metric=bleu_metric)


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


def _fmt(x: float) -> str:
    return f"{x:+.2f}" if x == 0 or abs(x) >= 0.01 else f"{x:+.2e}"


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


def _judge_diverges(claim: Claim, a: Sequence[Record]) -> Verdict:
    n = len(a)
    k = sum(r.status == "diverged" for r in a)
    verdict = "reproduced" if k == n else "not reproduced" if k == 0 else "inconclusive"
    return Verdict(claim, verdict, f"{k} of {n} {_unit(a)} diverged ({_label(claim.a)})",
                   {"n": n, "diverged": k})


def _below_bleu_bar(claim: Claim, r: Record) -> bool:
    """An "ok" cell that misses the claim's BLEU bar (or has no BLEU) when the claim sets one."""
    if claim.min_bleu is None or r.status != "ok":
        return False
    bleu = r.metrics.get(claim.bleu_metric)
    return bleu is None or not math.isfinite(bleu) or bleu < claim.min_bleu


def _not_trained(claim: Claim, a: Sequence[Record]) -> tuple[int, dict[str, int], str]:
    """The cells of A that did not train: their number, the count per reason, and those in words."""
    counts = {"diverged": sum(r.status == "diverged" for r in a),
              "stalled": sum(r.status == "stalled" for r in a)}
    words = f"{counts['diverged']} diverged, {counts['stalled']} stalled"
    if claim.min_bleu is not None:
        counts["below_bleu_bar"] = sum(_below_bleu_bar(claim, r) for r in a)
        words += f", {counts['below_bleu_bar']} below {claim.min_bleu:g} BLEU"
        if claim.bleu_metric == "bleu_last":
            words += " of the last checkpoint"
    return sum(counts.values()), counts, words


def _judge_trains(claim: Claim, a: Sequence[Record]) -> Verdict:
    n = len(a)
    bad, counts, words = _not_trained(claim, a)
    verdict = "reproduced" if bad == 0 else "not reproduced" if bad == n else "inconclusive"
    measured = f"{n - bad} of {n} {_unit(a)} trained ({_label(claim.a)}; {words})"
    return Verdict(claim, verdict, measured, {"n": n, "trained": n - bad, **counts})


def _judge_fails_to_train(claim: Claim, a: Sequence[Record]) -> Verdict:
    n = len(a)
    bad, counts, words = _not_trained(claim, a)
    verdict = "reproduced" if bad == n else "not reproduced" if bad == 0 else "inconclusive"
    measured = f"{bad} of {n} {_unit(a)} failed to train ({_label(claim.a)}; {words})"
    return Verdict(claim, verdict, measured, {"n": n, "failed": bad, **counts})


def _judge_more_failed(claim: Claim, a: Sequence[Record], b: Sequence[Record],
                       failed: tuple[str, ...] = ("diverged",)) -> Verdict:
    """"more_diverged" (failed = diverged) and "more_failed" (diverged or stalled)."""
    pairs, info = _pair(claim, a, b)
    wins = sum(ra.status in failed and rb.status not in failed for ra, rb in pairs)
    losses = sum(rb.status in failed and ra.status not in failed for ra, rb in pairs)
    p = sign_test(wins, losses)
    a_div = sum(r.status in failed for r in a)
    b_div = sum(r.status in failed for r in b)
    what = " or ".join(failed)
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


def _judge_better(claim: Claim, a: Sequence[Record], b: Sequence[Record]) -> Verdict:
    # Bad cells are counted over the seed-matched pairs only, so that a seed one arm lacks cannot
    # tip the verdict (with the same seeds in both arms this is every cell).
    pairs, info = _pair(claim, a, b)
    bad = ("diverged", "stalled")
    a_bad = sum(ra.status in bad for ra, _ in pairs)
    b_bad = sum(rb.status in bad for _, rb in pairs)
    la, lb = _label(claim.a), _label(claim.b or {})
    details: dict[str, Any] = {"a_n": len(a), "a_bad": a_bad, "b_n": len(b), "b_bad": b_bad, **info}
    bad_line = f"diverged/stalled: {la} {a_bad} of {len(pairs)}, {lb} {b_bad} of {len(pairs)}"
    unpaired = info["unpaired_a"] + info["unpaired_b"]
    if unpaired:
        bad_line += (f" paired cells ({info['unpaired_a']} of {la} and {info['unpaired_b']} of {lb} "
                     "without a partner left out)")
    if a_bad or b_bad:
        if b_bad > a_bad and a_bad == 0:
            return Verdict(claim, "reproduced", bad_line, details)
        if a_bad > b_bad:
            return Verdict(claim, "not reproduced", bad_line, details)

    sign = 1.0 if claim.higher_is_better else -1.0
    diffs: list[float] = []
    for ra, rb in pairs:
        va, vb = ra.metrics.get(claim.metric), rb.metrics.get(claim.metric)
        if ra.status != "ok" or rb.status != "ok" or va is None or vb is None:
            continue
        if not (math.isfinite(va) and math.isfinite(vb)):
            continue
        diffs.append(sign * (float(va) - float(vb)))
    details["paired"] = len(diffs)
    # Written so that a positive number always means "A better".
    head = f"{la} - {lb}" if claim.higher_is_better else f"{lb} - {la}"
    suffix = "" if not (a_bad or b_bad) else f" ({bad_line})"
    if len(diffs) < 2:
        measured = f"{claim.metric}: only {len(diffs)} paired ok seed(s) with the metric, need 2{suffix}"
        return Verdict(claim, "inconclusive", measured, details)
    s = summarize(diffs, level=_LEVEL, resamples=_RESAMPLES, seed=_SEED)
    assert s.mean is not None and s.ci_low is not None and s.ci_high is not None
    details.update({"mean_diff": s.mean, "std_diff": s.std, "ci_low": s.ci_low, "ci_high": s.ci_high,
                    "level": _LEVEL, "higher_is_better": claim.higher_is_better})
    verdict = "reproduced" if s.ci_low > 0 else "not reproduced" if s.ci_high < 0 else "inconclusive"
    # context for the reader, not part of the rule: how many seeds favour A, and the t interval
    t_low, t_high = t_mean_ci(diffs, _LEVEL)
    favour = sum(d > 0 for d in diffs)
    details.update({"t_ci_low": t_low, "t_ci_high": t_high, "pairs_favouring_a": favour})
    lower = "" if claim.higher_is_better else ", lower is better"
    measured = (f"{head} {claim.metric} {_fmt(s.mean)} [{_LEVEL:.0%} CI {_fmt(s.ci_low)}, {_fmt(s.ci_high)}] "
                f"over {s.n} paired seeds{lower}; {favour} of {s.n} favour {la}; t interval "
                f"[{_fmt(t_low)}, {_fmt(t_high)}]{suffix}")
    return Verdict(claim, verdict, measured, details)


def numeric_order(value: str) -> tuple:
    """Sort key for a grid axis's values: numbers in numeric order (1e-3 < 2e-3 < 1e-2), then
    anything else by its text."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _judge_same_best(claim: Claim, a: Sequence[Record]) -> Verdict:
    means: dict[str, dict[str, list[float]]] = {}
    grid = sorted({r.arm.get(claim.over, "") for r in a}, key=numeric_order)
    for r in a:
        value = r.metrics.get(claim.metric)
        if r.status == "ok" and value is not None and math.isfinite(value):
            means.setdefault(r.arm.get(claim.across, ""), {}).setdefault(r.arm.get(claim.over, ""), []).append(value)
    best: dict[str, str] = {}
    # Context that no verdict uses: how far the best beats the runner-up (a reader weighs a best
    # that wins by 0.01 nats differently from one that wins by 0.1).
    runner_up: dict[str, tuple[str, float]] = {}
    for across, by_setting in sorted(means.items(), key=lambda kv: numeric_order(kv[0])):
        averaged = {k: sum(v) / len(v) for k, v in by_setting.items()}
        ranked = sorted(averaged, key=averaged.get, reverse=claim.higher_is_better)
        best[across] = ranked[0]
        if len(ranked) > 1:
            runner_up[across] = (ranked[1], abs(averaged[ranked[0]] - averaged[ranked[1]]))

    def won(across: str) -> str:
        if across not in runner_up:
            return ""
        second, margin = runner_up[across]
        return f" (by {margin:.3f} over {second})"

    measured = (f"best {claim.over} by {claim.across}: "
                + ", ".join(f"{k} -> {v}{won(k)}" for k, v in best.items())
                + f" ({claim.metric}, mean over ok seeds; grid {grid[0]} to {grid[-1]}, {len(grid)} values)")
    details = {"best": best, "grid": grid,
               "runner_up": {k: {"setting": v[0], "margin": v[1]} for k, v in runner_up.items()}}
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
    return Verdict(claim, verdict, measured, {**details, "spread_steps": spread, "at_edge": at_edge})


def judge(claim: Claim, records: Sequence[Record]) -> Verdict:
    """The verdict on `claim` from `records`, by the pre-registered rules in this module's docstring."""
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
        return _judge_same_best(claim, a)
    if claim.kind == "diverges":
        return _judge_diverges(claim, a)
    if claim.kind == "trains":
        return _judge_trains(claim, a)
    if claim.kind == "fails_to_train":
        return _judge_fails_to_train(claim, a)
    if claim.kind == "more_diverged":
        return _judge_more_failed(claim, a, b)
    if claim.kind == "more_failed":
        return _judge_more_failed(claim, a, b, failed=("diverged", "stalled"))
    return _judge_better(claim, a, b)
