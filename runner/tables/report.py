"""A suite's report: a row per arm (seeds, outcomes by the rule book, means with spread and 95%
intervals over seeds), notes on how cells failed or stopped, and each claim with its verdict,
written to results/<target>/<tier>/report.md with its plots (runner/tables/plots.py)."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from runner.config import TrainerConfig
from runner.decode.signature import signature_note
from runner.files import atomic_write_text
from runner.run.status import DIVERGED, FAILED, run_status
from runner.sweep.plan import load_preset
from runner.sweep.report import markdown_table
from runner.tables.claims import Verdict, selector_matches
from runner.tables.evidence import selector_label
from runner.tables.plots import grid_axes, plot_curves, plot_grid, plot_transfer, transfer_panels
from runner.tables.rulebook import CURRENT, blow_up_cause, describe, rulebook
from runner.tables.statistics import Summary, paired_difference, summarize
from runner.tables.suite import (
    SuiteCell,
    cell_bleu_last,
    cell_outcome,
    finite_mean,
    finite_values,
    fmt_number,
    load_preset_value,
    preset_claims,
    results_dir,
    suite_decodes,
    verdicts,
)


def bleu_last_note(averaged: Sequence[int]) -> str:
    """The note on the "BLEU last ckpt" column; `averaged`: how many checkpoints BLEU (tok) averages
    (one number per suite of the table)."""
    counts = " or ".join(str(n) for n in sorted(set(averaged)))
    return ("BLEU last ckpt: the tokenized BLEU of each ok seed's last checkpoint alone "
            "(trainer.final_bleu_last, or measured afterwards: last-checkpoint-bleu.jsonl), beside "
            f"BLEU (tok) of the last {counts} checkpoints averaged; '-' unless every ok seed of the arm has it.")


def checkpoints_averaged(preset: str) -> int:
    """How many numbered checkpoints a suite's final BLEU averages: the last
    trainer.eval_average_last of the trainer.keep_checkpoints it keeps (the Config's defaults where
    the preset sets neither)."""
    trainer = load_preset(preset).get("trainer") or {}
    fields = {f.name: f.default for f in dataclasses.fields(TrainerConfig)}
    keep = int(trainer.get("keep_checkpoints", fields["keep_checkpoints"]))
    average = int(trainer.get("eval_average_last", fields["eval_average_last"]))
    # runner/run/evaluate.py select_checkpoints: checkpoint_last.pt alone without numbered ones
    # or with average_last <= 1
    return min(keep, average) if keep > 0 and average > 1 else 1


SLOPE_NOTE = ("slope: change of the validation loss per 1,000 updates from each run's last validation at least "
              "400 updates before its end (mean over the arm's ok seeds); near 0 when the curve has flattened.")


def _summary_text(s: Summary, spec: str) -> str:
    if s.mean is None:
        return "-"
    if s.std is None:
        return f"{s.mean:{spec}} (n=1)"
    return f"{s.mean:{spec}} ± {s.std:{spec}} [{s.ci_low:{spec}}, {s.ci_high:{spec}}]"


def curve_slope(curve: Sequence[Sequence[float]], span: int = 400) -> Optional[float]:
    """Change of the validation loss per 1,000 updates over the last `span` updates of a curve
    of (update, loss) points: near 0 when the curve has flattened."""
    if len(curve) < 2:
        return None
    last_step, last_loss = curve[-1]
    earlier = [p for p in curve if p[0] <= last_step - span] or [curve[0]]
    step, loss = earlier[-1]
    return None if step == last_step else 1000.0 * (last_loss - loss) / (last_step - step)


def arms_of(cells: Sequence[SuiteCell]) -> dict[tuple, list[SuiteCell]]:
    """The cells grouped by arm (the axes other than the seed), in the order the arms first appear."""
    arms: dict[tuple, list[SuiteCell]] = {}
    for cell in cells:
        arms.setdefault(tuple(cell.arm.items()), []).append(cell)
    return arms


# the columns arm_row gives, after the arm's name and before the training minutes
ARM_COLUMNS = ("seeds", "diverged", "collapsed", "stalled", "< BLEU bar", "BLEU (tok)", "sacreBLEU",
               "best valid loss", "slope")
BLEU_LAST_COLUMN = "BLEU last ckpt"  # after "BLEU (tok)", in a table where some cell has bleu_last


def arm_columns(last: bool = False) -> tuple[str, ...]:
    """ARM_COLUMNS, with the last checkpoint's BLEU after the averaged one when `last`."""
    i = ARM_COLUMNS.index("BLEU (tok)") + 1
    return ARM_COLUMNS[:i] + ((BLEU_LAST_COLUMN,) if last else ()) + ARM_COLUMNS[i:]


