"""Rule book v2 (runner/tables/rulebook.py) and the statistics it decides by (runner/tables/statistics.py, evidence.py).

Expected values come from scipy.stats called directly on hand-made values, from printed tables, or
from simulation: never from the code under test called a second way.
"""
from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from runner.config import ConfigError, DivergenceConfig
from runner.tables.claims import Claim, Record, claim_from_dict
from runner.tables.evidence import judge, judge_all
from runner.tables.rulebook import (
    RULEBOOKS,
    blow_up_cause,
    check_preset,
    collapsed,
    loss_spikes,
    outcome,
    rulebook,
)
from runner.tables.statistics import (
    detectable_variance_ratio,
    holm,
    min_detectable_effect,
    paired_t_test,
    pairs_needed,
    summarize,
    t_mean_ci,
    t_test_power,
    tost_paired,
    variance_ratio_test,
)

# --------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("values", [[31.2, 33.0, 32.1], [1.0, 2.0], [0.3, -0.1, 0.25, 0.4, 0.0]])
def test_t_interval_matches_scipy(values):
    low, high = t_mean_ci(values)
    expected = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert (low, high) == pytest.approx(expected, rel=1e-12)
    s = summarize(values)
    assert (s.ci_low, s.ci_high) == pytest.approx(expected, rel=1e-12)


def test_t_interval_by_the_printed_table():
    # t(0.975, 2) = 4.303 (printed tables): three seeds' interval is mean -/+ 4.303 s / sqrt 3
    values = [29.40, 29.67, 29.64]
    half = 4.302653 * statistics.stdev(values) / math.sqrt(3)
    assert t_mean_ci(values) == pytest.approx((statistics.fmean(values) - half, statistics.fmean(values) + half),
                                              abs=1e-5)


def test_paired_t_test_matches_scipy_ttest_rel():
    a = [30.0, 31.0, 32.0, 29.5]
    b = [29.0, 30.4, 31.9, 29.8]
    expected = stats.ttest_rel(a, b, alternative="greater").pvalue
    assert paired_t_test([x - y for x, y in zip(a, b)]) == pytest.approx(expected, rel=1e-10)
    # The direction matters: the mirror image has p = 1 - p.
    assert paired_t_test([y - x for x, y in zip(a, b)]) == pytest.approx(1 - expected, rel=1e-10)
    assert paired_t_test([0.5, 0.5, 0.5]) == 0.0 and paired_t_test([-0.5, -0.5]) == 1.0


def test_holm_by_hand():
    # m = 4, sorted p 0.01, 0.02, 0.03, 0.2 -> 0.04, 0.06, 0.06 (monotone), 0.2
    assert holm([0.03, 0.01, 0.2, 0.02]) == pytest.approx([0.06, 0.04, 0.2, 0.06])
    assert holm([0.6]) == [0.6]
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == []


def test_power_matches_a_simulation_and_the_mde_has_the_stated_power():
    sd, n = 0.4, 3
    mde = min_detectable_effect(sd, n)
    assert t_test_power(mde, sd, n) == pytest.approx(0.80, abs=1e-9)
    # Independent check by simulation: draw n normal differences with mean mde, test them.
    rng = np.random.default_rng(0)
    draws = rng.normal(mde, sd, size=(20000, n))
    p = stats.ttest_1samp(draws, 0.0, axis=1, alternative="greater").pvalue
    assert float(np.mean(p < 0.05)) == pytest.approx(0.80, abs=0.012)
    # More pairs detect smaller effects.
    assert min_detectable_effect(sd, 10) < mde


def test_pairs_needed_is_the_first_n_with_the_power():
    sd, effect = 0.40, 0.32  # Admin vs Pre-LN at 12 layers: the paper's +0.32 BLEU
    n = pairs_needed(sd, effect)
    assert n is not None and n > 3
    assert t_test_power(effect, sd, n) >= 0.80 > t_test_power(effect, sd, n - 1)
    assert pairs_needed(sd, 0.0) is None and pairs_needed(sd, 1e-6, most=20) is None


# --------------------------------------------------------------------------- outcomes


def _rec(**kw):
    base = {"status": "ok", "stalled": False, "valid_unigram_nll": 5.65, "bleu": 25.0,
            "valid_curve": [[200, 6.0], [400, 5.0], [600, 4.5]]}
    return {**base, **kw}


def test_outcomes_in_the_rule_books_order():
    v2 = rulebook(2)
    assert outcome(_rec(), v2) == "trained"
    assert outcome(_rec(status="diverged"), v2) == "diverged"
    assert outcome(_rec(status="failed"), v2) == "failed"
    # validation loss 6.23 -> 8.56, above unigram 5.65 and 2.3 nats above its best: collapsed,
    # though the run recorded "stalled" (its best NLL never got below the unigram NLL)
    rose = [[200, 6.23], [1000, 7.4], [2000, 8.56]]
    assert outcome(_rec(status="ok", stalled=True, valid_curve=rose, bleu=0.0), v2) == "collapsed"
    assert outcome(_rec(stalled=True), v2) == "stalled"
    assert outcome(_rec(bleu=9.99), v2) == "below_bar"
    assert outcome(_rec(bleu=None), v2, decoded=True) == "below_bar"  # a decoding suite's cell without BLEU
    assert outcome(_rec(bleu=None), v2, decoded=False) == "trained"  # a loss-only suite
    # v1 keeps the recorded status and has no bar
    assert outcome(_rec(bleu=0.0, valid_curve=rose), rulebook(1)) == "trained"


@pytest.mark.parametrize("curve, unigram, expected", [
    ([[1, 6.0], [2, 6.51]], 5.0, True),    # 0.51 above its best, above unigram
    ([[1, 6.0], [2, 6.49]], 5.0, False),   # within the 0.5-nat margin
    ([[1, 3.0], [2, 4.0]], 5.0, False),    # rose by 1 nat but still below the unigram NLL
    ([[1, 6.0]], 5.0, False),              # one point: nothing to compare
])
def test_collapse_margin_and_unigram_condition(curve, unigram, expected):
    assert collapsed({"valid_curve": curve, "valid_unigram_nll": unigram}, rulebook(2)) is expected
    assert collapsed({"valid_curve": curve, "valid_unigram_nll": unigram}, rulebook(1)) is False


def test_blow_up_cause_reads_the_loss_at_update_0():
    assert blow_up_cause({"initial_loss": 302.0}, 10.0) == "at initialization"
    assert blow_up_cause({"initial_loss": float("nan")}, 10.0) == "at initialization"
    assert blow_up_cause({"initial_loss": 9.0}, 10.0) == "during training"
    assert blow_up_cause({}, 10.0) == "unknown"


def test_rule_books_are_fixed():
    # A version never changes once a report used it: these are its numbers.
    v1, v2 = RULEBOOKS[1], RULEBOOKS[2]
    assert (v1.better_test, v1.bleu_bar, v1.collapse_margin) == ("bootstrap_ci", None, None)
    assert (v2.better_test, v2.bleu_bar, v2.collapse_margin) == ("paired_t_holm", 10.0, 0.5)
    assert (v2.alpha, v2.level, v2.power, v2.stall_margin) == (0.05, 0.95, 0.80, 0.1)
    with pytest.raises(ValueError, match="no rule book version 9"):
        rulebook(9)


# --------------------------------------------------------------------------- verdicts under v2

A, B, C = {"method": "admin"}, {"method": "preln"}, {"method": "tfixup"}


def _recs(arm, values, seeds=None, status="ok"):
    seeds = seeds or list(range(1, len(values) + 1))
    return [Record(arm=dict(arm), seed=s, status=status, metrics={"bleu": v}) for s, v in zip(seeds, values)]


def _better(cid, a, b, **kw):
    return Claim(id=cid, text=cid, kind="better", a=a, b=b, **kw)


