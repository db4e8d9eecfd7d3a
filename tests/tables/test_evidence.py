"""runner/tables/evidence.py (with claims.py and statistics.py) under rule book v1 (kept to show old verdicts beside new): bootstrap CIs, sign
test, paired differences and every verdict branch of `judge`. Rule book v2 and the t-based
statistics: tests/tables/test_rulebook.py.

Expected values are computed here independently of the implementation (hand values, brute-force
enumeration, the statistics module), not by calling the code under test a second way.
"""
from __future__ import annotations

import functools
import itertools
import math
import statistics

import pytest
from scipy import stats

from runner.tables.claims import Claim, Record, claim_from_dict
from runner.tables.evidence import judge
from runner.tables.statistics import Summary, bootstrap_mean_ci, paired_difference, sign_test, summarize, t_mean_ci

judge_v1 = functools.partial(judge, book=1)

# --------------------------------------------------------------------------- statistics


def test_bootstrap_ci_of_a_constant_is_a_point():
    assert bootstrap_mean_ci([0.1, 0.1, 0.1, 0.1], min_values=2) == (0.1, 0.1)
    s = summarize([2.5, 2.5, 2.5])
    assert s == Summary(n=3, mean=2.5, std=0.0, ci_low=2.5, ci_high=2.5)


def test_bootstrap_ci_of_one_to_five_contains_the_mean_and_is_deterministic():
    lo, hi = bootstrap_mean_ci([1, 2, 3, 4, 5], seed=7, min_values=2)
    assert 1 <= lo < 3 < hi <= 5
    assert bootstrap_mean_ci([1, 2, 3, 4, 5], seed=7, min_values=2) == (lo, hi)


def _enumerated_quantile(values, q):
    """Quantile q of the exact bootstrap distribution of the mean: all n**n resamples, equal weight."""
    n = len(values)
    means = sorted(sum(c) / n for c in itertools.product(values, repeat=n))
    # Inverted CDF: the smallest mean whose cumulative weight reaches q. q must not sit on a step
    # (k / n**n), where the Monte Carlo quantile could land on either neighbouring atom.
    k = q * len(means)
    assert abs(k - round(k)) > 0.3, "q too close to a step of the exact CDF"
    return means[math.ceil(k) - 1]


@pytest.mark.parametrize("level", [0.95, 0.6])
def test_bootstrap_ci_matches_brute_force_enumeration(level):
    values = [0.0, 1.0, 5.0]
    alpha = 1 - level
    expected = (_enumerated_quantile(values, alpha / 2), _enumerated_quantile(values, 1 - alpha / 2))
    lo, hi = bootstrap_mean_ci(values, level=level, resamples=20000, seed=0, min_values=2)
    assert lo == pytest.approx(expected[0], abs=0.05)
    assert hi == pytest.approx(expected[1], abs=0.05)