def _arm_bleu_last(members: Sequence[SuiteCell]) -> Optional[list[float]]:
    """The last checkpoint's BLEU of each ok seed of an arm, or None unless every ok seed has it
    (a mean over some of the seeds would not compare with the averaged BLEU beside it)."""
    ok = [c for c in members if c.record is not None and c.record["status"] == "ok"]
    values = [cell_bleu_last(c) for c in ok]
    if not ok or any(v is None for v in values):
        return None
    return [v for v in values if math.isfinite(v)]


def has_bleu_last(cells: Sequence[SuiteCell]) -> bool:
    """Whether some arm of these cells has the last checkpoint's BLEU of every ok seed."""
    return any(_arm_bleu_last(members) is not None for members in arms_of(cells).values())


def arm_row(members: Sequence[SuiteCell], gpu: bool = False, last: bool = False,
            decoded: Optional[bool] = None) -> list[str]:
    """One arm's columns after its name: seeds with a record / planned; how many diverged,
    collapsed, stalled, or decoded below the BLEU bar (rule book outcomes; "-" for the bar in a
    suite that does not decode, `decoded`); BLEU (with `last`, the last checkpoint's BLEU),
    sacreBLEU, best validation loss (means over the seeds that neither diverged, collapsed nor
    stalled), curve slope, minutes of training; `gpu` adds the seconds per update and the peak GPU
    memory."""
    done = [c.record for c in members if c.record is not None]
    decoded = suite_decodes(members) if decoded is None else decoded
    outcomes = [cell_outcome(r, decoded) for r in done]
    ok = [r for r, o in zip(done, outcomes) if o in ("ok", "below_bar")]  # what the means average

    def values(key: str, ok_only: bool = True) -> list[float]:
        return finite_values(ok if ok_only else done, key, ok_only=False)

    bleu_last = _arm_bleu_last(members)
    return [
        f"{len(done)}/{len(members)}",
        *(str(outcomes.count(o)) for o in ("diverged", "collapsed", "stalled")),
        str(outcomes.count("below_bar")) if decoded else "-",
        _summary_text(summarize(values("bleu")), ".2f"),
        *(("-" if bleu_last is None else _summary_text(summarize(bleu_last), ".2f"),) if last else ()),
        _summary_text(summarize(values("sacrebleu")), ".2f"),
        _summary_text(summarize(values("best_valid_loss")), ".3f"),
        fmt_number(finite_mean([curve_slope(r.get("valid_curve") or []) for r in ok]), "+.3f"),
        fmt_number(sum(r.get("wall_s") or 0 for r in done) / 60, ".0f"),
        *((fmt_number(finite_mean(values("seconds_per_update", ok_only=False)), ".3f"),
           fmt_number(finite_mean(values("peak_memory_mb", ok_only=False)), ",.0f")) if gpu else ()),
    ]


def arm_rows(cells: Sequence[SuiteCell], gpu: bool = False, last: bool = False) -> list[list[str]]:
    """One row per arm; `gpu` adds the seconds per update and the peak GPU memory, `last` the
    last checkpoint's BLEU."""
    return [[" ".join(f"{k}={v}" for k, v in arm), *arm_row(members, gpu, last)]
            for arm, members in arms_of(cells).items()]