def test_better_is_a_one_sided_paired_t_test():
    a, b = [30.0, 31.0, 32.0], [29.0, 30.0, 31.2]
    v = judge(_better("c", A, B), _recs(A, a) + _recs(B, b))
    p = stats.ttest_rel(a, b, alternative="greater").pvalue
    assert v.details["p"] == pytest.approx(p) and p < 0.05
    assert v.verdict == "reproduced"
    assert "seed 1 +1.00, seed 2 +1.00, seed 3 +0.80" in v.measured  # every pair listed
    assert "95% paired t" in v.measured


def test_every_seed_favouring_a_is_not_enough_under_v2():
    # Differences +0.06, +0.21, +0.50: all favour A, so v1 (bootstrap = range) reproduces it, but
    # the t-test's p = 0.08 does not.
    a, b = [29.56, 29.88, 30.17], [29.50, 29.67, 29.67]
    records = _recs(A, a) + _recs(B, b)
    assert stats.ttest_rel(a, b, alternative="greater").pvalue > 0.05
    assert judge(_better("c", A, B), records, 1).verdict == "reproduced"
    assert judge(_better("c", A, B), records).verdict == "inconclusive"


def test_holm_corrects_a_tables_comparisons_against_one_baseline():
    base = [29.0, 30.0, 31.0, 30.0]
    a = [29.8, 30.2, 31.5, 30.1]  # one-sided p = 0.043
    c = [29.25, 30.25, 31.25, 30.75]  # p = 0.029 (differences 0.25, 0.25, 0.25, 0.75)
    records = _recs(A, a) + _recs(B, base) + _recs(C, c)
    p_a = stats.ttest_rel(a, base, alternative="greater").pvalue
    p_c = stats.ttest_rel(c, base, alternative="greater").pvalue
    assert p_a < 0.05 and p_c < 0.05 and max(p_a, p_c) < 0.05 < 2 * min(p_a, p_c)
    alone = [judge(_better(x, s, B), records) for x, s in (("a", A), ("c", C))]
    together = judge_all([_better("a", A, B), _better("c", C, B)], records)
    assert [v.verdict for v in alone] == ["reproduced", "reproduced"]
    expected = holm([p_a, p_c])
    assert [v.details["p_holm"] for v in together] == pytest.approx(expected)
    assert [v.verdict for v in together] == ["reproduced" if q < 0.05 else "inconclusive" for q in expected]
    assert "Holm over 2" in together[0].measured
    # a different baseline is another family
    other = judge_all([_better("a", A, B), _better("b", B, C)], records)
    assert "family_size" in other[0].details and other[0].details["family_size"] == 1


@pytest.mark.parametrize("book", [2, 3])
def test_a_holm_verdict_waits_while_a_family_member_misses_cells_only_if_it_could_change(book):
    """Holm's adjusted p of one claim depends on its family's other p-values: with a member still
    missing cells, a claim whose own cells are all in reads "incomplete" if its verdict with that
    member at p = 0 differs from its verdict with it at p = 1, and keeps its verdict otherwise."""
    base = [29.0, 30.0, 31.0, 30.0]
    a = [29.8, 30.2, 31.5, 30.1]  # p_a = 0.043: reproduced alone, not with a member at p = 1 (2 * p_a > 0.05)
    c = [30.0, 31.1, 31.9, 31.0]  # p_c ~ 0.0001: reproduced either way
    records = _recs(A, a) + _recs(B, base) + _recs(C, c)
    p_a = stats.ttest_rel(a, base, alternative="greater").pvalue
    p_c = stats.ttest_rel(c, base, alternative="greater").pvalue
    assert 0.025 < p_a < 0.05 and 2 * p_c < 0.05
    D = {"method": "dsinit"}  # the waiting member: one seed so far
    partial = records + _recs(D, [30.5], seeds=[1])
    claims = [_better("a", A, B), _better("c", C, B), _better("d", D, B)]
    judged = {v.claim.id: v for v in judge_all(claims, partial, book, waiting={"d"})}
    # a: with d at p = 0, a ranks third and keeps p_a (reproduced); with d at p = 1, a ranks
    # second of three and gets 2 * p_a (not)
    low = holm([p_a, p_c, 0.0])[0]
    high = holm([p_a, p_c, 1.0])[0]
    assert (low < 0.05) != (high < 0.05)  # d's p decides a's verdict
    assert judged["a"].verdict == "incomplete" and judged["a"].details["waits_for"] == ["d"]
    assert "turns on the Holm family's d" in judged["a"].measured
    assert judged["c"].verdict == "reproduced"  # 3 * p_c < 0.05: d cannot change it
    # without the waiting mark the same records read final: d (one seed, no test) is left out of
    # v2's family (a: max(2 p_c, p_a) = p_a, reproduced) and enters v3's at p = 1 (a: 2 p_a, not)
    unmarked = judge_all(claims, partial, book)[0]
    assert unmarked.verdict == ("reproduced" if book == 2 else "inconclusive")
    # d complete and tested: the family's ordinary Holm, nothing waits
    full = records + _recs(D, [29.1, 30.05, 31.0, 30.2])
    done = judge_all(claims, full, book, waiting=set())
    p_d = stats.ttest_rel([29.1, 30.05, 31.0, 30.2], base, alternative="greater").pvalue
    assert [v.details["p_holm"] for v in done] == pytest.approx(holm([p_a, p_c, p_d]))
    assert all(v.verdict != "incomplete" for v in done)


def test_underpowered_when_the_papers_effect_is_below_the_detectable_one():
    a, b = [29.56, 29.88, 29.19], [29.50, 29.67, 29.67]
    claim = _better("c", A, B, paper_effect=0.32)
    v = judge(claim, _recs(A, a) + _recs(B, b))
    sd = statistics.stdev([x - y for x, y in zip(a, b)])
    assert v.details["mde"] == pytest.approx(min_detectable_effect(sd, 3))
    assert v.details["mde"] > 0.32 and v.verdict == "underpowered"
    assert v.details["pairs_needed"] == pairs_needed(sd, 0.32)
    # without a paper effect the same numbers are inconclusive
    assert judge(_better("c", A, B), _recs(A, a) + _recs(B, b)).verdict == "inconclusive"


def test_not_reproduced_when_a_is_significantly_worse():
    v = judge(_better("c", A, B, paper_effect=0.3), _recs(A, [28.0, 29.0, 30.1]) + _recs(B, [29.0, 30.0, 31.0]))
    assert v.details["ci_high"] < 0 and v.verdict == "not reproduced"


def test_collapsed_and_below_bar_cells_count_as_not_trained():
    claim = claim_from_dict({"id": "t", "text": "t", "kind": "trains", "a": A})
    records = _recs(A, [30.0]) + [Record(dict(A), 2, "collapsed", {}), Record(dict(A), 3, "below_bar", {"bleu": 2.0})]
    v = judge(claim, records)
    assert v.verdict == "inconclusive" and (v.details["collapsed"], v.details["below_bar"]) == (1, 1)
    assert "1 collapsed" in v.measured and "1 below 10 BLEU" in v.measured


def test_paper_effect_is_checked():
    with pytest.raises(ValueError, match="paper_effect"):
        claim_from_dict({"id": "x", "text": "t", "kind": "trains", "a": A, "paper_effect": 0.3})
    with pytest.raises(ValueError, match="positive"):
        claim_from_dict({"id": "x", "text": "t", "kind": "better", "a": A, "b": B, "paper_effect": -1})


def test_same_best_needs_every_seed_to_agree():
    claim = Claim(id="s", text="s", kind="same_best", a={}, over="lr", across="layers", metric="loss",
                  higher_is_better=False)

    def cell(layers, lr, seed, loss):
        return Record({"layers": layers, "lr": lr}, seed, "ok", {"loss": loss})

    # the mean's best is lr 2 at both depths; seed 2 alone prefers lr 3 at 12 layers
    losses = {("6", "1"): (3.0, 3.0), ("6", "2"): (2.0, 2.0), ("6", "3"): (2.5, 2.5),
              ("12", "1"): (3.0, 3.0), ("12", "2"): (1.8, 2.3), ("12", "3"): (2.6, 2.2)}
    records = [cell(L, lr, s + 1, v[s]) for (L, lr), v in losses.items() for s in range(2)]
    assert judge(claim, records, 1).verdict == "reproduced"
    v = judge(claim, records)
    assert v.verdict == "inconclusive" and v.details["seeds_agreeing"] == 1
    assert "1 of 2 seeds agree" in v.measured