def test_bootstrap_rejects_too_few_or_non_finite_values():
    with pytest.raises(ValueError, match="at least 10"):  # below 10 values it is close to the range
        bootstrap_mean_ci([1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        bootstrap_mean_ci([1.0], min_values=1)
    with pytest.raises(ValueError):
        bootstrap_mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError):
        bootstrap_mean_ci([1.0, 2.0], level=1.0)


def test_summarize_std_is_sample_std_and_small_n_has_no_spread():
    values = [31.2, 33.0, 32.1, 30.5]
    s = summarize(values)
    assert s.n == 4
    assert s.mean == pytest.approx(statistics.fmean(values))
    assert s.std == pytest.approx(statistics.stdev(values))  # ddof=1
    # Student t: mean -/+ t(0.975, 3) s / 2, t(0.975, 3) = 3.182 from a printed table
    half = 3.182446 * statistics.stdev(values) / 2
    assert (s.ci_low, s.ci_high) == pytest.approx((s.mean - half, s.mean + half), abs=1e-5)
    assert summarize([4.0]) == Summary(n=1, mean=4.0, std=None, ci_low=None, ci_high=None)
    assert summarize([]) == Summary(n=0, mean=None, std=None, ci_low=None, ci_high=None)


def test_sign_test_hand_values():
    assert sign_test(8, 0) == pytest.approx(2 * 0.5**8)  # 0.0078125
    assert sign_test(0, 8) == pytest.approx(0.0078125)
    assert sign_test(5, 5) == 1.0
    assert sign_test(7, 1) == pytest.approx(2 * (math.comb(8, 7) + math.comb(8, 8)) / 2**8)  # 0.0703125
    assert sign_test(7, 1) == pytest.approx(0.0703125)
    assert sign_test(0, 0) == 1.0
    assert sign_test(1, 0) == 1.0  # 2 * 0.5 = 1
    for wins, losses in ((9, 2), (3, 0), (12, 20)):  # and scipy's exact binomial test
        assert sign_test(wins, losses) == pytest.approx(stats.binomtest(wins, wins + losses, 0.5).pvalue, rel=1e-12)


def test_paired_difference_uses_only_common_seeds():
    a = {0: 10.0, 1: 12.0, 2: 13.0}
    b = {1: 11.0, 2: 11.0, 3: -100.0}
    s = paired_difference(a, b)
    assert s.n == 2
    assert s.mean == pytest.approx(((12 - 11) + (13 - 11)) / 2)
    assert s.std == pytest.approx(statistics.stdev([1.0, 2.0]))
    # Two values: the paired t interval is mean -/+ 12.706 * s / sqrt(2), t(0.975, 1) = 12.706
    half = 12.706205 * statistics.stdev([1.0, 2.0]) / math.sqrt(2)
    assert (s.ci_low, s.ci_high) == pytest.approx((1.5 - half, 1.5 + half), abs=1e-5)
    # Insertion order does not matter: seeds are paired, then taken in sorted order.
    assert paired_difference(dict(reversed(list(a.items()))), b) == s


# --------------------------------------------------------------------------- claims


def test_claim_from_dict_normalizes_selectors_and_rejects_unknown_kind():
    c = claim_from_dict({"id": "c1", "text": "Admin beats Pre-LN (Table 2)", "kind": "better",
                         "a": {"method": "admin", "layers": 18}, "b": {"method": "preln", "tied": True},
                         "metric": "best_valid_loss", "higher_is_better": False})
    assert c == Claim(id="c1", text="Admin beats Pre-LN (Table 2)", kind="better",
                      a={"method": "admin", "layers": "18"}, b={"method": "preln", "tied": "true"},
                      metric="best_valid_loss", higher_is_better=False)
    with pytest.raises(ValueError, match="explodes"):
        claim_from_dict({"id": "c2", "text": "t", "kind": "explodes", "a": {"method": "postln"}})
    with pytest.raises(ValueError, match="metrc"):
        claim_from_dict({"id": "c3", "text": "t", "kind": "trains", "a": {}, "metrc": "bleu"})
    with pytest.raises(ValueError, match="selector b"):
        claim_from_dict({"id": "c4", "text": "t", "kind": "better", "a": {"method": "admin"}})


# --------------------------------------------------------------------------- judge


def _recs(arm, statuses, metric=None, seeds=None, name="bleu"):
    """Records of one arm, one per status; metric values per seed (None for non-ok cells)."""
    seeds = list(range(len(statuses))) if seeds is None else seeds
    out = []
    for i, (seed, status) in enumerate(zip(seeds, statuses)):
        value = None if metric is None else metric[i]
        out.append(Record(arm=dict(arm), seed=seed, status=status, metrics={name: value}))
    return out


POSTLN = {"method": "postln", "warmup": "none"}


@pytest.mark.parametrize("statuses, verdict, k", [
    (["diverged", "diverged", "diverged"], "reproduced", 3),
    (["ok", "stalled", "ok"], "not reproduced", 0),
    (["diverged", "ok", "diverged"], "inconclusive", 2),
    (["diverged", "diverged", "failed"], "reproduced", 2),  # the crash is not evidence
    (["failed", "failed"], "not run", None),
])
def test_judge_diverges(statuses, verdict, k):
    claim = Claim(id="d", text="Post-LN without warmup diverges (Fig. 1)", kind="diverges",
                  a={"method": "postln"})
    records = _recs(POSTLN, statuses) + _recs({"method": "preln", "warmup": "none"}, ["ok", "ok"])
    v = judge_v1(claim, records)
    assert v.verdict == verdict
    if k is not None:
        n = sum(s != "failed" for s in statuses)
        assert v.details == {"n": n, "diverged": k, "collapsed": 0}
        assert f"{k} of {n} seeds diverged" in v.measured


@pytest.mark.parametrize("statuses, verdict", [
    (["ok", "ok", "failed"], "reproduced"),
    (["diverged", "stalled"], "not reproduced"),
    (["ok", "stalled", "ok"], "inconclusive"),
    ([], "not run"),
])
def test_judge_trains(statuses, verdict):
    claim = Claim(id="t", text="Admin trains at 18 layers (Table 2)", kind="trains", a={"method": "admin"})
    records = _recs({"method": "admin"}, statuses) + _recs(POSTLN, ["diverged"])
    v = judge_v1(claim, records)
    assert v.verdict == verdict
    if statuses:
        bad = sum(s in ("diverged", "stalled") for s in statuses)
        assert v.details["trained"] == sum(s == "ok" for s in statuses)
        assert v.details["diverged"] + v.details["stalled"] == bad


@pytest.mark.parametrize("statuses, verdict", [
    (["diverged", "stalled", "failed"], "reproduced"),  # a plateau counts as failing to train
    (["ok", "ok"], "not reproduced"),
    (["stalled", "ok", "stalled"], "inconclusive"),
    (["failed"], "not run"),
])
def test_judge_fails_to_train(statuses, verdict):
    claim = claim_from_dict({"id": "f", "text": "Post-LN fails without warmup (Fig. 10)",
                             "kind": "fails_to_train", "a": POSTLN,
                             "added": "after seed 1: a plateau, not a blow-up"})
    assert claim.added == "after seed 1: a plateau, not a blow-up"
    records = _recs(POSTLN, statuses) + _recs({"method": "preln", "warmup": "none"}, ["stalled"])
    v = judge_v1(claim, records)
    assert v.verdict == verdict
    if verdict != "not run":
        n = sum(s != "failed" for s in statuses)
        bad = sum(s in ("diverged", "stalled") for s in statuses)
        assert v.details["failed"] == bad and v.details["n"] == n
        assert f"{bad} of {n} seeds failed to train" in v.measured


# The schemes-scaling sigma-reparam Post-LN arm: seeds 2 and 3 got past the stall bar (best NLL
# 0.31 nats below unigram) but decoded 2.21 and 0.0 BLEU; seed 1 stalled.
SIGMA_BLEU = [None, 2.21, 0.0]


def test_trains_without_a_bleu_bar_counts_near_unigram_cells_as_trained():
    claim = claim_from_dict({"id": "t", "text": "trains", "kind": "trains", "a": POSTLN})
    v = judge_v1(claim, _recs(POSTLN, ["stalled", "ok", "ok"], SIGMA_BLEU))
    assert claim.min_bleu is None and v.verdict == "inconclusive"
    assert v.details["trained"] == 2 and "below_bleu_bar" not in v.details


@pytest.mark.parametrize("statuses, bleu, verdict, low", [
    (["stalled", "ok", "ok"], SIGMA_BLEU, "not reproduced", 2),
    (["ok", "ok", "ok"], [10.0, 25.3, 33.1], "reproduced", 0),  # the bar itself passes
    (["ok", "ok", "diverged"], [9.99, 25.3, None], "inconclusive", 1),
    (["ok", "ok"], [None, float("nan")], "not reproduced", 2),  # an ok cell without a BLEU is not evidence of training
])
def test_trains_with_a_bleu_bar(statuses, bleu, verdict, low):
    claim = claim_from_dict({"id": "t", "text": "trains", "kind": "trains", "a": POSTLN, "min_bleu": 10})
    v = judge_v1(claim, _recs(POSTLN, statuses, bleu))
    assert claim.min_bleu == 10.0
    assert v.verdict == verdict
    assert v.details["below_bleu_bar"] == low
    n_bad = low + sum(s in ("diverged", "stalled") for s in statuses)
    assert v.details["trained"] == len(statuses) - n_bad
    assert f"{low} below 10 BLEU" in v.measured


def test_fails_to_train_with_a_bleu_bar_is_the_complement():
    claim = claim_from_dict({"id": "f", "text": "fails", "kind": "fails_to_train", "a": POSTLN, "min_bleu": 5})
    v = judge_v1(claim, _recs(POSTLN, ["stalled", "ok", "ok"], SIGMA_BLEU))
    assert v.verdict == "reproduced" and v.details["failed"] == 3 and v.details["below_bleu_bar"] == 2
    v = judge_v1(claim, _recs(POSTLN, ["ok", "ok"], [5.0, 30.0]))
    assert v.verdict == "not reproduced" and v.details["failed"] == 0


def test_a_bleu_bar_on_the_last_checkpoint_reads_bleu_last_not_the_averaged_bleu():
    # lipschitz, v1 with Lipschitz init at 12 layers, seed 1: 5.32 BLEU averaged, 15.75 last
    records = [Record(arm=dict(POSTLN), seed=1, status="ok", metrics={"bleu": 5.32, "bleu_last": 15.75}),
               Record(arm=dict(POSTLN), seed=2, status="ok", metrics={"bleu": 12.0, "bleu_last": 9.0})]
    averaged = claim_from_dict({"id": "t", "text": "trains", "kind": "trains", "a": POSTLN, "min_bleu": 10})
    last = claim_from_dict({"id": "t", "text": "trains", "kind": "trains", "a": POSTLN, "min_bleu": 10,
                            "bleu_metric": "bleu_last"})
    assert averaged.bleu_metric == "bleu" and last.bleu_metric == "bleu_last"
    v_avg, v_last = judge_v1(averaged, records[:1]), judge_v1(last, records[:1])
    assert (v_avg.verdict, v_last.verdict) == ("not reproduced", "reproduced")
    assert "1 below 10 BLEU)" in v_avg.measured and "0 below 10 BLEU of the last checkpoint" in v_last.measured
    # each reading counts its own cell below the bar
    assert judge_v1(averaged, records).details["below_bleu_bar"] == 1
    assert judge_v1(last, records).details["below_bleu_bar"] == 1
    assert judge_v1(last, records[1:]).verdict == "not reproduced"


@pytest.mark.parametrize("extra, message", [
    ({"kind": "trains", "bleu_metric": "bleu_last"}, "bleu_metric names the metric that min_bleu reads"),
    ({"kind": "trains", "min_bleu": 10, "bleu_metric": "sacrebleu"}, "bleu_metric must be one of"),
    ({"kind": "better", "b": {"method": "x"}, "metric": "sacrebleu_last"}, "metric must be one of"),
    ({"kind": "diverges", "min_bleu": 10}, "min_bleu applies to kinds 'trains' and 'fails_to_train' only"),
    ({"kind": "trains", "min_bleu": "ten"}, "min_bleu must be a number from 0 to 100"),
    ({"kind": "trains", "min_bleu": 101}, "min_bleu must be a number from 0 to 100"),
    ({"kind": "trains", "min_bleu": True}, "min_bleu must be a number from 0 to 100"),
])
def test_min_bleu_is_checked(extra, message):
    with pytest.raises(ValueError, match=message):
        claim_from_dict({"id": "c", "text": "x", "a": POSTLN, **extra})


def _grid(method, diverged_cells, extra=()):
    """A depth x seed grid of one method; cells in `diverged_cells` ((depth, seed)) diverged."""
    out = []
    for depth in ("6", "12"):
        for seed in range(4):
            status = "diverged" if (depth, seed) in diverged_cells else "ok"
            out.append(Record(arm={"method": method, "layers": depth}, seed=seed, status=status, metrics={}))
    return out + list(extra)


ALL_CELLS = {(d, s) for d in ("6", "12") for s in range(4)}
GRID_CLAIM = Claim(id="g", text="Post-LN diverges in more grid cells than Pre-LN (Fig. 3)",
                   kind="more_diverged", a={"method": "postln"}, b={"method": "preln"})


def test_judge_more_diverged_reproduced():
    # 8 pairs, A alone diverged in all: p = 2 * 0.5**8 < 0.05.
    v = judge_v1(GRID_CLAIM, _grid("postln", ALL_CELLS) + _grid("preln", set()))
    assert v.verdict == "reproduced"
    assert (v.details["wins"], v.details["losses"], v.details["pairs"]) == (8, 0, 8)
    assert v.details["p"] == pytest.approx(0.0078125)
    assert v.details["pair_axes"] == ["layers"]


def test_judge_more_diverged_inconclusive_when_not_significant():
    # 7 wins, 1 loss: p = 0.0703125 >= 0.05.
    b_div = {("12", 3)}
    v = judge_v1(GRID_CLAIM, _grid("postln", ALL_CELLS - b_div) + _grid("preln", b_div))
    assert v.verdict == "inconclusive"
    assert (v.details["wins"], v.details["losses"]) == (7, 1)
    assert v.details["p"] == pytest.approx(0.0703125)


def test_judge_more_diverged_not_reproduced_and_ties_ignored():
    # Both diverged at depth 12 (ties, not counted); at depth 6 A alone in 1 cell, B alone in 2.
    a_div = {("12", s) for s in range(4)} | {("6", 0)}
    b_div = {("12", s) for s in range(4)} | {("6", 1), ("6", 2)}
    v = judge_v1(GRID_CLAIM, _grid("postln", a_div) + _grid("preln", b_div))
    assert v.verdict == "not reproduced"
    assert (v.details["wins"], v.details["losses"]) == (1, 2)


def test_judge_more_diverged_failed_cells_are_dropped_and_missing_arm_not_run():
    # A's failed cells at depth 6 leave 4 pairs (depth 12): 4 wins, p = 0.125 -> inconclusive.
    a = [r if r.arm["layers"] == "12" else Record(r.arm, r.seed, "failed", {}) for r in _grid("postln", ALL_CELLS)]
    v = judge_v1(GRID_CLAIM, a + _grid("preln", set()))
    assert v.details["pairs"] == 4 and v.details["wins"] == 4
    assert v.details["p"] == pytest.approx(2 * 0.5**4)
    assert v.verdict == "inconclusive"
    assert judge_v1(GRID_CLAIM, _grid("postln", ALL_CELLS)).verdict == "not run"


ADMIN = {"method": "admin", "warmup": "none"}
PRELN = {"method": "preln", "warmup": "none"}
BETTER = Claim(id="b", text="Admin beats Pre-LN on BLEU (Table 2)", kind="better",
               a={"method": "admin"}, b={"method": "preln"})


def test_judge_better_reproduced_by_paired_ci():
    records = _recs(ADMIN, ["ok"] * 3, [30.0, 31.0, 32.0]) + _recs(PRELN, ["ok"] * 3, [29.0, 30.0, 31.2])
    v = judge_v1(BETTER, records)
    assert v.verdict == "reproduced"
    assert v.details["paired"] == 3
    assert v.details["mean_diff"] == pytest.approx((1.0 + 1.0 + 0.8) / 3)
    assert 0.8 <= v.details["ci_low"] <= v.details["ci_high"] <= 1.0
    assert "over 3 paired seeds" in v.measured and "+0.93" in v.measured


def test_t_interval_by_hand_and_wider_than_the_bootstrap_at_three_seeds():
    diffs = [1.0, 1.0, 0.8]
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    half = 4.302653 * sd / math.sqrt(3)
    low, high = t_mean_ci(diffs)
    assert (low, high) == pytest.approx((mean - half, mean + half), abs=1e-5)
    b_low, b_high = bootstrap_mean_ci(diffs, min_values=2)
    assert b_low == pytest.approx(0.8)  # with 3 values the 2.5% quantile is the smallest one
    assert low < b_low and high > b_high
    v = judge_v1(BETTER, _recs(ADMIN, ["ok"] * 3, [30.0, 31.0, 32.0]) + _recs(PRELN, ["ok"] * 3, [29.0, 30.0, 31.2]))
    assert v.verdict == "reproduced"  # rule book v1: the bootstrap CI (every seed favours A)
    assert v.details["pairs_favouring_a"] == 3
    assert "3 of 3 favour method=admin" in v.measured and "95% bootstrap" in v.measured


def test_judge_better_not_reproduced_and_inconclusive():
    worse = _recs(ADMIN, ["ok"] * 3, [28.0, 29.0, 30.0]) + _recs(PRELN, ["ok"] * 3, [29.0, 30.0, 31.2])
    assert judge_v1(BETTER, worse).verdict == "not reproduced"
    # Differences +1, -1, +0.5: the CI spans the all-(-1) and all-(+1) resamples, so it contains 0.
    mixed = _recs(ADMIN, ["ok"] * 3, [30.0, 29.0, 31.5]) + _recs(PRELN, ["ok"] * 3, [29.0, 30.0, 31.0])
    v = judge_v1(BETTER, mixed)
    assert v.verdict == "inconclusive"
    assert v.details["ci_low"] < 0 < v.details["ci_high"]


def test_judge_better_lower_is_better_flips_the_sign():
    claim = Claim(id="l", text="Admin reaches a lower valid loss (Table 2)", kind="better",
                  a={"method": "admin"}, b={"method": "preln"}, metric="loss", higher_is_better=False)
    records = (_recs(ADMIN, ["ok"] * 3, [3.0, 3.1, 3.2], name="loss")
               + _recs(PRELN, ["ok"] * 3, [3.5, 3.5, 3.6], name="loss"))
    v = judge_v1(claim, records)
    assert v.verdict == "reproduced"
    assert v.details["mean_diff"] == pytest.approx((0.5 + 0.4 + 0.4) / 3)


def test_judge_better_pairs_only_common_ok_seeds():
    # Seed 3 of A has no partner; B's seed 4 has none either; A's failed seed 0 is not evidence.
    a = _recs(ADMIN, ["failed", "ok", "ok", "ok"], [99.0, 30.0, 31.0, 50.0], seeds=[0, 1, 2, 3])
    b = _recs(PRELN, ["ok", "ok", "ok", "ok"], [10.0, 29.0, 30.5, 0.0], seeds=[0, 1, 2, 4])
    v = judge_v1(BETTER, a + b)
    assert v.details["paired"] == 2
    assert v.details["mean_diff"] == pytest.approx((1.0 + 0.5) / 2)
    assert v.verdict == "reproduced"


def test_judge_better_divergence_branches():
    # B diverged/stalled more and A never: reproduced whatever the metric says.
    a = _recs(ADMIN, ["ok"] * 3, [20.0, 20.0, 20.0])
    b = _recs(PRELN, ["diverged", "stalled", "ok"], [None, None, 30.0])
    v = judge_v1(BETTER, a + b)
    assert v.verdict == "reproduced" and (v.details["a_bad"], v.details["b_bad"]) == (0, 2)
    # A diverged more than B: not reproduced.
    a = _recs(ADMIN, ["diverged", "ok", "ok"], [None, 40.0, 40.0])
    b = _recs(PRELN, ["ok"] * 3, [20.0, 20.0, 20.0])
    assert judge_v1(BETTER, a + b).verdict == "not reproduced"
    # Equal counts: compare the seeds where both are ok (seeds 1 and 2).
    a = _recs(ADMIN, ["diverged", "ok", "ok"], [None, 31.0, 32.0])
    b = _recs(PRELN, ["ok", "ok", "stalled"], [25.0, 30.0, None])
    v = judge_v1(BETTER, a + b)
    assert v.verdict == "inconclusive" and v.details["paired"] == 1  # one pair < 2
    a = _recs(ADMIN, ["diverged", "ok", "ok", "ok"], [None, 31.0, 32.0, 33.0])
    b = _recs(PRELN, ["stalled", "ok", "ok", "ok"], [None, 30.0, 30.5, 31.0])
    v = judge_v1(BETTER, a + b)
    assert v.verdict == "reproduced" and v.details["paired"] == 3


def test_judge_better_counts_bad_cells_over_seed_matched_pairs_only():
    # B's seed 3 diverged but A has no seed 3: that cell does not make A "better". Over the two
    # pairs A is 20 BLEU worse, so the paired CI decides: not reproduced.
    a = _recs(ADMIN, ["ok", "ok"], [10.0, 11.0], seeds=[1, 2])
    b = _recs(PRELN, ["ok", "ok", "diverged"], [30.0, 31.0, None], seeds=[1, 2, 3])
    v = judge_v1(BETTER, a + b)
    assert (v.details["a_bad"], v.details["b_bad"], v.details["unpaired_b"]) == (0, 0, 1)
    assert v.verdict == "not reproduced"
    # The same diverged cell with a partner in A counts: B bad, A never, reproduced.
    a = _recs(ADMIN, ["ok"] * 3, [10.0, 11.0, 12.0], seeds=[1, 2, 3])
    v = judge_v1(BETTER, a + b)
    assert v.verdict == "reproduced" and (v.details["a_bad"], v.details["b_bad"]) == (0, 1)
    assert v.measured == "diverged/stalled: method=admin 0 of 3, method=preln 1 of 3"


def test_judge_better_both_bad_with_b_worse_goes_on_to_the_paired_ci():
    # A bad in 1 seed and B in 2: neither shortcut applies (A is not clean), so the ok pairs decide.
    a = _recs(ADMIN, ["stalled", "ok", "ok", "ok"], [None, 31.0, 32.0, 33.0])
    b = _recs(PRELN, ["diverged", "diverged", "ok", "ok"], [None, None, 30.0, 30.5])
    v = judge_v1(BETTER, a + b)
    assert (v.details["a_bad"], v.details["b_bad"]) == (1, 2)
    assert v.details["paired"] == 2 and v.details["mean_diff"] == pytest.approx((2.0 + 2.5) / 2)
    assert v.verdict == "reproduced"  # both pairs favour A: bootstrap CI [2.0, 2.5]
    # An ok pair with a missing or NaN metric is not a pair.
    a[2] = Record(arm=dict(ADMIN), seed=2, status="ok", metrics={"bleu": float("nan")})
    assert judge_v1(BETTER, a + b).details["paired"] == 1


def test_judge_more_diverged_with_records_but_no_pairs_is_inconclusive():
    # A at depths 6/12, B only at depth 24: no cell pairs up.
    b = [Record(arm={"method": "preln", "layers": "24"}, seed=s, status="ok", metrics={}) for s in range(4)]
    a = _grid("postln", ALL_CELLS)
    v = judge_v1(GRID_CLAIM, a + b)
    # "layers" is shared by every record, so it is a pairing axis: A's (6|12, s) never meets B's (24, s).
    assert v.details["pairs"] == 0 and v.verdict == "inconclusive"


def test_judge_more_failed_counts_stalled_as_failed():
    # A stalls in every cell, B trains: more_diverged sees nothing (0 wins), more_failed 8 wins.
    stalled_a = [Record(r.arm, r.seed, "stalled", {}) for r in _grid("postln", set())]
    b = _grid("preln", set())
    assert judge_v1(GRID_CLAIM, stalled_a + b).verdict == "not reproduced"
    failed = Claim(id="f", text="t", kind="more_failed", a={"method": "postln"}, b={"method": "preln"})
    v = judge_v1(failed, stalled_a + b)
    assert v.verdict == "reproduced" and (v.details["wins"], v.details["losses"]) == (8, 0)
    assert "diverged or stalled in 8 of 8 cells" in v.measured
    # A cell where both failed, one by diverging and one by stalling, is a tie, not a win.
    mixed = [Record(r.arm, r.seed, "diverged", {}) for r in _grid("preln", set())]
    v = judge_v1(failed, stalled_a + mixed)
    assert (v.details["wins"], v.details["losses"]) == (0, 0) and v.verdict == "not reproduced"
    with pytest.raises(ValueError, match="selector b"):
        claim_from_dict({"id": "f2", "text": "t", "kind": "more_failed", "a": {"method": "postln"}})


def test_judge_more_diverged_counts_stalled_as_not_diverged():
    stalled = [Record(r.arm, r.seed, "stalled", {}) for r in _grid("preln", set())]
    v = judge_v1(GRID_CLAIM, _grid("postln", ALL_CELLS) + stalled)
    assert (v.details["wins"], v.details["losses"]) == (8, 0) and v.verdict == "reproduced"


def test_judge_better_not_run_when_an_arm_only_crashed():
    a = _recs(ADMIN, ["ok", "ok"], [30.0, 31.0])
    b = _recs(PRELN, ["failed", "failed"], [None, None])
    v = judge_v1(BETTER, a + b)
    assert v.verdict == "not run"
    assert "method=preln" in v.measured


def test_judge_rejects_overlapping_selectors_and_ambiguous_pairs():
    overlap = Claim(id="o", text="t", kind="better", a={"method": "admin"}, b={"warmup": "none"})
    with pytest.raises(ValueError, match="both selectors"):
        judge_v1(overlap, _recs(ADMIN, ["ok", "ok"], [1.0, 2.0]))
    # Two non-failed records for the same seed of A (a rerun not deduplicated): pairing is ambiguous.
    twice = _recs(ADMIN, ["ok", "ok"], [1.0, 2.0], seeds=[0, 0]) + _recs(PRELN, ["ok"], [1.0])
    with pytest.raises(ValueError, match="ambiguous"):
        judge_v1(BETTER, twice)


def _lr_record(layers: str, lr: str, seed: int, loss: float, status: str = "ok") -> Record:
    return Record(arm={"init": "depth_mup", "model.layers": layers, "optim.lr": lr}, seed=seed,
                  status=status, metrics={"best_valid_loss": loss})


SAME_BEST = {"id": "lr_transfers", "text": "t", "kind": "same_best", "a": {"init": "depth_mup"},
             "metric": "best_valid_loss", "higher_is_better": False, "over": "optim.lr",
             "across": "model.layers"}


def test_same_best_reproduced_when_the_best_lr_is_the_same_at_every_depth():
    losses = {("6", "1e-3"): 3.0, ("6", "3e-3"): 2.5, ("6", "1e-2"): 2.8,
              ("12", "1e-3"): 2.9, ("12", "3e-3"): 2.4, ("12", "1e-2"): 2.6}
    records = [_lr_record(d, lr, s, v + 0.01 * s) for (d, lr), v in losses.items() for s in (1, 2)]
    verdict = judge_v1(claim_from_dict(SAME_BEST), records)
    assert verdict.verdict == "reproduced"
    assert verdict.details["best"] == {"6": "3e-3", "12": "3e-3"}
    # the runner-up and the margin of the means (seeds 1 and 2 add 0.01 and 0.02 to every loss)
    assert verdict.details["runner_up"] == {"6": {"setting": "1e-2", "margin": pytest.approx(0.3)},
                                            "12": {"setting": "1e-2", "margin": pytest.approx(0.2)}}
    assert "6 -> 3e-3 (by 0.300 over 1e-2), 12 -> 3e-3 (by 0.200 over 1e-2)" in verdict.measured


def test_same_best_one_step_apart_is_inconclusive_and_two_steps_not_reproduced():
    grid = ["1e-3", "3e-3", "1e-2"]
    def records(best12):
        out = []
        for d, best in (("6", "1e-3"), ("12", best12)):
            out += [_lr_record(d, lr, 1, 1.0 if lr == best else 2.0) for lr in grid]
        return out
    assert judge_v1(claim_from_dict(SAME_BEST), records("3e-3")).verdict == "inconclusive"
    assert judge_v1(claim_from_dict(SAME_BEST), records("1e-2")).verdict == "not reproduced"


def test_same_best_at_the_edge_of_the_grid_is_inconclusive():
    grid = ["1e-3", "3e-3", "1e-2"]
    def records(best):  # the same best at both depths
        return [_lr_record(d, lr, 1, 1.0 if lr == best else 2.0) for d in ("6", "12") for lr in grid]
    for edge in ("1e-3", "1e-2"):
        verdict = judge_v1(claim_from_dict(SAME_BEST), records(edge))
        assert verdict.details["at_edge"] and verdict.verdict == "inconclusive"
        assert "not bracketed" in verdict.measured
    assert judge_v1(claim_from_dict(SAME_BEST), records("3e-3")).verdict == "reproduced"
    # A failed top setting still bounds the grid: 3e-3 best at both depths is inside it.
    capped = [r for r in records("3e-3") if r.arm["optim.lr"] != "1e-2"]
    capped += [_lr_record(d, "1e-2", 1, float("nan"), "diverged") for d in ("6", "12")]
    assert judge_v1(claim_from_dict(SAME_BEST), capped).verdict == "reproduced"
    # Bests at opposite edges are as far apart as the grid allows: not reproduced.
    apart = [_lr_record("6", lr, 1, 1.0 if lr == "1e-3" else 2.0) for lr in grid]
    apart += [_lr_record("12", lr, 1, 1.0 if lr == "1e-2" else 2.0) for lr in grid]
    assert judge_v1(claim_from_dict(SAME_BEST), apart).verdict == "not reproduced"


def test_same_best_ignores_failed_settings_and_needs_over_and_across():
    records = [_lr_record("6", "1e-3", 1, 2.0), _lr_record("6", "1e-2", 1, 1.0, "diverged"),
               _lr_record("12", "1e-3", 1, 2.0), _lr_record("12", "1e-2", 1, 1.5)]
    verdict = judge_v1(claim_from_dict(SAME_BEST), records)
    assert verdict.details["best"] == {"6": "1e-3", "12": "1e-2"}  # the diverged 1e-2 cannot be best at 6
    assert verdict.verdict == "inconclusive"  # one grid step apart
    with pytest.raises(ValueError, match="needs `over` and `across`"):
        claim_from_dict({k: v for k, v in SAME_BEST.items() if k != "over"})


def test_same_best_with_a_depth_that_never_trained_is_inconclusive_and_names_it():
    # The best lr is 3e-3 at 6 and 12 layers, but at 24 every cell diverged: there is no best at 24,
    # so the transfer is not shown across all depths.
    grid = ["1e-3", "3e-3", "1e-2"]
    records = [_lr_record(d, lr, 1, 1.0 if lr == "3e-3" else 2.0) for d in ("6", "12") for lr in grid]
    records += [_lr_record("24", lr, 1, float("nan"), "diverged") for lr in grid]
    verdict = judge_v1(claim_from_dict(SAME_BEST), records)
    assert verdict.verdict == "inconclusive"
    assert verdict.details["no_ok_cell"] == ["24"]
    assert "no ok cell at model.layers=24" in verdict.measured
    # One depth only: nothing to transfer to.
    assert judge_v1(claim_from_dict(SAME_BEST), records[:3]).verdict == "inconclusive"


def test_a_list_in_a_selector_keeps_a_claim_to_its_part_of_the_grid():
    # Written for the grid 1e-3..1e-2, where the shared best is the top value (not bracketed); the
    # grid later gains 3e-2, which brackets it. The claim restricted to the original values keeps
    # its verdict; the same claim over the whole grid is reproduced.
    grid = ["1e-3", "3e-3", "1e-2", "3e-2"]
    records = [_lr_record(d, lr, 1, 1.0 if lr == "1e-2" else 2.0) for d in ("6", "12") for lr in grid]
    original = claim_from_dict({**SAME_BEST, "a": {"init": "depth_mup", "optim.lr": ["1e-3", "3e-3", "1e-2"]}})
    assert original.a == {"init": "depth_mup", "optim.lr": ("1e-3", "3e-3", "1e-2")}
    verdict = judge_v1(original, records)
    assert verdict.verdict == "inconclusive" and verdict.details["grid"] == ["1e-3", "3e-3", "1e-2"]
    assert judge_v1(claim_from_dict(SAME_BEST), records).verdict == "reproduced"
    # Lists work in every kind and label the arm with its values.
    trains = claim_from_dict({"id": "t", "text": "t", "kind": "trains", "a": {"optim.lr": ["1e-3", 0.5]}})
    assert trains.a == {"optim.lr": ("1e-3", "0.5")}
    assert judge_v1(trains, records).measured.startswith("2 of 2 cells trained (optim.lr=1e-3|0.5;")
    for bad in ([], [["1e-3"]], [{"x": 1}]):
        with pytest.raises(ValueError, match="optim.lr must be a value or a non-empty list"):
            claim_from_dict({**SAME_BEST, "a": {"optim.lr": bad}})


def test_an_axis_listed_in_a_selector_stays_a_pairing_axis():
    # Two methods over two lrs: a claim that lists the lrs compares each lr with itself, seed by
    # seed, exactly as the claim that leaves the lr out does; one lr fixed in A and another in B
    # compares across them.
    recs = [Record(arm={"method": m, "optim.lr": lr}, seed=s, status=status, metrics={})
            for m, bad in (("post", "0.002"), ("pre", None)) for lr in ("0.001", "0.002") for s in (1, 2)
            for status in (["diverged" if lr == bad else "ok"])]
    whole = claim_from_dict({"id": "m", "text": "t", "kind": "more_diverged", "a": {"method": "post"},
                             "b": {"method": "pre"}})
    listed = claim_from_dict({**{"id": "m", "text": "t", "kind": "more_diverged"},
                              "a": {"method": "post", "optim.lr": [0.001, 0.002]},
                              "b": {"method": "pre", "optim.lr": [0.001, 0.002]}})
    for claim in (whole, listed):
        verdict = judge_v1(claim, recs)
        assert verdict.details["pair_axes"] == ["optim.lr"] and verdict.details["wins"] == 2, claim
    across = Claim(id="x", text="t", kind="more_diverged", a={"method": "post", "optim.lr": "0.002"},
                   b={"method": "pre", "optim.lr": ["0.001"]})  # a list built in Python works too
    verdict = judge_v1(across, recs)
    assert verdict.details["pair_axes"] == [] and verdict.details["wins"] == 2
