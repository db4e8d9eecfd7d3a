"""Pre-registered claims and the records they are judged on: `Record` (one trained cell), `Claim`
(a paper's claim as a decision rule, read from a preset's `sweep.claims` by `claim_from_dict`),
`Verdict`, and the selectors that pick a claim's arms. runner/tables/evidence.py judges them.

Selector values read from YAML are compared as strings (`claim_from_dict` turns 6 into "6" and
true into "true"), as arm axes are recorded as strings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from runner.run.status import OK
from runner.tables.rulebook import OUTCOMES, TRAINED

# a Record's status: its outcome under the rule book, "ok" for trained: a way of not training
# (rule book v2 adds collapsed and below_bar; v1 records only diverged and stalled), or "failed"
# (a crash: not evidence)
STATUSES = tuple(OK if o == TRAINED else o for o in OUTCOMES)
KINDS = ("better", "diverges", "trains", "fails_to_train", "more_diverged", "more_failed", "same_best",
         "matches", "less_spread")
TWO_ARM_KINDS = ("better", "more_diverged", "more_failed", "matches", "less_spread")
METRIC_KINDS = ("better", "same_best", "matches", "less_spread")  # the kinds that compare `metric`
# what a claim's `metric` can name: the metrics each Record carries (runner/tables/suite.py)
METRICS = ("bleu", "sacrebleu", "best_valid_loss", "bleu_last", "loss_spikes")
VERDICTS = ("reproduced", "not reproduced", "underpowered", "inconclusive", "not run")


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
    # "reproduced" | "not reproduced" | "inconclusive" | "underpowered" (rule book v2) | "not run";
    # runner.tables.suite.verdicts adds "incomplete" for a suite still missing cells
    verdict: str
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


def selector_matches(arm: Mapping[str, Any], selector: Mapping[str, Selected]) -> bool:
    """Whether an arm has every key of `selector` with its value (or one of its values, for a list)."""
    def one(actual: str, wanted: Selected | list[str]) -> bool:
        return actual in wanted if isinstance(wanted, (tuple, list)) else actual == wanted
    return all(k in arm and one(str(arm[k]), v) for k, v in selector.items())