def test_reports_say_when_diverged_cells_blew_up_and_where_the_stopping_rule_ended_runs():
    from runner.tables import suite
    from runner.tables.report import blow_up_note, stop_note

    def cell(seed, record):
        return suite.SuiteCell(["+sweep=reproduce_tfixup_depth_real"], [], {"init": "xavier"}, seed, record)

    cells = [cell(1, {"status": "diverged", "initial_loss": 302.0, "first_logged_loss": 4.1e8}),
             cell(2, {"status": "diverged", "initial_loss": 9.1, "first_logged_loss": 55.0}),
             cell(3, {"status": "diverged"}), cell(4, {"status": "ok", "initial_loss": 1.0})]
    note = blow_up_note(cells)  # the rule book's divergence bound is 10 nats
    assert "1 at initialization, 1 during training, 1 unknown" in note
    # the ranges over the diverged cells that have the losses (not the ok cell's)
    assert note.endswith("Their training losses: the loss at update 0 9.1 to 302, at the first logged "
                         "update 55 to 4.1e+08 nats.")
    assert blow_up_note(cells[3:]) == ""
    cells[1].record["first_logged_loss"] = float("nan")  # a NaN is counted, not ranged
    assert blow_up_note(cells).endswith("at the first logged update 4.1e+08 (1 not finite) nats.")
    runs = [cell(1, {"status": "ok", "stopped_early": True, "stop_update": 6250, "early_stop": {"window": 1500}}),
            cell(2, {"status": "ok", "stopped_early": True, "stop_update": 5000, "early_stop": {"window": 1500}}),
            cell(3, {"status": "ok", "stopped_early": False, "stop_update": None, "early_stop": {"window": 1500}})]
    note = stop_note(runs)
    assert note.startswith("Stopping rule: 2 of 3 cells stopped on a flat curve (at update 5,000 to 6,250); 1 reached the cap")
    assert stop_note([cell(1, {"status": "ok", "stopped_early": False, "early_stop": None})]) == ""
    # a suite whose preset sets the rule says so even when every run reached the cap, and from
    # records that do not carry the rule (made before records kept trainer.early_stop)
    capped = [cell(s, {"status": "ok", "stopped_early": False, "stop_update": None}) for s in (1, 2)]
    assert stop_note(capped) == ""
    assert stop_note(capped, rule_set=True) == ("Stopping rule: 0 of 2 cells stopped on a flat curve; 2 reached "
                                                "the cap still improving, so their scores are at a budget, not "
                                                "at convergence.")