def provenance(records: Sequence[dict]) -> str:
    """The commits and machines that produced these records, in one line."""
    commits = sorted({(r.get("machine") or {}).get("git_commit") or "?" for r in records})
    machines = sorted({f"{(r.get('machine') or {}).get('device_name')}, "
                       f"{(r.get('machine') or {}).get('threads')} thread(s), torch "
                       f"{(r.get('machine') or {}).get('torch')}" for r in records})
    line = f"Commits: {', '.join(c[:10] for c in commits) or '-'}. Machines: {'; '.join(machines) or '-'}."
    wall = [r["wall_s"] / 60 for r in records if r.get("wall_s")]
    if wall:  # what a user plans a sitting by; a diverged cell stops early and counts as it ran
        line += (f" Wall time per cell: median {float(np.median(wall)):.1f} min "
                 f"({min(wall):.1f} to {max(wall):.1f}).")
    return line


def blow_up_note(cells: Sequence[SuiteCell]) -> str:
    """When the diverged cells blew up: at initialization (the loss at update 0 already above the
    divergence bound), during training, or unknown (a record from before the loss at update 0 was
    recorded); "" when no cell diverged."""
    diverged = [c for c in cells if c.record is not None and c.record["status"] == "diverged"]
    if not diverged:
        return ""
    causes = [blow_up_cause(c.record, rulebook().divergence_bound) for c in diverged]
    counts = ", ".join(f"{causes.count(k)} {k}" for k in ("at initialization", "during training", "unknown")
                       if causes.count(k))
    losses = []
    for key, words in (("initial_loss", "the loss at update 0"), ("first_logged_loss", "at the first logged update")):
        recorded = [_float_or_none(c.record.get(key)) for c in diverged]
        values = [v for v in recorded if v is not None and math.isfinite(v)]
        not_finite = sum(v is not None and not math.isfinite(v) for v in recorded)
        if values:
            losses.append(f"{words} {min(values):.3g}" + (f" to {max(values):.3g}" if len(values) > 1 else "")
                          + (f" ({not_finite} not finite)" if not_finite else ""))
        elif not_finite:
            losses.append(f"{words} not finite in {not_finite}")
    return (f"Diverged cells by when they blew up (the loss at update 0 against the divergence bound): {counts}"
            + ("; unknown: a record without the loss at update 0 (trained before it was recorded)"
               if "unknown" in causes else "")
            + (f". Their training losses: {', '.join(losses)} nats." if losses else "."))


def stop_note(cells: Sequence[SuiteCell], rule_set: bool = False) -> str:
    """Where the stopping rule ended the runs of a suite that sets one: `rule_set`, the preset sets
    trainer.early_stop (else read from the records; "" when none has it). A suite whose every run
    reached the cap says so too."""
    ran = [c.record for c in cells if c.record is not None and c.record.get("stopped_early") is not None
           and (run_status(dict(c.record)) or FAILED) not in (DIVERGED, FAILED)]  # neither stopped nor capped
    if not ran or not (rule_set or any(r.get("early_stop") or r.get("stopped_early") for r in ran)):
        return ""
    stopped = sorted(r["stop_update"] for r in ran if r.get("stopped_early"))
    capped = len(ran) - len(stopped)
    text = f"Stopping rule: {len(stopped)} of {len(ran)} cells stopped on a flat curve"
    if stopped:
        text += f" (at update {stopped[0]:,} to {stopped[-1]:,})"
    if capped:
        text += f"; {capped} reached the cap still improving, so their scores are at a budget, not at convergence"
    return text + "."


def _cell_warmup(cell: SuiteCell) -> Optional[int]:
    """The cell's warmup updates: its arm's value, else its preset's (None when neither sets it)."""
    value = cell.arm.get("warmup.updates")
    number = load_preset_value(cell, "warmup.updates") if value is None else _float_or_none(value)
    return int(number) if number is not None and math.isfinite(number) else None


def _float_or_none(value) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _arm_curves(cells: Sequence[SuiteCell], selector, decoded: bool) -> Optional[tuple[int, dict]]:
    """(warmup, {seed: {update: validation loss}}) of the one arm `selector` picks, over the seeds
    the means average and their finite validation losses; None when it picks no arm or several,
    or cells whose warmup is unknown."""
    picked = [c for c in cells if selector_matches(c.arm, selector)]
    warmups = {_cell_warmup(c) for c in picked}
    if not picked or len({tuple(sorted(c.arm.items())) for c in picked}) != 1 or None in warmups:
        return None
    curves = {}
    for c in picked:
        if c.record is None or cell_outcome(c.record, decoded) not in ("ok", "below_bar"):
            continue
        curve = {int(step): float(loss) for step, loss in c.record.get("valid_curve") or []
                 if isinstance(loss, (int, float)) and math.isfinite(loss)}
        if curve:
            curves[c.seed] = curve
    return warmups.pop(), curves