def test_the_converged_suite_reports_the_checkpoints_it_averages_and_equal_updates_after_warmup(monkeypatch):
    """table2-converged averages the last 6 of its 6 kept checkpoints (table2's suite the last 5),
    and compares T-Fixup (no warmup) with Pre-LN (500 warmup updates) at the same number of
    updates after each one's warmup; the expected differences are computed here by hand."""
    from runner.tables import suite
    from runner.tables.report import (
        bleu_last_note,
        checkpoints_averaged,
        equal_updates_after_warmup,
        render,
        stop_note,
    )

    assert checkpoints_averaged("reproduce_table2_converged_real") == 6
    assert checkpoints_averaged("reproduce_table2_real") == 5
    assert "BLEU (tok) of the last 6 checkpoints averaged" in bleu_last_note([6, 6])
    assert "the last 5 or 6 checkpoints averaged" in bleu_last_note([6, 5])

    cells = suite.plan("reproduce_table2_converged_real")
    # validation every 250 updates: T-Fixup's seed s to update 6,000, Pre-LN's to 6,250 (seed 3: 5,750)
    def curve(last, level, scale):
        return [[u, level + scale / u] for u in range(250, last + 1, 250)]

    stops = {("tfixup", s): 6000 for s in (1, 2, 3)} | {("pre_ln", 1): 6250, ("pre_ln", 2): 6250,
                                                        ("pre_ln", 3): 5750}
    level = {"tfixup": 3.0, "pre_ln": 3.1}
    for c in cells:
        method = c.arm["method"]
        if method in level:  # each seed its own curve: a mispairing would change the differences
            c.record = {"status": "ok", "stalled": False, "stopped_early": False,
                        "valid_curve": curve(stops[method, c.seed], level[method] + 0.01 * c.seed,
                                             1000.0 * c.seed if method == "tfixup" else 500.0)}
    text = equal_updates_after_warmup("reproduce_table2_converged_real", cells)
    # the last point every pair has: Pre-LN seed 3 ends at 5,750 = 5,250 after its warmup
    after = 5250
    diffs = {s: (3.0 + 0.01 * s + 1000 * s / after) - (3.1 + 0.01 * s + 500 / (after + 500)) for s in (1, 2, 3)}
    mean, sd = statistics.mean(diffs.values()), statistics.stdev(diffs.values())
    half = stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
    assert f"method=tfixup,warmup.updates=0 - method=pre_ln,warmup.updates=500: {mean:+.3f}" in text
    assert f"[95% paired t {mean - half:+.3f}, {mean + half:+.3f}]" in text
    assert "at 5,250 updates after warmup (updates 5,250 and 5,750), 3 seeds" in text
    assert ", ".join(f"seed {s} {diffs[s]:+.3f}" for s in (1, 2, 3)) in text
    assert text.count("\n- ") == 1  # the claims on BLEU and on the last checkpoint share the pair
    report = render("table2-converged", "T", "reproduce_table2_converged_real", cells)
    assert text in report and "Stopping rule: 0 of 6 cells stopped" in report

    # a seed without a curve drops out; a non-finite loss is no validation (the point moves back)
    by_arm_seed = {(c.arm["method"], c.seed): c for c in cells}
    by_arm_seed["pre_ln", 1].record["valid_curve"] = []
    by_arm_seed["tfixup", 2].record["valid_curve"][after // 250 - 1][1] = float("nan")
    text = equal_updates_after_warmup("reproduce_table2_converged_real", cells)
    assert "at 5,000 updates after warmup (updates 5,000 and 5,500), 2 seeds (seed 2 " in text
    # selectors that leave the warmup out read it from the arms they pick
    from runner.tables import report as report_module
    unnamed = [claim_from_dict({"id": "x", "text": "x", "kind": "better", "metric": "bleu", "paper_effect": 1.0,
                                "a": {"method": "tfixup"}, "b": {"method": "pre_ln"}})]
    monkeypatch.setattr(report_module, "preset_claims", lambda name: unnamed)
    assert "- method=tfixup - method=pre_ln: " in equal_updates_after_warmup("any", cells)
    monkeypatch.undo()
    # a diverged run neither stopped nor reached the cap
    by_arm_seed["admin", 1].record = {"status": "diverged", "stopped_early": False, "stop_update": None}
    assert "0 of 6 cells stopped" in stop_note(cells, rule_set=True)
    # a suite without a claim across warmups, or without records, has no such line
    assert equal_updates_after_warmup("reproduce_table2_converged_real", suite.plan("reproduce_table2_converged_real")) == ""
    assert equal_updates_after_warmup("reproduce_width_real", suite.plan("reproduce_width_real")) == ""


def test_a_claim_about_the_last_checkpoint_meets_the_bar_there():
    cells = [Record(dict(A), s, "ok" if avg >= 10 else "below_bar", {"bleu": avg, "bleu_last": last})
             for s, (avg, last) in enumerate(((5.3, 15.8), (6.0, 14.0), (12.0, 9.0)), start=1)]
    on_average = claim_from_dict({"id": "a", "text": "t", "kind": "trains", "a": A})
    on_last = claim_from_dict({"id": "l", "text": "t", "kind": "trains", "a": A, "min_bleu": 10,
                               "bleu_metric": "bleu_last"})
    assert judge(on_average, cells).details["below_bar"] == 2
    v = judge(on_last, cells)
    assert v.details["below_bar"] == 1 and v.verdict == "inconclusive"
    assert "1 below 10 BLEU of the last checkpoint" in v.measured


# --------------------------------------------------------------------------- kinds of the LM tier


def test_tost_is_the_larger_of_two_one_sided_scipy_tests():
    a, b = [1.90, 1.93, 1.88, 1.91], [1.91, 1.92, 1.90, 1.90]
    diffs = [x - y for x, y in zip(a, b)]
    margin = 0.05
    p_low = stats.ttest_1samp(diffs, -margin, alternative="greater").pvalue
    p_high = stats.ttest_1samp(diffs, margin, alternative="less").pvalue
    assert tost_paired(diffs, margin) == pytest.approx(max(p_low, p_high))
    # by hand: t = (mean + margin) / (s / sqrt(n)) against t(n - 1)
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    t_low = (mean + margin) / (sd / math.sqrt(4))
    assert p_low == pytest.approx(stats.t.sf(t_low, 3))
    assert tost_paired([0.01, 0.01, 0.01], 0.05) == 0.0 and tost_paired([0.1, 0.1], 0.05) == 1.0
    with pytest.raises(ValueError, match="margin"):
        tost_paired(diffs, 0.0)


def _lm_recs(arm, values, seeds=None, status="ok", metric="best_valid_loss"):
    seeds = seeds or list(range(1, len(values) + 1))
    return [Record(arm=dict(arm), seed=s, status=status, metrics={metric: v}) for s, v in zip(seeds, values)]


DYT, LN = {"method": "dyt"}, {"method": "pre_ln"}


def _matches(margin):
    return claim_from_dict({"id": "m", "text": "t", "kind": "matches", "a": DYT, "b": LN,
                            "metric": "best_valid_loss", "higher_is_better": False, "margin": margin})


def test_matches_by_tost_and_its_other_verdicts():
    ln = [1.500, 1.520, 1.480, 1.510]
    close = [1.505, 1.522, 1.486, 1.512]  # differences +0.005, +0.002, +0.006, +0.002
    v = judge(_matches(0.02), _lm_recs(DYT, close) + _lm_recs(LN, ln))
    diffs = [y - x for x, y in zip(close, ln)]  # lower is better: B - A, positive = A better
    assert v.details["p_tost"] == pytest.approx(tost_paired(diffs, 0.02)) and v.verdict == "reproduced"
    assert "TOST p=" in v.measured and "method=pre_ln - method=dyt" in v.measured
    assert "seed 1 -5.00e-03" in v.measured
    # far apart: the 95% interval lies beyond the margin
    far = [1.600, 1.618, 1.583, 1.611]
    assert judge(_matches(0.02), _lm_recs(DYT, far) + _lm_recs(LN, ln)).verdict == "not reproduced"
    # a margin narrower than the 90% interval's half-width cannot be met: underpowered
    noisy = [1.51, 1.50, 1.50, 1.53]
    v = judge(_matches(0.001), _lm_recs(DYT, noisy) + _lm_recs(LN, ln))
    d = [y - x for x, y in zip(noisy, ln)]
    half = stats.t.ppf(0.95, 3) * statistics.stdev(d) / 2
    assert v.details["half_width"] == pytest.approx(half) and v.verdict == "underpowered"
    # an arm that does not train where the other does: they do not match
    bad = _lm_recs(DYT, [1.5, 1.5], status="diverged") + _lm_recs(DYT, [1.5, 1.5], seeds=[3, 4])
    assert judge(_matches(0.02), bad + _lm_recs(LN, ln)).verdict == "not reproduced"


def test_matches_needs_a_positive_margin_and_only_matches_takes_one():
    with pytest.raises(ValueError, match="needs a margin"):
        claim_from_dict({"id": "x", "text": "t", "kind": "matches", "a": A, "b": B})
    with pytest.raises(ValueError, match="margin applies to kind 'matches' only"):
        claim_from_dict({"id": "x", "text": "t", "kind": "better", "a": A, "b": B, "margin": 0.1})
    with pytest.raises(ValueError, match="positive"):
        claim_from_dict({"id": "x", "text": "t", "kind": "matches", "a": A, "b": B, "margin": -0.1})


def test_variance_ratio_test_and_its_detectable_ratio_against_scipy():
    a, b = [1.50, 1.51, 1.49, 1.50], [1.40, 1.55, 1.62, 1.47, 1.51]
    f = statistics.variance(b) / statistics.variance(a)
    assert variance_ratio_test(a, b) == pytest.approx(stats.f.sf(f, 4, 3))
    # the detectable ratio has the stated power: P(F(4, 3) * ratio > critical) = 0.8
    ratio = detectable_variance_ratio(4, 5)
    critical = stats.f.ppf(0.95, 4, 3)
    assert stats.f.sf(critical / ratio, 4, 3) == pytest.approx(0.80)
    # and a simulation agrees: normal values whose variances differ by that ratio
    rng = np.random.default_rng(0)
    hits = [variance_ratio_test(rng.normal(0, 1, 4), rng.normal(0, math.sqrt(ratio), 5)) < 0.05
            for _ in range(4000)]
    assert np.mean(hits) == pytest.approx(0.80, abs=0.03)
    assert variance_ratio_test([1.0, 1.0], [1.0, 2.0]) == 0.0 and variance_ratio_test([1.0, 1.0], [2.0, 2.0]) == 1.0


def _less_spread(**kw):
    return claim_from_dict({"id": "s", "text": "t", "kind": "less_spread", "a": {"method": "peri_ln"}, "b": LN,
                            "metric": "best_valid_loss", "higher_is_better": False, **kw})


def test_less_spread_verdicts():
    peri = {"method": "peri_ln"}
    tight, wide = [1.500, 1.501, 1.499, 1.500, 1.501], [1.40, 1.60, 1.45, 1.58, 1.52]
    v = judge(_less_spread(), _lm_recs(peri, tight) + _lm_recs(LN, wide))
    assert v.verdict == "reproduced" and v.details["p"] < 0.05
    assert judge(_less_spread(), _lm_recs(peri, wide) + _lm_recs(LN, tight)).verdict == "not reproduced"
    # three seeds each: the test detects only a variance ratio of 76 or more
    v = judge(_less_spread(paper_effect=4.0), _lm_recs(peri, [1.50, 1.52, 1.49]) + _lm_recs(LN, [1.50, 1.55, 1.47]))
    assert v.details["detectable_ratio"] == pytest.approx(stats.f.ppf(0.95, 2, 2) / stats.f.ppf(0.2, 2, 2))
    assert v.verdict == "underpowered"
    with pytest.raises(ValueError, match="above 1"):
        _less_spread(paper_effect=0.5)


def test_loss_spikes_count_runs_above_the_lowest_earlier_loss():
    curve = [(10, 3.0), (20, 2.0), (30, 2.2), (40, 2.5), (50, 2.6), (60, 1.9), (70, 2.3), (80, 1.8),
             (90, float("nan")), (100, 1.7)]
    # margin 0.3 above the running minimum: updates 40-50 (above 2.0 + 0.3) are one spike, 70
    # (2.3 > 1.9 + 0.3) another
    assert loss_spikes(curve, 0.3) == 2
    assert loss_spikes(curve, 1.0) == 0
    assert loss_spikes([(10, 2.0)], 0.3) is None
    assert RULEBOOKS[2].spike_margin == 0.3


def test_fewer_spikes_is_a_better_claim_on_the_loss_spikes_metric():
    """v2 compared spike counts by the paired t-test; v3 by the exact one-sided sign test, whose
    smallest p with 3 pairs is 1/8, so 3 seeds cannot show it ("underpowered"), and 5 pairs
    favouring A (p = 1/32) can."""
    peri = {"method": "peri_ln"}
    claim = claim_from_dict({"id": "f", "text": "t", "kind": "better", "a": peri, "b": LN,
                             "metric": "loss_spikes", "higher_is_better": False})
    records = _lm_recs(peri, [0.0, 0.0, 1.0], metric="loss_spikes") + _lm_recs(LN, [3.0, 4.0, 4.0], metric="loss_spikes")
    v2 = judge(claim, records, 2)
    assert v2.verdict == "reproduced"
    assert v2.details["p"] == pytest.approx(stats.ttest_rel([3.0, 4.0, 4.0], [0.0, 0.0, 1.0], alternative="greater").pvalue)
    v3 = judge(claim, records, 3)
    assert v3.details["p"] == pytest.approx(1 / 8) and v3.details["best_p"] == pytest.approx(1 / 8)
    assert v3.verdict == "underpowered" and "3 favour A, 0 favour B, 0 tied" in v3.measured
    # one spike apart in every pair: the t-test has no spread (p = 0 under v2), the sign test 1/8
    even = _lm_recs(peri, [0.0, 0.0, 0.0], metric="loss_spikes") + _lm_recs(LN, [1.0, 1.0, 1.0], metric="loss_spikes")
    assert judge(claim, even, 2).verdict == "reproduced" and judge(claim, even, 3).verdict == "underpowered"
    tie = (_lm_recs(peri, [0.0, 1.0, 0.0, 2.0, 0.0], metric="loss_spikes")
           + _lm_recs(LN, [2.0, 3.0, 1.0, 2.0, 4.0], metric="loss_spikes"))  # 4 favour A, 1 tie
    v = judge(claim, tie, 3)
    assert v.details["p"] == pytest.approx(stats.binomtest(4, 4, 0.5, alternative="greater").pvalue)  # 1/16
    assert v.verdict == "inconclusive"  # 5 pairs could reach 1/32, the tie left 4
    five = (_lm_recs(peri, [0.0, 1.0, 0.0, 1.0, 0.0], metric="loss_spikes")
            + _lm_recs(LN, [2.0, 3.0, 1.0, 2.0, 4.0], metric="loss_spikes"))  # 5 favour A
    v = judge(claim, five, 3)
    assert v.details["p"] == pytest.approx(1 / 32) and v.verdict == "reproduced"
    # not reproduced at the t path's one-sided level, 0.025: 6 pairs favouring B (p = 1/64), not 5 (1/32)
    worse = _lm_recs(peri, [2.0] * 6, metric="loss_spikes") + _lm_recs(LN, [0.0] * 6, metric="loss_spikes")
    assert judge(claim, worse, 3).verdict == "not reproduced"
    worse5 = _lm_recs(peri, [2.0] * 5, metric="loss_spikes") + _lm_recs(LN, [0.0] * 5, metric="loss_spikes")
    assert judge(claim, worse5, 3).verdict == "inconclusive"


def test_a_sign_test_is_underpowered_only_if_its_best_case_fails_holm_in_its_family():
    """5 pairs can give p = 1/32: alone, or beside a member with a tiny p (Holm tests 1/32 at
    alpha then), 5 of 5 favouring A would reproduce it, so 4 of 5 reads inconclusive; beside a
    member at p = 0.9 the best case is 2 / 32 > 0.05, so it reads underpowered."""
    peri = {"method": "peri_ln"}
    spikes = claim_from_dict({"id": "s", "text": "t", "kind": "better", "a": peri, "b": LN,
                              "metric": "loss_spikes", "higher_is_better": False})
    X = {"method": "x"}
    loss = claim_from_dict({"id": "l", "text": "t", "kind": "better", "a": X, "b": LN,
                            "metric": "best_valid_loss", "higher_is_better": False})
    base = [2.0, 2.1, 1.9, 2.05, 1.95]
    counts = (_lm_recs(peri, [0.0, 1.0, 0.0, 2.0, 0.0], metric="loss_spikes")  # 4 favour A, 1 tie
              + _lm_recs(LN, [2.0, 3.0, 1.0, 2.0, 4.0], metric="loss_spikes"))
    ln_loss = _lm_recs(LN, base)
    for r_count, r_loss in zip([r for r in counts if r.arm == LN], ln_loss):
        r_count.metrics.update(r_loss.metrics)
    much_better = _lm_recs(X, [b - 0.5 - 0.01 * k for k, b in enumerate(base)])  # p ~ 1e-6
    no_better = _lm_recs(X, [b + d for b, d in zip(base, [0.05, -0.02, 0.04, 0.01, 0.03])])  # p ~ 0.9
    tiny = judge_all([spikes, loss], counts + much_better, 3)
    assert tiny[1].details["p"] < 0.001 and tiny[0].details["best_p_holm"] == pytest.approx(1 / 32)
    assert tiny[0].verdict == "inconclusive"
    large = judge_all([spikes, loss], counts + no_better, 3)
    assert large[1].details["p"] > 0.5 and large[0].details["best_p_holm"] == pytest.approx(2 / 32)
    assert large[0].verdict == "underpowered"


def test_v3_member_settled_as_reproduced_enters_at_p_0():
    """A member reproduced without a test enters v3's family at p = 0, which leaves the others'
    Holm p as v2 has it (v2 leaves it out). Here D pairs with the baseline on seeds 5-7, where
    the baseline stalled and D trained; A pairs with it on seeds 1-4, where both trained."""
    base = [29.0, 30.0, 31.0, 30.0]
    a = [29.8, 30.2, 31.5, 30.1]  # one-sided p = 0.043: reproduced alone, not at 2 * p
    p_a = stats.ttest_rel(a, base, alternative="greater").pvalue
    D = {"method": "dsinit"}
    records = (_recs(A, a) + _recs(B, base) + _recs(B, [1.0] * 3, seeds=[5, 6, 7], status="stalled")
               + _recs(D, [30.0] * 3, seeds=[5, 6, 7]))
    claims = [_better("a", A, B), _better("d", D, B)]
    v3 = judge_all(claims, records, 3)
    assert v3[1].verdict == "reproduced" and "p" not in v3[1].details
    assert v3[0].details["family_size"] == 2
    assert v3[0].details["p_holm"] == pytest.approx(holm([p_a, 0.0])[0]) == pytest.approx(p_a)
    assert v3[0].verdict == "reproduced"
    v2 = judge_all(claims, records, 2)
    assert v2[0].details["family_size"] == 1 and v2[0].details["p_holm"] == pytest.approx(p_a)


def test_v3_holm_family_counts_settled_claims_and_sizes_power_at_its_level():
    """v3: a claim settled without a test joins its family (p = 1 when not reproduced), where v2
    left it out; the detectable effect and the seeds needed are at alpha / m."""
    base = [29.0, 30.0, 31.0, 30.0]
    a = [29.8, 30.2, 31.5, 30.1]  # p_a = 0.043
    p_a = stats.ttest_rel(a, base, alternative="greater").pvalue
    D = {"method": "dsinit"}  # its every seed stalled: "not reproduced" without a test
    records = _recs(A, a) + _recs(B, base) + _recs(D, [1.0, 1.0, 1.0, 1.0], status="stalled")
    claims = [_better("a", A, B, paper_effect=0.5), _better("d", D, B)]
    v2 = judge_all(claims, records, 2)
    v3 = judge_all(claims, records, 3)
    assert v2[1].verdict == v3[1].verdict == "not reproduced" and "p" not in v3[1].details
    assert v2[0].details["family_size"] == 1 and v2[0].verdict == "reproduced"  # d left out: p_a alone
    assert v3[0].details["family_size"] == 2 and v3[0].details["p_holm"] == pytest.approx(holm([p_a, 1.0])[0])
    assert v3[0].verdict != "reproduced"  # 2 * p_a > 0.05
    diffs = [x - y for x, y in zip(a, base)]
    sd, n = statistics.stdev(diffs), len(diffs)
    assert v2[0].details["mde"] == pytest.approx(min_detectable_effect(sd, n, 0.05))
    assert v3[0].details["mde"] == pytest.approx(min_detectable_effect(sd, n, 0.025))
    assert v3[0].details["pairs_needed"] == pairs_needed(sd, 0.5, 0.025)
    assert "detectable at 80% power at alpha 0.025" in v3[0].measured


@pytest.mark.parametrize("diffs,holm_p,failed,complete,higher,expected", [
    ([1.0, 0.6, 1.4], 0.01, 0, True, True, "better"),
    ([1.0, 0.6, 1.4], 0.01, 0, True, False, "worse"),  # a loss that rose
    ([-0.02, -0.03, -0.01], 0.04, 0, True, False, "better"),  # a loss that fell
    ([1.0, 0.6, 1.4], 0.05, 0, True, True, "no difference detected"),  # p must be below alpha
    (None, None, 0, True, True, "no difference detected"),
    ([1.0, 0.6, 1.4], 0.01, 1, True, True, "fails"),
    ([1.0, 0.6, 1.4], 0.01, 0, False, True, "incomplete"),
])
def test_rank_against_the_baseline(diffs, holm_p, failed, complete, higher, expected):
    from runner.tables.rulebook import rank_vs_baseline, rulebook
    assert rank_vs_baseline(diffs, holm_p, failed, complete, higher, rulebook()) == expected


@pytest.mark.parametrize("first,second,expected", [
    ("better", "better", "agree"), ("fails", "fails", "agree"),
    ("no difference detected", "no difference detected", "agree"),
    ("better", "worse", "disagree"), ("fails", "better", "disagree"),
    ("fails", "no difference detected", "disagree"),
    ("worse", "no difference detected", "detected in one task only"),
    ("incomplete", "better", "undecided"), ("worse", "incomplete", "undecided"),
])
def test_ranking_agreement_between_two_tasks(first, second, expected):
    from runner.tables.rulebook import ranking_agreement
    assert ranking_agreement(first, second) == expected
    assert ranking_agreement(second, first) == expected


def test_a_suite_that_does_not_decode_counts_no_cell_below_a_bleu_bar():
    """Width scores validation loss only: its claims' lines count diverged, collapsed and stalled
    cells, and no BLEU bar (rule book v2: no bar applies where nothing is decoded); a decoding
    suite's lines keep the count."""
    from runner.tables import suite

    cells = suite.plan("reproduce_width_real")
    for cell in cells:
        if cell.arm["method"] == "post_ln" and cell.arm["model.dim"] == "64" and cell.arm["optim.lr"] == "0.001":
            cell.record = {"status": "ok", "best_valid_loss": 3.4, "valid_loss": 3.4, "bleu": None,
                           "valid_unigram_nll": 5.6, "valid_curve": [[200, 5.0], [2000, 3.4]]}
    judged = {v.claim.id: v for v in suite.verdicts("reproduce_width_real", cells)}
    line = judged["post_ln_fails_6l_w64_lr1e-3"].measured
    assert "0 diverged, 0 collapsed, 0 stalled" in line and "BLEU" not in line
    table2 = suite.plan("reproduce_table2_real")
    for cell in table2:
        if cell.arm["method"] == "pre_ln" and cell.arm["warmup.updates"] == "0":
            cell.record = {"status": "ok", "best_valid_loss": 3.0, "valid_loss": 3.0, "bleu": 30.0,
                           "valid_unigram_nll": 5.6, "valid_curve": [[200, 5.0], [2000, 3.0]]}
    decoded = [v.measured for v in suite.verdicts("reproduce_table2_real", table2) if "method=pre_ln" in v.measured]
    assert any("0 below 10 BLEU" in m for m in decoded)


def test_claims_the_first_rule_book_had_no_rule_for_show_no_v1_verdict():
    """The language-model tier's equivalence, spread and spike claims were written with rule book
    v2: its report's "rule book v1" column reads "-" for them, not "same"."""
    from runner.tables import suite
    from runner.tables.report import render

    text = render("lm", "LM", "reproduce_lm_real", suite.plan("reproduce_lm_real"))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    for cid in ("peri_ln_fewer_spikes", "peri_ln_less_spread", "dyt_matches_layernorm"):
        assert rows[cid].rstrip(" |").endswith("| -"), rows[cid]
    assert rows["post_ln_fails_24l"].rstrip(" |").endswith("| same")


def test_a_report_lists_a_verdict_that_rule_book_v2_read_differently():
    """Table 2's Admin claim on 10 seed pairs with an SD of 0.35: at alpha 0.05 (v2) 0.32 BLEU is
    detectable (inconclusive), at alpha 0.025 (v3, a family of 2) it is not (underpowered); the
    report lists the v2 verdict with the reason."""
    from runner.tables import suite
    from runner.tables.report import render

    a = 0.35 / math.sqrt(10 / 9)  # +a, -a alternating: mean 0, SD 0.35
    assert min_detectable_effect(0.35, 10, 0.05) < 0.32 < min_detectable_effect(0.35, 10, 0.025)
    cells = suite.plan("reproduce_table2_real")
    for cell in cells:
        bleu = {"tfixup": 36.0, "admin": 30.0, "pre_ln": 30.0, "post_ln": 20.0}[cell.arm["method"]] + 0.1 * cell.seed
        bleu += {"tfixup": 0.2, "post_ln": 0.3}.get(cell.arm["method"], 0.0) * (cell.seed % 2)  # some spread
        if cell.arm == {"method": "admin", "warmup.updates": "500"}:
            bleu += a if cell.seed % 2 else -a
        cell.record = {"status": "ok", "bleu": bleu, "best_valid_loss": 3.0, "valid_loss": 3.0,
                       "valid_unigram_nll": 5.6, "valid_curve": [[200, 5.0], [2000, 3.0]]}
    judged = {v.claim.id: v for v in suite.verdicts("reproduce_table2_real", cells)}
    old = {v.claim.id: v for v in suite.verdicts("reproduce_table2_real", cells, version=2)}
    assert old["admin_beats_pre_ln_with_warmup"].verdict == "inconclusive"
    assert judged["admin_beats_pre_ln_with_warmup"].verdict == "underpowered"
    text = render("table2", "Table 2", "reproduce_table2_real", cells)
    line = next(x for x in text.splitlines() if x.startswith("- admin_beats_pre_ln_with_warmup: inconclusive under v2"))
    assert "underpowered now" in line and "since v3 the detectable effect is sized at alpha over the family" in line


@pytest.mark.parametrize("paired,words", [(3, "interval, which with 3 seeds is their range;"),
                                          (10, "interval of the 10 paired differences;")])
def test_the_reason_for_a_changed_better_verdict_names_the_v1_interval_truly(paired, words):
    """A percentile bootstrap of 3 values is their range; of 10 it is not, and the sentence
    beside a changed verdict must not say so."""
    from runner.tables.claims import Verdict
    from runner.tables.report import change_reason

    claim = Claim(id="a_beats_b", text="A beats B", kind="better", a={"method": "a"}, b={"method": "b"},
                  paper_effect=0.32)
    old = Verdict(claim, "inconclusive", "", {"mean_diff": 0.05, "ci_low": -0.2, "ci_high": 0.3, "paired": paired})
    new = Verdict(claim, "underpowered", "", {"paired": paired, "p": 0.44, "p_holm": 0.44,
                                              "family_size": 2, "mde": 0.39})
    reason = change_reason(old, new)
    assert words in reason
    assert "p=0.44 after Holm over 2 comparisons" in reason and "0.39 detectable" in reason
    # v1 settled it by counting (no interval in its details): the sentence says so
    settled = change_reason(Verdict(claim, "reproduced", "", {"a_bad": 0, "b_bad": 3}), new)
    assert settled.startswith("v1 settled it by counting the cells that did not train, without a test;")


# --------------------------------------------------------------------------- rule book v4


def test_v4_tests_a_better_claim_whose_baseline_stalled_where_v3_settled_it_by_count():
    """v3 reads "reproduced" when only B has cells that did not train, with no test; v4 puts the
    stalled cells' recorded values into the same one-sided paired t-test as trained ones."""
    a, b = [30.0, 31.0, 32.0], [1.0, 1.5, 0.5]
    records = _recs(A, a) + _recs(B, b, status="stalled")
    v3 = judge(_better("c", A, B), records, 3)
    assert v3.verdict == "reproduced" and "p" not in v3.details
    v4 = judge(_better("c", A, B), records, 4)
    assert v4.details["p"] == pytest.approx(stats.ttest_rel(a, b, alternative="greater").pvalue, rel=1e-10)
    assert v4.verdict == "reproduced" and "seed 1 +29.00" in v4.measured and "test" not in v4.details
    # stalled arms that are as good as A: v3 still says reproduced, v4's test does not
    close = _recs(A, a) + _recs(B, [29.0, 31.5, 31.8], status="stalled")
    assert judge(_better("c", A, B), close, 3).verdict == "reproduced"
    assert judge(_better("c", A, B), close, 4).verdict == "inconclusive"


def test_v4_decides_pairs_with_a_blown_up_cell_by_outcome_in_an_exact_sign_test():
    a, b = [30.0, 31.0, 32.0, 30.5], [29.0, 30.0, 31.0, 31.0]
    # seeds 1-2: B diverged (A wins by outcome); seed 3: A better; seed 4: B better
    records = (_recs(A, a) + _recs(B, b[:2], seeds=[1, 2], status="diverged")
               + _recs(B, b[2:], seeds=[3, 4]))
    v = judge(_better("c", A, B), records, 4)
    assert v.details["test"] == "sign" and (v.details["wins"], v.details["losses"]) == (3, 1)
    assert v.details["p"] == pytest.approx(stats.binomtest(3, 4, 0.5, alternative="greater").pvalue)
    assert v.details["p_reverse"] == pytest.approx(stats.binomtest(1, 4, 0.5, alternative="greater").pvalue)
    assert "seed 1 B diverged" in v.measured and "seed 4 -0.50" in v.measured
    # the best case of 4 pairs, 1/16 = 0.0625, is above alpha: 4 pairs can never reproduce it
    assert v.verdict == "underpowered"
    # A blew up in every pair where B trained: the reverse test, p = 1/8 with 3 pairs, cannot
    # reject at 0.025 either, so 3 seeds leave it underpowered where v3 said "not reproduced"
    flipped = _recs(A, a[:3], status="collapsed") + _recs(B, b[:3])
    assert judge(_better("c", A, B), flipped, 3).verdict == "not reproduced"
    w = judge(_better("c", A, B), flipped, 4)
    assert (w.details["wins"], w.details["losses"]) == (0, 3) and w.verdict == "underpowered"
    # both blew up: a tie, left out
    both = _recs(A, [1.0, 2.0, 3.0], status="diverged") + _recs(B, [1.0, 2.0, 3.0], status="diverged")
    t = judge(_better("c", A, B), both, 4)
    assert (t.details["wins"], t.details["losses"], t.details["p"]) == (0, 0, 1.0) and "3 tied" in t.measured
    # 6 pairs, every one A's: 1/64 < 0.05
    six = _recs(A, [30.0] * 6) + _recs(B, [1.0] * 6, status="diverged")
    assert judge(_better("c", A, B), six, 4).verdict == "reproduced"


def test_v4_is_the_current_rule_book_and_its_claims_enter_holm_with_their_test_p():
    assert rulebook().version == 4 and RULEBOOKS[4].not_trained_pairs == "test"
    assert RULEBOOKS[3].not_trained_pairs == "settle"
    base = [29.0, 30.0, 31.0, 30.0]
    a = [29.8, 30.2, 31.5, 30.1]  # p_a = 0.043
    D = {"method": "dsinit"}
    records = (_recs(A, a) + _recs(B, base) + _recs(B, [1.0] * 3, seeds=[5, 6, 7], status="stalled")
               + _recs(D, [30.0, 30.5, 29.0], seeds=[5, 6, 7]))
    p_a = stats.ttest_rel(a, base, alternative="greater").pvalue
    p_d = stats.ttest_rel([30.0, 30.5, 29.0], [1.0] * 3, alternative="greater").pvalue
    v4 = judge_all([_better("a", A, B), _better("d", D, B)], records, 4)
    assert [v.details["p_holm"] for v in v4] == pytest.approx(holm([p_a, p_d]))


def test_the_reason_for_a_verdict_v4_changed_names_both_rules():
    from runner.tables.report import change_reason_v3

    a, b = [30.0, 31.0, 32.0], [29.0, 31.5, 31.8]
    records = _recs(A, a) + _recs(B, b, status="stalled")
    old, new = judge(_better("c", A, B), records, 3), judge(_better("c", A, B), records, 4)
    assert (old.verdict, new.verdict) == ("reproduced", "inconclusive")
    p = stats.ttest_rel(a, b, alternative="greater").pvalue
    assert change_reason_v3(old, new) == ("v3 settled it by counting the cells that did not train, without "
                                          f"a test; v4's one-sided paired t-test gives p={p:.3g}.")
    flipped = _recs(A, a, status="collapsed") + _recs(B, b)
    old, new = judge(_better("c", A, B), flipped, 3), judge(_better("c", A, B), flipped, 4)
    assert ("v4's exact sign test, over 3 of its 3 pairs decided by a diverged or collapsed cell, gives p=1"
            in change_reason_v3(old, new))


def test_equal_updates_after_warmup_when_the_validations_never_line_up(monkeypatch):
    """table2 validates every 200 updates and warms Pre-LN up for 500: Pre-LN's points after
    warmup are 100, 300, ..., 1,500 and T-Fixup's 200, ..., 2,000, which never coincide. B
    (Pre-LN) is read at its last validation by 1,500, the last point both reach, and A (T-Fixup,
    the claim's arm) at its last by B's: 1,400 (update 1,400) against 1,500 (update 2,000). With
    the arms' roles swapped, A is still the one held back."""
    from runner.tables import suite
    from runner.tables.report import equal_updates_after_warmup

    cells = suite.plan("reproduce_table2_real")
    loss = {"tfixup": lambda u: 3.0 + 100.0 / u, "pre_ln": lambda u: 3.2 + 100.0 / u}
    for c in cells:
        method = c.arm.get("method")
        if method in loss and c.seed <= 3:
            c.record = {"status": "ok", "bleu": 30.0, "best_valid_loss": 3.0,
                        "valid_curve": [[u, loss[method](u) + 0.01 * c.seed] for u in range(200, 2001, 200)]}
    text = equal_updates_after_warmup("reproduce_table2_real", cells)
    line = [x for x in text.splitlines() if x.startswith("- method=tfixup")][0]
    expected = (3.0 + 100.0 / 1400) - (3.2 + 100.0 / 2000)
    assert f": {expected:+.3f} [95% paired t" in line
    # a claim that Pre-LN (warmup 500) beats T-Fixup: Pre-LN is A now and gets the fewer updates
    import runner.tables.report as report_module

    swapped = [Claim(id="x", text="x", kind="better", a={"method": "pre_ln", "warmup.updates": "500"},
                     b={"method": "tfixup", "warmup.updates": "0"}, metric="best_valid_loss", higher_is_better=False)]
    monkeypatch.setattr(report_module, "preset_claims", lambda preset: swapped)
    text = equal_updates_after_warmup("reproduce_table2_real", cells)
    assert "at 1,300 and 1,400 updates after warmup" in text and "(updates 1,800 and 1,400)" in text
    assert ("at 1,400 and 1,500 updates after warmup (their validations never line up: each arm's last "
            "validation by 1,500, so A has no more updates than B) (updates 1,400 and 2,000), 3 seeds") in line


def test_a_report_renders_a_verdict_v4_changed_with_its_reasons():
    """Table 2 with Pre-LN's warmup seed 1 diverged: v1 and v3 settle "T-Fixup beats Pre-LN" by
    counting (reproduced); v4 decides that pair by outcome, so the 3 pairs go to the sign test,
    whose smallest p is 1/8: underpowered. The report lists both changes with their reasons."""
    from runner.tables import suite
    from runner.tables.report import render

    cells = suite.plan("reproduce_table2_real")
    for cell in cells:
        bleu = {"tfixup": 36.0, "admin": 30.0, "pre_ln": 29.5, "post_ln": 20.0}[cell.arm["method"]]
        cell.record = {"status": "ok", "bleu": bleu + 0.1 * cell.seed + 0.05 * (cell.seed % 2),
                       "best_valid_loss": 3.0, "valid_loss": 3.0, "valid_unigram_nll": 5.6,
                       "valid_curve": [[200, 5.0], [2000, 3.0]]}
        if cell.arm == {"method": "pre_ln", "warmup.updates": "500"} and cell.seed == 1:
            cell.record.update(status="diverged", bleu=None, initial_loss=9.0, first_logged_loss=40.0)
    judged = {v.claim.id: v for v in suite.verdicts("reproduce_table2_real", cells)}
    v3 = {v.claim.id: v for v in suite.verdicts("reproduce_table2_real", cells, version=3)}
    assert v3["tfixup_beats_pre_ln"].verdict == "reproduced" and "p" not in v3["tfixup_beats_pre_ln"].details
    new = judged["tfixup_beats_pre_ln"]
    assert new.verdict == "underpowered" and new.details["test"] == "sign"
    assert (new.details["wins"], new.details["losses"], new.details["by_outcome"]) == (3, 0, 1)
    text = render("table2", "Table 2", "reproduce_table2_real", cells)
    v1_line = next(x for x in text.splitlines() if x.startswith("- tfixup_beats_pre_ln: reproduced under v1"))
    assert ("v1 settled it by counting the cells that did not train, without a test; v4's exact sign test, "
            "over 1 of its 3 pairs decided by a diverged or collapsed cell, gives p=") in v1_line
    assert "even every pair favouring A could not bring it below alpha" in v1_line
    v3_line = next(x for x in text.splitlines() if x.startswith("- tfixup_beats_pre_ln: reproduced under v3"))
    assert "v3 settled it by counting the cells that did not train, without a test; v4's exact sign test" in v3_line


def test_the_reasons_say_what_each_older_book_did_with_cells_that_did_not_train():
    """The reason lines name what the older book really did: settled by counting, tested only the
    pairs where both cells trained, or had too few of those for a test."""
    from runner.tables.report import change_reason, change_reason_v2, change_reason_v3

    # A stalled in seeds 1-2 and B in 1-3 (A trained in 3): v1-v3 have 0 pairs where both trained
    # and settle nothing (B has more bad cells, but A has some): no test; v4 tests the 3 pairs
    records = (_recs(A, [20.0, 21.0], seeds=[1, 2], status="stalled") + _recs(A, [30.0], seeds=[3])
               + _recs(B, [5.0, 6.0, 7.0], status="stalled"))
    new = judge(_better("c", A, B), records, 4)
    for version, reason in ((1, change_reason), (2, change_reason_v2), (3, change_reason_v3)):
        old = judge(_better("c", A, B), records, version)
        assert old.verdict == "inconclusive" and "p" not in old.details
        assert reason(old, new).startswith(f"v{version} had 0 pair(s) where both cells trained, fewer than 2, "
                                           "so it read no test; v4's one-sided paired t-test gives p="), version
    # both arms diverged in seed 3: v3 tests the 2 pairs where both trained, v4 all 3 (1 by outcome)
    records = (_recs(A, [30.0, 31.0]) + _recs(A, [1.0], seeds=[3], status="diverged")
               + _recs(B, [29.0, 29.5]) + _recs(B, [1.0], seeds=[3], status="diverged"))
    old, new = judge(_better("c", A, B), records, 3), judge(_better("c", A, B), records, 4)
    assert old.details["paired"] == 2 and new.details["by_outcome"] == 1
    assert new.details["best_p"] == 0.25  # 2 pairs could favour A; the third is a tie by outcome
    assert change_reason_v3(old, new).startswith(
        "v3 tested the 2 pairs where both cells trained, v4 all 3 pairs, those with a cell that did not "
        "train included, 1 of them decided by outcome; v4's exact sign test")
    assert change_reason_v2(judge(_better("c", A, B), records, 2), new).startswith("v2 tested the 2 pairs")
    # A blew up in one pair: that pair stays a loss in the best case (binomial, not 1/2^n)
    lost = _recs(A, [30.0, 31.0]) + _recs(A, [1.0], seeds=[3], status="collapsed") + _recs(B, [29.0, 29.5, 30.0])
    v = judge(_better("c", A, B), lost, 4)
    assert v.details["best_p"] == pytest.approx(stats.binomtest(2, 3, 0.5, alternative="greater").pvalue)


# --------------------------------------------------------------------------- run-time rules
def test_every_judged_preset_applies_the_rule_books_run_time_rules():
    """The runs apply the divergence bound, its patience and the stall margin; the rule book that
    judges their records states them: every real and GPU tier preset sets the same values."""
    from runner.sweep.plan import load_preset
    from runner.tables.targets import TARGETS

    presets = {part.preset for target in TARGETS.values() for tier in ("real", "gpu")
               for part in target.parts.get(tier, ())}
    assert len(presets) >= 15
    book = rulebook()
    for name in sorted(presets):
        check_preset(load_preset(name), name)  # raises on a disagreement
        divergence = load_preset(name)["trainer"]["divergence"]
        assert (divergence["loss_bound"], divergence["patience"]) == (book.divergence_bound,
                                                                      book.divergence_patience), name


def test_a_preset_that_disagrees_with_the_rule_book_is_refused_naming_the_key():
    ok = {"trainer": {"divergence": {"loss_bound": 10.0, "patience": 50, "stall_margin": 0.1}}}
    check_preset(ok, "mine")
    with pytest.raises(ConfigError, match=r"^sweeps/mine.yaml sets trainer.divergence.patience=20; "
                                          r"rule book v\d+ .* at trainer.divergence.patience=50$"):
        check_preset({"trainer": {"divergence": {"loss_bound": 10.0, "patience": 20}}}, "mine")
    # a key left out takes the trainer's default (20 nats), which is not the rule book's bound
    assert DivergenceConfig().loss_bound != rulebook().divergence_bound
    with pytest.raises(ConfigError, match="leaves trainer.divergence.loss_bound at the trainer's default 20"):
        check_preset({"trainer": {}}, "mine")


def test_a_suite_whose_preset_disagrees_is_not_planned(monkeypatch):
    from runner.tables import plan
    from runner.tables.targets import TARGETS

    real = plan.load_preset

    def loosened(name):
        preset = real(name)
        preset["trainer"]["divergence"]["loss_bound"] = 20.0
        return preset

    monkeypatch.setattr(plan, "load_preset", loosened)
    with pytest.raises(ConfigError, match="sets trainer.divergence.loss_bound=20.0"):
        plan.real_suite(TARGETS["table2"])


def test_the_check_reads_numbers_as_hydra_does_and_covers_every_suite_a_pool_may_report(monkeypatch):
    # YAML reads 1e1 as the string "1e1", Hydra as 10.0: the same bound
    check_preset({"trainer": {"divergence": {"loss_bound": "1e1", "patience": 50, "stall_margin": 0.1}}}, "mine")
    with pytest.raises(ConfigError, match="loss_bound=abc"):
        check_preset({"trainer": {"divergence": {"loss_bound": "abc", "patience": 50}}}, "mine")
    from runner.tables import plan
    from runner.tables.targets import TARGETS

    plan.check_judged_presets(TARGETS)  # every committed preset agrees
    original = plan.load_preset

    def one_loosened(name):
        preset = original(name)
        if name == "reproduce_lm_real":
            preset["trainer"]["divergence"]["patience"] = 10
        return preset

    monkeypatch.setattr(plan, "load_preset", one_loosened)
    plan.check_judged_presets({"table2": TARGETS["table2"]})
    with pytest.raises(ConfigError, match="reproduce_lm_real.yaml sets trainer.divergence.patience=10"):
        plan.check_judged_presets({"table2": TARGETS["table2"], "lm": TARGETS["lm"]})