def equal_updates_after_warmup(preset: str, cells: Sequence[SuiteCell]) -> str:
    """For each pair of arms a "better" claim compares whose warmups differ (T-Fixup without
    warmup against Pre-LN with 500 updates of it): the validation loss of A minus B's at the same
    number of updates after each arm's own warmup, paired by seed, at the last such point that the
    validation curves of every pair have; where they have none (a warmup that is no multiple of
    the validation interval), B at its last validation by the last point both reach and A at its
    last by B's, so A never has more updates after warmup than B. "" when no claim compares such
    arms or no pair has a point. Seeds: those the means average (not diverged, collapsed or
    stalled) with a validation curve."""
    claims = preset_claims(preset)
    decoded = suite_decodes(cells)
    lines, seen = [], set()
    for claim in claims:
        if claim.b is None or claim.kind != "better":
            continue
        arms = [_arm_curves(cells, sel, decoded) for sel in (claim.a, claim.b)]
        if None in arms or arms[0][0] == arms[1][0] or (str(claim.a), str(claim.b)) in seen:
            continue
        seen.add((str(claim.a), str(claim.b)))
        (wa, curves_a), (wb, curves_b) = arms
        seeds = sorted(set(curves_a) & set(curves_b))
        if not seeds:
            continue
        # the updates after warmup at which every seed of an arm was validated
        offsets_a = set.intersection(*[{step - wa for step in curves_a[s] if step >= wa} for s in seeds])
        offsets_b = set.intersection(*[{step - wb for step in curves_b[s] if step >= wb} for s in seeds])
        if not offsets_a or not offsets_b:
            continue
        # the last point both arms were validated at, else (validations that never line up) B's
        # last by the last point both reach and A's last by B's
        horizon = min(max(offsets_a), max(offsets_b))
        if offsets_a & offsets_b:
            after_a = after_b = max(offsets_a & offsets_b)
        else:  # B at its last validation by the horizon, A (the claim's arm) at its last by B's:
            # A never gets more updates after warmup than B, against the claim
            after_b = max((o for o in offsets_b if o <= horizon), default=None)
            after_a = max((o for o in offsets_a if after_b is not None and o <= after_b), default=None)
            if after_a is None or after_b is None:
                continue
        a = {s: curves_a[s][after_a + wa] for s in seeds}
        b = {s: curves_b[s][after_b + wb] for s in seeds}
        diff = paired_difference(a, b)
        each = ", ".join(f"seed {s} {a[s] - b[s]:+.3f}" for s in seeds)
        interval = ("" if diff.std is None else
                    f" [95% paired t {diff.ci_low:+.3f}, {diff.ci_high:+.3f}]")
        at = (f"at {after_a:,} updates after warmup" if after_a == after_b else
              f"at {after_a:,} and {after_b:,} updates after warmup (their validations never line up: "
              f"each arm's last validation by {after_b:,}, so A has no more updates than B)")
        lines.append(f"- {selector_label(claim.a)} - {selector_label(claim.b)}: {diff.mean:+.3f}{interval} "
                     f"{at} (updates {after_a + wa:,} and {after_b + wb:,}), "
                     f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({each})")
    if not lines:
        return ""
    return "\n".join(["Equal updates after warmup: the validation loss (nats; lower is better) of each "
                      "pair of arms a claim compares whose warmups differ, each at the same number of "
                      "updates after its own warmup, paired by seed (the seeds the means average), at "
                      "the last validation every pair has (where the validations never line up, B at "
                      "its last one by the last point both reach and A, the claim's arm, at its last "
                      "one by B's; the line gives each arm's updates):", *lines])


def render(target: str, title: str, preset: str, cells: Sequence[SuiteCell], tier: str = "real") -> str:
    done = [c.record for c in cells if c.record is not None]
    gpu = tier == "gpu"
    last = has_bleu_last(cells)
    signature = signature_note(done)  # the sacreBLEU column's true signature
    stops = bool((load_preset(preset).get("trainer") or {}).get("early_stop"))
    stopped = stop_note(cells, stops)
    after_warmup = equal_updates_after_warmup(preset, cells)  # "" where no claim compares such arms
    header = ["arm", *arm_columns(last), "GPU min" if gpu else "CPU min", *(("s/update", "peak MiB") if gpu else ())]
    lines = [f"# {title}: real-data tier{' on a GPU' if gpu else ''}", "",
             f"Preset `sweeps/{preset}.yaml`; {len(done)} of {len(cells)} cells have a record. "
             f"Each arm: {MEAN_WORDS}", "",
             describe(rulebook()) + ("" if suite_decodes(cells) else
                                     " This suite scores validation loss only, so no BLEU bar applies."), "",
             provenance(done), "",
             markdown_table(header, arm_rows(cells, gpu, last)), "",
             *([blow_up_note(cells), ""] if blow_up_note(cells) else []),
             *([stopped, ""] if stopped else []),
             *([after_warmup, ""] if after_warmup else []),
             SLOPE_NOTE, "",
             *([signature, ""] if signature else []),
             *([bleu_last_note([checkpoints_averaged(preset)]), ""] if last else []),
             *(["s/update: training seconds per update; peak MiB: the CUDA allocator's peak of "
                "the cell's process (means over the arm's trained seeds, whatever their status).",
                ""] if gpu else []),
             *([f"heatmap.png: per {' '.join(grid_axes(preset))} setting, the mean best validation "
                "loss of the ok seeds and how many seeds diverged or stalled.", ""]
               if grid_axes(preset) else []),
             *(["transfer.png: for each transfer claim, the mean best validation loss against "
                "the tuned setting, one line per depth; a star marks each line's best, dots the "
                "seeds, crosses on the top edge diverged or stalled cells.", ""]
               if transfer_panels(preset, []) else []),
             "## Claims (rules written in the preset before the run)", "",
             "A verdict is final once every cell of the arms it compares has a record (for a "
             "Holm-corrected claim, once no claim of its family that misses cells could change it); "
             "until then it reads \"incomplete\". A claim marked † was added later, for the reason given "
             "below the table; it stands beside the claims written before the run and replaces "
             "none of them. \"rule book v1\" gives the verdict under the first rules where it "
             "differs, with the reason below the table ('-': a kind of claim the first rules had no "
             "rule for); a verdict that version 2 or 3 read differently is listed there too.", ""]
    judged = verdicts(preset, cells)
    old = verdicts(preset, cells, version=1)
    rows = [[v.claim.id + (" †" if v.claim.added else ""), v.claim.text, v.measured, f"**{v.verdict}**",
             "-" if not v1_has_rule(v.claim) else "same" if o.verdict == v.verdict else o.verdict]
            for v, o in zip(judged, old)]
    lines += [markdown_table(["claim", "paper", "measured", "verdict", "rule book v1"], rows)
              if rows else "(none)", ""]
    changed = [f"- {v.claim.id}: {o.verdict} under v1, {v.verdict} now: {change_reason(o, v)}"
               for v, o in zip(judged, old) if v1_has_rule(v.claim) and o.verdict != v.verdict]
    for version, reason in ((2, change_reason_v2), (3, change_reason_v3)):
        if version < CURRENT:
            changed += [f"- {v.claim.id}: {o.verdict} under v{version}, {v.verdict} now: {reason(o, v)}"
                        for v, o in zip(judged, verdicts(preset, cells, version=version))
                        if o.verdict != v.verdict]
    if changed:
        lines += ["Verdicts that changed with the rule book:", "", *changed, ""]
    reasons: dict[str, list[str]] = {}  # claims added for one reason share its line
    for v in judged:
        if v.claim.added:
            reasons.setdefault(v.claim.added, []).append(v.claim.id)
    for reason, ids in reasons.items():  # one paragraph each
        lines += [f"† {', '.join(ids)}: {reason}", ""]
    return "\n".join(lines)


def v1_has_rule(claim) -> bool:
    """Whether rule book v1 decides this kind of claim: equivalence, spread and loss-spike claims
    were written with version 2 (for the language-model tier) and have no v1 reading."""
    return claim.kind not in ("matches", "less_spread") and claim.metric != "loss_spikes"


MEAN_WORDS = ("mean ± std over seeds [95% Student-t CI of the mean]; seeds that diverged, collapsed or "
              "stalled are counted apart and left out of the means; seeds below the BLEU bar are counted "
              "and kept in them.")


def change_reason(old: Verdict, new: Verdict) -> str:
    """One sentence on why a claim's verdict differs between rule book v1 (`old`) and the current one."""
    d, kind = new.details, new.claim.kind
    provisional = new.verdict == "incomplete" or old.verdict == "incomplete"
    prefix = "(provisional) " if provisional else ""
    if kind in ("trains", "fails_to_train", "more_failed"):
        extra = {k: d.get(k, 0) for k in ("collapsed", "below_bar") if d.get(k)}
        if extra:
            names = {"collapsed": "collapsed", "below_bar": "below the BLEU bar"}
            words = " and ".join(f"{n} {names[k]}" for k, n in extra.items())
            return (prefix + f"v2 counts {words} as not trained (v1 read the recorded status"
                    + (" and the claim's own BLEU bar)" if new.claim.min_bleu is not None else ")"))
        return prefix + "v2 applies one BLEU bar and the collapse rule to every suite, in place of the claim's own bar."
    if kind == "better":
        if "p" not in d:
            return prefix + f"{_old_reading(old, 1)}; {_untested_words(d)}."
        return prefix + f"{_old_reading(old, 1)}; {_test_words(d)}{_underpowered_words(new)}."
    if kind == "same_best":
        return (prefix + f"v2 also asks each seed's own best to be the shared best; "
                f"{d.get('seeds_agreeing', 0)} of {len(d.get('per_seed_best', {}))} seeds agree.")
    return prefix + "v2 reads the cells' outcomes under its own definitions."


def _v1_interval_words(paired: Optional[int]) -> str:
    # a percentile bootstrap of 2 or 3 values is their range (rulebook.py, v1)
    interval = (f", which with {paired} seeds is their range" if paired is not None and paired <= 3
                else f" of the {paired} paired differences")
    return f"v1 read the 95% percentile bootstrap interval{interval}"


def _test_words(d: Mapping) -> str:
    """The current rule book's test of a "better" claim (its details `d`), in words."""
    p = d.get("p_holm", d["p"])
    holm = f" after Holm over {d['family_size']} comparisons" if d.get("family_size", 1) > 1 else ""
    if d.get("test") != "sign":
        return f"v{CURRENT}'s one-sided paired t-test gives p={p:.3g}{holm}"
    what = (f"{d['by_outcome']} of its {len(d.get('diffs', {}))} pairs decided by a diverged or collapsed cell"
            if d.get("by_outcome") else f"the counts of its {len(d.get('diffs', {}))} pairs")
    return f"v{CURRENT}'s exact sign test, over {what}, gives p={p:.3g}{holm}"


def _underpowered_words(new: Verdict) -> str:
    d = new.details
    if new.verdict != "underpowered":
        return ""
    if d.get("test") == "sign":
        return (f", and even every pair favouring A could not bring it below alpha (smallest p "
                f"{d.get('best_p_holm', d.get('best_p', 1.0)):.3g})")
    if d.get("mde") is not None:
        return (f", and the paper's effect is below the {d['mde']:.2f} detectable at "
                f"{rulebook().power:.0%} power")
    return ""


def _untested_words(d: Mapping) -> str:
    return (f"v{CURRENT} has {d.get('paired', 0)} seed pair(s) with a value to test, fewer than 2, "
            "so it reads no test")


def _old_reading(old: Verdict, version: int) -> str:
    """How rule book `version` (1 to 3) read a "better" claim, from its verdict's details."""
    o = old.details
    if "ci_low" in o and "p" not in o:
        return _v1_interval_words(o.get("paired"))
    if "p" in o:
        return f"v{version} tested the {o.get('paired')} pairs where both cells trained"
    a_bad, b_bad = o.get("a_bad", 0), o.get("b_bad", 0)
    if (b_bad > a_bad == 0) or a_bad > b_bad:
        return f"v{version} settled it by counting the cells that did not train, without a test"
    return (f"v{version} had {o.get('paired', 0)} pair(s) where both cells trained, fewer than 2, "
            "so it read no test")


def _pairs_changed(o: Mapping, d: Mapping) -> bool:
    """Whether v4 tested other pairs than the older book (stalled, below-bar or blown-up ones)."""
    return o.get("paired") != d.get("paired") or bool(d.get("by_outcome"))


def _pairs_words(o: Mapping, d: Mapping, version: int) -> str:
    outcome = f", {d['by_outcome']} of them decided by outcome" if d.get("by_outcome") else ""
    return (f"v{version} tested the {o.get('paired')} pairs where both cells trained, v{CURRENT} all "
            f"{d.get('paired')} pairs, those with a cell that did not train included{outcome}")


def change_reason_v2(old: Verdict, new: Verdict) -> str:
    """One sentence on why a "better" claim's verdict differs between rule book v2 (`old`) and the
    current one: v3's families, power and counts, and v4's pairs with cells that did not train."""
    d, o = new.details, old.details
    prefix = "(provisional) " if "incomplete" in (new.verdict, old.verdict) else ""
    if "p" not in d:
        return prefix + f"{_old_reading(old, 2)}; {_untested_words(d)}."
    parts = []
    if "p" not in o:
        parts.append(f"{_old_reading(old, 2)}; {_test_words(d)}")
    elif _pairs_changed(o, d):
        parts.append(f"{_pairs_words(o, d, 2)}; {_test_words(d)}")
    else:
        if d.get("test") == "sign":
            parts.append(f"since v3 counts are compared by the exact sign test (p={d['p']:.3g}; the smallest p "
                         f"its pairs can give is {d['best_p']:.3g}), in v2 by the paired t-test")
        if d.get("family_size") != o.get("family_size"):
            parts.append(f"since v3 the Holm family is every planned claim against the baseline "
                         f"({d.get('family_size')}), in v2 only those that reached a test ({o.get('family_size')})")
        if d.get("mde") is not None and o.get("mde") is not None and d["mde"] != o["mde"]:
            parts.append(f"since v3 the detectable effect is sized at alpha over the family ({d['mde']:.2f}), "
                         f"in v2 at alpha ({o['mde']:.2f})")
    return (prefix + ("; ".join(parts) or "the rules since v3 correct and power a family's claims differently")
            + _underpowered_words(new) + ".")


def change_reason_v3(old: Verdict, new: Verdict) -> str:
    """One sentence on why a "better" claim's verdict differs between rule book v3 (`old`) and v4."""
    d, o = new.details, old.details
    prefix = "(provisional) " if "incomplete" in (new.verdict, old.verdict) else ""
    if "p" not in d:
        return prefix + f"{_old_reading(old, 3)}; {_untested_words(d)}."
    if "p" in o and not _pairs_changed(o, d):
        return (prefix + "v4 tests claims of its Holm family that v3 settled by counting, which changes "
                f"this claim's corrected p; {_test_words(d)}{_underpowered_words(new)}.")
    first = _pairs_words(o, d, 3) if "p" in o else _old_reading(old, 3)
    return prefix + f"{first}; {_test_words(d)}{_underpowered_words(new)}."


def write_report(target: str, title: str, preset: str, cells: Sequence[SuiteCell],
                 tier: str = "real", out: Optional[Path] = None) -> Path:
    """report.md and its plots in `out` (default: the suite's results folder)."""
    out = results_dir(target, tier) if out is None else out
    out.mkdir(parents=True, exist_ok=True)
    text = render(target, title, preset, cells, tier)
    atomic_write_text(out / "report.md", text)  # rewritten after every cell
    plot_curves(cells, out / "curves.png")
    plot_grid(preset, cells, out / "heatmap.png")
    plot_transfer(preset, cells, out / "transfer.png")
    return out / "report.md"
