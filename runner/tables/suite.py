"""A reproduction suite on real data, run cell by cell on this machine (`SCALE=real` on CPU,
`SCALE=gpu` on one GPU).

Each cell (one seed of one arm of a preset in sweeps/) is one process (`python -m runner.run`, on
the config `deepinit train` would compose) with one CPU thread; `parallel` of them run side by
side (on a GPU, they share it). A rich progress bar counts cells with an ETA. A finished cell's record is written to
results/<target>/<tier>/records.jsonl at once, so an
interrupted suite keeps what it finished, and a later call (on this machine or another) trains
only the cells that have no record yet. The preset's `sweep.claims` are the pre-registered
decision rules (runner/tables/evidence.py); the report lists each arm with mean, spread and 95%
confidence intervals over seeds, and each claim with its verdict.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from runner.config import Config
from runner.console import console, fmt, format_duration
from runner.decode.signature import signature_note
from runner.files import atomic_path, atomic_write_text
from runner.run.folder import folder_name, write_config
from runner.run.status import FAILED_TO_TRAIN
from runner.sweep.plan import canonical, load_preset, norm_key, plan_cells, run_only
from runner.sweep.report import markdown_table
from runner.tables.evidence import (
    METRIC_KINDS,
    Record,
    Summary,
    Verdict,
    claim_from_dict,
    holm,
    judge_all,
    numeric_order,
    paired_t_test,
    selector_matches,
    summarize,
)
from runner.tables.records import Records, cell_key, record_from_run, results_root
from runner.tables.rulebook import CURRENT, NOT_TRAINED, blow_up_cause, describe, outcome, rulebook

SEED_AXIS = "trainer.seed"


@dataclass
class SuiteCell:
    overrides: list[str]  # what the cell's config is composed from (the preset, the cell's axes, extras)
    key: list[str]  # the result-changing overrides, canonical (the record's identity)
    arm: dict[str, str]  # the axes other than the seed
    seed: int
    record: Optional[dict] = None
    bleu_last_measured: Optional[float] = None  # the last checkpoint's BLEU, measured on the run folder afterwards

    @property
    def name(self) -> str:
        return folder_name(self.key, "default")

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.arm.items()) + f" seed={self.seed}"


def plan(preset: str, extra: Sequence[str] = ()) -> list[SuiteCell]:
    """The preset's cells in the preset's axis order, without the arms its `sweep.exclude`
    lists (each a {axis: value} selector). Extra overrides that change no result (e.g.
    trainer.device=cpu) reach every cell's command but not its key.

    An extra override of a preset axis (`model.layers=6`, `++trainer.seed=2`: part of a suite)
    is written with the preset's own spelling of the key and stays in the arm, so the cell is
    the whole suite's cell (the same command, key, arm and seed), and the preset's exclusions
    and claims still see it."""
    spec = load_preset(preset)
    spelling = {norm_key(k): k for k in ((spec.get("hydra") or {}).get("sweeper") or {}).get("params") or {}}
    preset_axes = list(spelling)
    cells, fixed = plan_cells(preset, extra, respell=True)

    def respelled(key: str) -> str:
        return key if key.startswith("~") else spelling.get(norm_key(key), key)

    cells = [{respelled(k): v for k, v in axes.items()} for axes in cells]
    fixed = [f"{respelled(k)}={v}" for k, _, v in (o.partition("=") for o in fixed)]
    pinned = {norm_key(k): v for k, _, v in (o.partition("=") for o in fixed) if not k.startswith("~")}
    # each a selector as in a claim: a list value matches any of its values
    exclude = [{k: tuple(str(x) for x in v) if isinstance(v, (list, tuple)) else str(v) for k, v in sel.items()}
               for sel in (spec.get("sweep") or {}).get("exclude") or []]
    out = []
    for axes in cells:
        overrides = [f"+sweep={preset}", *(f"{k}={v}" for k, v in axes.items()), *fixed, *run_only(extra)]
        swept = {norm_key(k): v for k, v in axes.items()}
        clean = {k: swept.get(k, pinned.get(k)) for k in preset_axes if k in swept or k in pinned}
        clean.update((k, v) for k, v in swept.items() if k not in clean)  # axes the command line added
        if any(selector_matches(clean, sel) for sel in exclude):
            continue
        seed = int(clean.pop(SEED_AXIS, pinned.get(SEED_AXIS, 1)))
        out.append(SuiteCell(overrides, sorted(canonical(overrides)), clean, seed))
    return out


def results_dir(target: str, tier: str = "real") -> Path:
    return results_root() / target / tier


def attach_records(cells: Sequence[SuiteCell], records: Records) -> None:
    for cell in cells:
        cell.record = records.get(cell.key)
        cell.bleu_last_measured = records.bleu_last.get(cell_key(cell.key))


# ----------------------------------------------------------------------------- running
def _cell_env() -> dict[str, str]:
    """One thread per cell, and the cells import this very copy of the package (a suite run from
    a git worktree of a fixed commit trains every cell with that commit's code)."""
    package_parent = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": path}


@dataclass
class Job:
    """One cell to train, with where its run folder and its record go. `group` names its suite
    (the target) when one pool trains several suites."""

    cell: SuiteCell
    work: Path
    records: Records
    group: str = ""

    @property
    def label(self) -> str:
        return f"{self.group}: {self.cell.label}" if self.group else self.cell.label


def seed_major(cells: Sequence[SuiteCell]) -> list[SuiteCell]:
    """The cells without a record, every arm's first seed before any arm's second: a partial
    suite covers every arm."""
    return sorted((c for c in cells if c.record is None), key=lambda c: c.seed)


def run_cells(cells: Sequence[SuiteCell], work: Path, records: Records, parallel: int,
              on_cell_done: Optional[Callable[[str], None]] = None, *,
              compose: Callable[[list[str]], Config]) -> int:
    """Train the cells without a record, `parallel` at a time, one thread each; write each
    finished cell's record at once. Returns the number of cells that crashed."""
    return run_jobs([Job(c, work, records) for c in seed_major(cells)], parallel, on_cell_done, compose=compose)


def run_jobs(jobs: Sequence[Job], parallel: int,
             on_cell_done: Optional[Callable[[str], None]] = None, *,
             compose: Callable[[list[str]], Config]) -> int:
    """Train the jobs in order, `parallel` at a time, one thread each, writing each finished
    cell's record at once; a slot that frees takes the next job whatever its suite, so no core
    idles between suites. `on_cell_done(group)` runs after each job of the group has ended
    (recorded or crashed), so a suite's report can follow its records cell by cell.
    Ctrl-C or SIGTERM stops the running cells (`stop_cells`) before it propagates. Each cell is a
    process of its own, `python -m runner.run RUN_DIR`, on the config `compose` makes of its
    overrides (the CLI's composition: runner/cli/reproduce.py passes it). Returns the number of
    cells that crashed."""
    pool = _Pool(jobs, parallel, on_cell_done, compose)
    columns = (TextColumn("[bold]cells"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[now]}"))
    with Progress(*columns, console=console) as progress:
        try:
            return pool.run(progress)
        except BaseException:  # Ctrl-C, SIGTERM (runner.run.attempt.Interrupted), an error: no orphan cells
            progress.stop()
            stop_cells([proc for _, proc, _ in pool.running])
            raise


def stop_cells(procs: Sequence[subprocess.Popen], grace_s: float = 60.0,
               settle_s: float = 2.0) -> None:
    """Stop running cells so that none trains on orphaned (a later call would start the same
    cell in the same folder): SIGTERM, which a cell handles like Ctrl-C (it writes
    interrupted.json, and the next call resumes it from checkpoint_last), then SIGKILL after
    grace_s. Processes that a Ctrl-C in the terminal reached already get settle_s to end first."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Pool:
    """run_jobs' state: the queue and the running cells (job, process, log file)."""

    def __init__(self, jobs: Sequence[Job], parallel: int,
                 on_cell_done: Optional[Callable[[str], None]], compose: Callable[[list[str]], Config]):
        self.compose = compose
        self.queue = list(jobs)
        self.parallel = parallel
        self.on_cell_done = on_cell_done
        self.running: list[tuple[Job, subprocess.Popen, object]] = []
        self.env = _cell_env()

    def _now(self) -> str:
        return f"running: {', '.join(j.label for j, _, _ in self.running)}"

    def _start(self, job: Job) -> None:
        job.work.mkdir(parents=True, exist_ok=True)
        run_dir = job.work / job.cell.name
        overrides = [*job.cell.overrides, "trainer.threads=1", "trainer.progress=false"]
        write_config(run_dir, self.compose(overrides), overrides)  # what `deepinit train` would compose
        log = open(job.work / f"{job.cell.name}.out", "w")
        cmd = [sys.executable, "-m", "runner.run", str(run_dir)]
        self.running.append((job, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                   env=self.env), log))

    def _finish(self, job: Job, proc: subprocess.Popen, count: str = "") -> bool:
        """Record a cell whose process ended; False when it crashed. `count` ends its line."""
        cell = job.cell
        record = record_from_run(job.work / cell.name, cell.key, cell.arm, cell.seed)
        if record is None or record["status"] == "failed":
            reason = (record or {}).get("reason") or f"exit code {proc.returncode}"
            console.print(f"[red]failed[/] {job.label}: {reason} ({job.work / cell.name}){count}")
            return False
        cell.record = record
        job.records.put(record)
        job.records.save()
        console.print(f"{record['status']:>8} {job.label}: best valid loss "
                      f"{_fmt(record.get('best_valid_loss'), '.3f')}, BLEU "
                      f"{_fmt(record.get('bleu'), '.2f')}, {record.get('wall_s') or 0:.0f} s{count}")
        return True

    @staticmethod
    def _count(ended: int, total: int, elapsed_s: float) -> str:
        """The end of a finished cell's line in a log without the progress bar (not a terminal):
        '[k of N cells, ~T left]', T at the pace so far."""
        if console.is_terminal:
            return ""
        left = "" if ended == total else f", ~{format_duration(elapsed_s / ended * (total - ended))} left"
        return f"  [{ended} of {total} cells{left}]"

    def run(self, progress: Progress) -> int:
        task = progress.add_task("cells", total=len(self.queue), now="")
        crashed, ended, total, start = 0, 0, len(self.queue), time.monotonic()
        while self.queue or self.running:
            while self.queue and len(self.running) < self.parallel:
                self._start(self.queue.pop(0))
                progress.update(task, now=self._now())
            time.sleep(2.0)
            for item in list(self.running):
                job, proc, log = item
                if proc.poll() is None:
                    continue
                self.running.remove(item)
                log.close()
                ended += 1
                crashed += not self._finish(job, proc, self._count(ended, total, time.monotonic() - start))
                if self.on_cell_done is not None:
                    try:
                        self.on_cell_done(job.group)
                    except Exception as err:  # the record is saved; a report must not stop the pool
                        console.print(f"[yellow]warning[/] {job.group}: report not written: "
                                      f"{type(err).__name__}: {err}")
                progress.advance(task)
                progress.update(task, now=self._now())
        return crashed


# ----------------------------------------------------------------------------- the report
BLEU_LAST_NOTE = ("BLEU last ckpt: the tokenized BLEU of each ok seed's last checkpoint alone "
                  "(trainer.final_bleu_last, or measured afterwards: last-checkpoint-bleu.jsonl), beside "
                  "BLEU (tok) of the last 5 checkpoints averaged; '-' unless every ok seed of the arm has it.")
SLOPE_NOTE = ("slope: change of the validation loss per 1,000 updates over each run's last 400 updates (mean "
              "over the arm's ok seeds); near 0 when the curve has flattened.")


_fmt = partial(fmt, show_nan=False, show_inf=False)  # a value that is not a finite number reads "-"


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return sum(kept) / len(kept) if kept else None


def _finite_values(records: Sequence[dict], key: str, ok_only: bool = True) -> list[float]:
    """`key` of each record (of each ok record when `ok_only`) where it is a finite number: what
    every table and figure of a report averages."""
    return [r[key] for r in records if (r["status"] == "ok" or not ok_only)
            and r.get(key) is not None and math.isfinite(r[key])]


def _summary_text(s: Summary, spec: str) -> str:
    if s.mean is None:
        return "-"
    if s.std is None:
        return f"{s.mean:{spec}} (n=1)"
    return f"{s.mean:{spec}} ± {s.std:{spec}} [{s.ci_low:{spec}}, {s.ci_high:{spec}}]"


def suite_decodes(cells: Sequence[SuiteCell]) -> bool:
    """Whether the suite scores BLEU (its preset sets trainer.final_bleu, or some record has a
    BLEU): its cells then meet the BLEU bar."""
    if any(c.record is not None and c.record.get("bleu") is not None for c in cells):
        return True
    return any(load_preset_value(c, "trainer.final_bleu") for c in cells[:1])


def cell_outcome(record: dict, decoded: bool, version: int = CURRENT) -> str:
    """The record's outcome under rule book `version` ("trained" reads "ok", the evidence status)."""
    result = outcome(record, rulebook(version), decoded=decoded)
    return "ok" if result == "trained" else result


def evidence_records(cells: Sequence[SuiteCell], version: int = CURRENT) -> list[Record]:
    """The cells' records as evidence, each status its outcome under rule book `version`."""
    decoded = suite_decodes(cells)
    out = []
    for cell in cells:
        r = cell.record
        if r is None:
            continue
        out.append(Record(arm=dict(cell.arm), seed=cell.seed, status=cell_outcome(r, decoded, version),
                          metrics={**{k: r.get(k) for k in ("bleu", "sacrebleu", "best_valid_loss")},
                                   "bleu_last": _bleu_last(cell)}))
    return out


def _bleu_last(cell: SuiteCell) -> Optional[float]:
    """The BLEU of the cell's last checkpoint: in its record (trainer.final_bleu_last), or
    measured on its run folder afterwards (last-checkpoint-bleu.jsonl)."""
    value = (cell.record or {}).get("bleu_last")
    return value if value is not None else cell.bleu_last_measured


def _reads_bleu_last(claim) -> bool:
    return claim.bleu_metric == "bleu_last" or (claim.kind in METRIC_KINDS and claim.metric == "bleu_last")


def _has_evidence(cell: SuiteCell, claim) -> bool:
    """Whether a cell has what the claim reads: its record, and for a claim judged on the last
    checkpoint's BLEU an ok cell also needs that number (a cell that diverged or stalled has no
    BLEU to read, nor has one whose final scoring failed: both count as they do for BLEU)."""
    if cell.record is None:
        return False
    if not _reads_bleu_last(claim) or cell.record["status"] != "ok" or cell.record.get("bleu") is None:
        return True
    return _bleu_last(cell) is not None


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
    values = [_bleu_last(c) for c in ok]
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
        return _finite_values(ok if ok_only else done, key, ok_only=False)

    bleu_last = _arm_bleu_last(members)
    return [
        f"{len(done)}/{len(members)}",
        *(str(outcomes.count(o)) for o in ("diverged", "collapsed", "stalled")),
        str(outcomes.count("below_bar")) if decoded else "-",
        _summary_text(summarize(values("bleu")), ".2f"),
        *(("-" if bleu_last is None else _summary_text(summarize(bleu_last), ".2f"),) if last else ()),
        _summary_text(summarize(values("sacrebleu")), ".2f"),
        _summary_text(summarize(values("best_valid_loss")), ".3f"),
        _fmt(_mean([curve_slope(r.get("valid_curve") or []) for r in ok]), "+.3f"),
        _fmt(sum(r.get("wall_s") or 0 for r in done) / 60, ".0f"),
        *((_fmt(_mean(values("seconds_per_update", ok_only=False)), ".3f"),
           _fmt(_mean(values("peak_memory_mb", ok_only=False)), ",.0f")) if gpu else ()),
    ]


def arm_rows(cells: Sequence[SuiteCell], gpu: bool = False, last: bool = False) -> list[list[str]]:
    """One row per arm; `gpu` adds the seconds per update and the peak GPU memory, `last` the
    last checkpoint's BLEU."""
    return [[" ".join(f"{k}={v}" for k, v in arm), *arm_row(members, gpu, last)]
            for arm, members in arms_of(cells).items()]


def verdicts(preset: str, cells: Sequence[SuiteCell], version: int = CURRENT) -> list[Verdict]:
    """Each claim judged on the records under rule book `version`; a claim whose arms still miss
    planned cells gets the verdict "incomplete" (what the finished cells show so far stays in
    `measured`), so a partial suite never reads as a result."""
    claims = [claim_from_dict(raw) for raw in ((load_preset(preset).get("sweep") or {}).get("claims")) or []]
    judged = judge_all(claims, evidence_records(cells, version), version)
    out = []
    for claim, verdict in zip(claims, judged):
        selected = [c for c in cells  # an empty selector {} picks every cell
                    if any(selector_matches(c.arm, sel) for sel in (claim.a, claim.b) if sel is not None)]
        if claim.b is not None:  # two arms: a planned seed the other arm does not plan pairs with nothing
            seeds = [{c.seed for c in cells if selector_matches(c.arm, sel)} for sel in (claim.a, claim.b)]
            selected = [c for c in selected if c.seed in seeds[0] & seeds[1]]
        done = sum(_has_evidence(c, claim) for c in selected)
        if done < len(selected):
            what = "trained and measured on their last checkpoint" if _reads_bleu_last(claim) else "trained"
            verdict = Verdict(claim, "incomplete",
                              f"{done} of {len(selected)} cells {what}; so far: {verdict.measured}",
                              {**verdict.details, "provisional_verdict": verdict.verdict})
        out.append(verdict)
    return out


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
    causes = [blow_up_cause(c.record, load_preset_value(c, "trainer.divergence.loss_bound")) for c in diverged]
    counts = ", ".join(f"{causes.count(k)} {k}" for k in ("at initialization", "during training", "unknown")
                       if causes.count(k))
    return (f"Diverged cells by when they blew up (the loss at update 0 against the divergence bound): {counts}"
            + ("; unknown: a record without the loss at update 0 (trained before it was recorded)."
               if "unknown" in causes else "."))


def load_preset_value(cell: SuiteCell, dotted: str) -> Optional[float]:
    """A number the cell's preset sets (None when it does not)."""
    preset = next((o.split("=", 1)[1] for o in cell.overrides if o.startswith("+sweep=")), None)
    node: object = load_preset(preset) if preset else {}
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, bool):
        return float(node)
    return float(node) if isinstance(node, (int, float)) else None


def stop_note(cells: Sequence[SuiteCell]) -> str:
    """Where the stopping rule ended the runs of a suite that sets one ("" when no record has it)."""
    ran = [c.record for c in cells if c.record is not None and c.record.get("stopped_early") is not None]
    if not ran or not any(r.get("early_stop") or r.get("stopped_early") for r in ran):
        return ""
    stopped = sorted(r["stop_update"] for r in ran if r.get("stopped_early"))
    capped = len(ran) - len(stopped)
    text = f"Stopping rule: {len(stopped)} of {len(ran)} cells stopped on a flat curve"
    if stopped:
        text += f" (at update {stopped[0]:,} to {stopped[-1]:,})"
    if capped:
        text += f"; {capped} reached the cap still improving, so their scores are at a budget, not at convergence"
    return text + "."


def render(target: str, title: str, preset: str, cells: Sequence[SuiteCell], tier: str = "real") -> str:
    done = [c.record for c in cells if c.record is not None]
    gpu = tier == "gpu"
    last = has_bleu_last(cells)
    signature = signature_note(done)  # the sacreBLEU column's true signature
    header = ["arm", *arm_columns(last), "GPU min" if gpu else "CPU min", *(("s/update", "peak MiB") if gpu else ())]
    lines = [f"# {title}: real-data tier{' on a GPU' if gpu else ''}", "",
             f"Preset `sweeps/{preset}.yaml`; {len(done)} of {len(cells)} cells trained. "
             f"Each arm: {MEAN_WORDS}", "",
             describe(rulebook()) + ("" if suite_decodes(cells) else
                                     " This suite scores validation loss only, so no BLEU bar applies."), "",
             provenance(done), "",
             markdown_table(header, arm_rows(cells, gpu, last)), "",
             *([blow_up_note(cells), ""] if blow_up_note(cells) else []),
             *([stop_note(cells), ""] if stop_note(cells) else []),
             SLOPE_NOTE, "",
             *([signature, ""] if signature else []),
             *([BLEU_LAST_NOTE, ""] if last else []),
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
             "A verdict is final once every cell of the arms it compares has a record; until then "
             "it reads \"incomplete\". A claim marked † was added later, for the reason given "
             "below the table; it stands beside the claims written before the run and replaces "
             "none of them. \"rule book v1\" gives the verdict under the first rules where it "
             "differs, with the reason below the table.", ""]
    judged = verdicts(preset, cells)
    old = verdicts(preset, cells, version=1)
    rows = [[v.claim.id + (" †" if v.claim.added else ""), v.claim.text, v.measured, f"**{v.verdict}**",
             "same" if o.verdict == v.verdict else o.verdict] for v, o in zip(judged, old)]
    lines += [markdown_table(["claim", "paper", "measured", "verdict", "rule book v1"], rows)
              if rows else "(none)", ""]
    changed = [f"- {v.claim.id}: {o.verdict} under v1, {v.verdict} now: {change_reason(o, v)}"
               for v, o in zip(judged, old) if o.verdict != v.verdict]
    if changed:
        lines += ["Verdicts that changed with the rule book:", "", *changed, ""]
    reasons: dict[str, list[str]] = {}  # claims added for one reason share its line
    for v in judged:
        if v.claim.added:
            reasons.setdefault(v.claim.added, []).append(v.claim.id)
    lines += [f"† {', '.join(ids)}: {reason}" for reason, ids in reasons.items()]
    if any(v.claim.added for v in judged):
        lines.append("")
    return "\n".join(lines)


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
        if "p" in d:
            p = d.get("p_holm", d["p"])
            return (prefix + f"v1 read the 95% bootstrap interval, which with {d.get('paired')} seeds is their "
                    f"range; v2's one-sided paired t-test gives p={p:.3g}"
                    + (f" after Holm over {d['family_size']} comparisons" if d.get("family_size", 1) > 1 else "")
                    + (f", and the paper's effect is below the {d['mde']:.2f} detectable at 80% power"
                       if new.verdict == "underpowered" else "") + ".")
        return prefix + "v2 counts collapsed cells and cells below the BLEU bar as not trained."
    if kind == "same_best":
        return (prefix + f"v2 also asks each seed's own best to be the shared best; "
                f"{d.get('seeds_agreeing', 0)} of {len(d.get('per_seed_best', {}))} seeds agree.")
    return prefix + "v2 reads the cells' outcomes under its own definitions."


@dataclass
class TableRows:
    """Some arms of one suite, as rows of a table that gathers several suites' arms."""

    suite: str  # the target whose records these are
    cells: list[SuiteCell]
    drop: tuple[str, ...] = ()  # axes that the table's section fixes, left out of the row names
    note: str = ""  # how these rows differ from the table's common recipe ("" when they do not)


def _scored_by_seed(members: Sequence[SuiteCell], metric: str = "bleu") -> dict[int, float]:
    """An arm's metric by seed, over the seeds that trained to the end (not diverged, collapsed or
    stalled: what the means average)."""
    decoded = suite_decodes(members)
    return {c.seed: c.record[metric] for c in members if c.record is not None
            and cell_outcome(c.record, decoded) in ("ok", "below_bar")
            and c.record.get(metric) is not None and math.isfinite(c.record[metric])}


def baseline_comparisons(rows: Sequence[Sequence[SuiteCell]], base: Sequence[SuiteCell],
                         metric: str = "bleu") -> list[str]:
    """Each row's difference from the baseline arm, paired by seed: mean [95% paired-t interval],
    the two-sided paired t-test's p and Holm's p over the rows compared ("-" for the baseline
    itself and for fewer than 2 pairs)."""
    base_by_seed = _scored_by_seed(base, metric)
    diffs: list[Optional[list[float]]] = []
    for members in rows:
        by_seed = _scored_by_seed(members, metric)
        common = sorted(set(by_seed) & set(base_by_seed))
        same = [c.record for c in members] == [c.record for c in base]
        diffs.append(None if same or len(common) < 2 else [by_seed[s] - base_by_seed[s] for s in common])
    tested = [i for i, d in enumerate(diffs) if d is not None]
    pvalues = [paired_t_test(diffs[i], alternative="two-sided") for i in tested]
    adjusted = dict(zip(tested, holm(pvalues)))
    raw = dict(zip(tested, pvalues))
    out = []
    for i, d in enumerate(diffs):
        if d is None:
            out.append("baseline" if [c.record for c in rows[i]] == [c.record for c in base] else "-")
            continue
        s = summarize(d)
        out.append(f"{s.mean:+.2f} [{s.ci_low:+.2f}, {s.ci_high:+.2f}] p={raw[i]:.2g}, Holm {adjusted[i]:.2g}")
    return out


BASELINE_NOTE = ("vs {name}: the row's BLEU (tok) minus the baseline's on the same seeds, mean [95% paired-t "
                 "interval], the two-sided paired t-test's p and Holm's correction over the section's rows "
                 "(seeds that did not train are left out of both).")


def render_combined(title: str, intro: str, sections: Sequence[tuple[str, Sequence[TableRows]]],
                    baseline: Optional[tuple[str, dict]] = None) -> str:
    """One markdown page of several suites' arms, a table per section: each arm's statistics as in
    its own suite's report, the rows sorted by the share of their seeds that did not train, then by
    mean BLEU (arms without a record last). `baseline` (suite, selector) names an arm each section
    is compared with, paired by seed (a last column)."""
    done = [c.record for _, parts in sections for part in parts for c in part.cells if c.record is not None]
    planned = sum(len(part.cells) for _, parts in sections for part in parts)
    last = any(has_bleu_last(part.cells) for _, parts in sections for part in parts)
    base_name = " ".join(f"{k}={v}" for k, v in (baseline[1] if baseline else {}).items())
    header = ["arm", "suite", *arm_columns(last), "CPU min", *([f"vs {base_name}"] if baseline else [])]
    lines = [f"# {title}", "", intro, "",
             f"{len(done)} of {planned} cells trained. Each arm: {MEAN_WORDS} Rows: "
             "the arms whose seeds all trained first, by mean BLEU, then those with seeds that did not "
             "train, then those without a record. The claims and their verdicts are in each suite's "
             "own report (results/<suite>/real/report.md).", "",
             provenance(done), ""]
    for heading, parts in sections:
        rows, notes, arm_cells = [], [], []
        base = next((members for part in parts if baseline and part.suite == baseline[0]
                     for arm, members in arms_of(part.cells).items() if selector_matches(dict(arm), baseline[1])), None)
        for part in parts:
            for arm, members in arms_of(part.cells).items():
                name = " ".join(f"{k}={v}" for k, v in arm if k not in part.drop) or "all"
                records = [c.record for c in members if c.record is not None]
                decoded = suite_decodes(part.cells)
                failed = sum(cell_outcome(r, decoded) in NOT_TRAINED for r in records)
                bleu = _mean(_finite_values(records, "bleu"))
                order = (failed / len(records), -bleu if bleu is not None else math.inf) if records else (2.0, 0.0)
                rows.append((order, [name, part.suite, *arm_row(members, last=last, decoded=decoded)]))
                arm_cells.append(members)
                if part.note:
                    notes.append(f"- {name} ({part.suite}): {part.note}")
        if base is not None:
            for row, text in zip(rows, baseline_comparisons(arm_cells, base)):
                row[1].append(text)
        elif baseline:
            rows = [(order, [*row, "-"]) for order, row in rows]
        rows.sort(key=lambda row: row[0])  # stable: arms without a record keep their order, last
        lines += [f"## {heading}", "", markdown_table(header, [row for _, row in rows]), "", *notes,
                  *([""] if notes else [])]
    signature = signature_note(done)  # the sacreBLEU column's true signature
    lines += [SLOPE_NOTE, "", *([BASELINE_NOTE.format(name=base_name), ""] if baseline else []),
              *([signature, ""] if signature else []), *([BLEU_LAST_NOTE, ""] if last else [])]
    return "\n".join(lines)


def write_combined(name: str, title: str, intro: str, sections: Sequence[tuple[str, Sequence[TableRows]]],
                   baseline: Optional[tuple[str, dict]] = None) -> Path:
    out = results_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    text = render_combined(title, intro, sections, baseline)
    atomic_write_text(out / "report.md", text)  # several suites rewrite this page
    return out / "report.md"


def plot_curves(cells: Sequence[SuiteCell], path: Path) -> Optional[Path]:
    """Validation loss against updates, one colour per arm, one line per seed."""
    done = [c for c in cells if c.record and c.record.get("valid_curve")]
    if not done:
        return None
    import matplotlib  # noqa: PLC0415 (+0.5 s at import; only plots need it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (see above)

    arms = sorted({" ".join(f"{k}={v}" for k, v in c.arm.items()) for c in done})
    colours = {a: plt.cm.tab10(i % 10) for i, a in enumerate(arms)}
    fig, ax = plt.subplots(figsize=(8, 5))
    seen = set()
    for c in done:
        label = " ".join(f"{k}={v}" for k, v in c.arm.items())
        steps, losses = zip(*c.record["valid_curve"])
        ax.plot(steps, losses, color=colours[label], alpha=0.8,
                label=None if label in seen else label)
        seen.add(label)
    ax.set_xlabel("update")
    ax.set_ylabel("validation loss (label-smoothed, nats/token)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def grid_axes(preset: str) -> Optional[tuple[str, str]]:
    """(x, y) when the preset is a grid: exactly two swept nuisance axes besides the seed (the
    Admin no-warmup figure's lr x beta2, per method); None otherwise."""
    axes = [norm_key(a) for a in ((load_preset(preset).get("sweep") or {}).get("nuisance") or [])
            if norm_key(a) != SEED_AXIS]
    return (axes[0], axes[1]) if len(axes) == 2 else None


def grid_panels(cells: Sequence[SuiteCell], x: str, y: str) -> dict[str, dict]:
    """Per arm of the other axes (e.g. per method): the x and y values, the mean best validation
    loss over the ok seeds of each (y, x) setting (NaN when none), and its label: the mean, or
    how many seeds diverged / stalled, or "-" when no seed has run."""
    panels: dict[str, dict] = {}
    xs = sorted({c.arm[x] for c in cells}, key=numeric_order)
    ys = sorted({c.arm[y] for c in cells}, key=numeric_order)
    for cell in cells:
        name = " ".join(f"{k}={v}" for k, v in cell.arm.items() if k not in (x, y)) or "all"
        panel = panels.setdefault(name, {"xs": xs, "ys": ys, "records": {}})
        if cell.record is not None:
            panel["records"].setdefault((cell.arm[y], cell.arm[x]), []).append(cell.record)
    for panel in panels.values():
        values = [[math.nan] * len(xs) for _ in ys]
        labels = [["-"] * len(xs) for _ in ys]
        for (yv, xv), records in panel.pop("records").items():
            i, j = ys.index(yv), xs.index(xv)
            ok = _finite_values(records, "best_valid_loss")
            bad = [f"{sum(r['status'] == st for r in records)}/{len(records)} {word}"
                   for st, word in (("diverged", "div"), ("stalled", "stall"))
                   if any(r["status"] == st for r in records)]
            if ok:
                values[i][j] = sum(ok) / len(ok)
            labels[i][j] = "\n".join(([f"{values[i][j]:.2f}"] if ok else []) + bad)
        panel.update(values=values, labels=labels)
    return panels


def _short(value: str) -> str:
    try:
        return f"{float(value):g}"
    except ValueError:
        return value


def plot_grid(preset: str, cells: Sequence[SuiteCell], path: Path) -> Optional[Path]:
    """A grid preset's heatmaps, one panel per arm of the other axes on one colour scale: mean
    best validation loss over the ok seeds, with the diverged and stalled seed counts."""
    spec = grid_axes(preset)
    if spec is None or not any(c.record for c in cells):
        return None
    import matplotlib  # noqa: PLC0415 (+0.5 s at import; only plots need it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (see above)

    x, y = spec
    panels = grid_panels(cells, x, y)
    finite = [v for p in panels.values() for row in p["values"] for v in row if math.isfinite(v)]
    vmin, vmax = (min(finite), max(finite)) if finite else (0.0, 1.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.2, 3.4), squeeze=False,
                             layout="constrained")
    cmap = matplotlib.colormaps["viridis_r"].with_extremes(bad="#d9d9d9")  # lower loss: brighter
    image = None
    for ax, (name, panel) in zip(axes[0], panels.items()):
        data = np.ma.masked_invalid(np.array(panel["values"], dtype=float))
        image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", origin="lower")
        for i, row in enumerate(panel["labels"]):
            for j, text in enumerate(row):
                value = panel["values"][i][j]
                r, g, b, _ = cmap((value - vmin) / ((vmax - vmin) or 1.0)) if math.isfinite(value) else (1, 1, 1, 1)
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white")
        ax.set_xticks(range(len(panel["xs"])), [_short(v) for v in panel["xs"]])
        ax.set_yticks(range(len(panel["ys"])), panel["ys"])
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(name, fontsize=9)
    fig.colorbar(image, ax=list(axes[0]), label="best valid loss (mean of ok seeds)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def transfer_panels(preset: str, cells: Sequence[SuiteCell]) -> dict[str, dict]:
    """The data behind transfer.png, one panel per claim of kind `same_best` (a claim whose cells
    are all another's, such as one kept to part of the grid, shares that claim's panel): per
    `across` value, the `over` values with the mean metric of their ok seeds (NaN when none), each
    ok seed's value, and the cells that diverged or stalled."""
    claims = [claim_from_dict(raw) for raw in ((load_preset(preset).get("sweep") or {}).get("claims") or [])]
    claims = [c for c in claims if c.kind == "same_best"]
    chosen = {c.id: [cell for cell in cells if selector_matches(cell.arm, c.a)] for c in claims}
    cell_ids = {c.id: {id(cell) for cell in chosen[c.id]} for c in claims}
    panels: dict[str, dict] = {}

    def figure(c) -> tuple:  # claims that draw the same figure, on their own cells
        return (c.over, c.across, c.metric, c.higher_is_better)

    for claim in claims:
        mine = cell_ids[claim.id]
        if any(mine < cell_ids[other.id] or (mine == cell_ids[other.id] and other.id in panels)
               for other in claims if other.id != claim.id and figure(other) == figure(claim)):
            continue
        over, across = claim.over or "", claim.across or ""
        xs = sorted({cell.arm.get(over, "") for cell in chosen[claim.id]}, key=numeric_order)
        lines: dict[str, dict] = {}
        for depth in sorted({cell.arm.get(across, "") for cell in chosen[claim.id]}, key=numeric_order):
            at = [cell for cell in chosen[claim.id] if cell.arm.get(across, "") == depth and cell.record]
            seeds, failed, means = [], [], []
            for x in xs:
                ok = _finite_values([cell.record for cell in at if cell.arm.get(over, "") == x], claim.metric)
                seeds += [(x, v) for v in ok]
                failed += [x for cell in at if cell.arm.get(over, "") == x
                           and cell.record["status"] in FAILED_TO_TRAIN]
                means.append(sum(ok) / len(ok) if ok else math.nan)
            lines[depth] = {"means": means, "seeds": seeds, "failed": failed}
        title = ", ".join(f"{k}={v}" for k, v in claim.a.items() if isinstance(v, str)) or claim.id
        panels[claim.id] = {"title": title, "over": over, "across": across, "metric": claim.metric, "xs": xs,
                            "higher_is_better": claim.higher_is_better, "lines": lines}
    return panels


def plot_transfer(preset: str, cells: Sequence[SuiteCell], path: Path) -> Optional[Path]:
    """For claims of kind `same_best`: the metric against the tuned setting, one line per depth
    (the Tensor Programs VI transfer figure), the best of each line starred, seeds as dots,
    diverged or stalled cells as crosses on the panel's top edge."""
    panels = transfer_panels(preset, cells)
    if not panels or not any(c.record for c in cells):
        return None
    import matplotlib  # noqa: PLC0415 (+0.5 s at import; only plots need it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (see above)

    one_metric = len({p["metric"] for p in panels.values()}) == 1
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 3.8), squeeze=False,
                             sharey=one_metric, layout="constrained")
    for ax, panel in zip(axes[0], panels.values()):
        # a log axis for positive numbers (learning rates), else evenly spaced categories
        numeric = all(numeric_order(x)[0] == 0 and float(x) > 0 for x in panel["xs"])
        position = {x: float(x) if numeric else i for i, x in enumerate(panel["xs"])}
        xs = [position[x] for x in panel["xs"]]
        for i, (depth, line) in enumerate(panel["lines"].items()):
            colour = plt.cm.tab10(i % 10)
            means = np.array(line["means"], dtype=float)
            ax.plot(xs, means, "-o", color=colour, label=f"{panel['across']}={depth}")
            if line["seeds"]:
                sx, sy = zip(*line["seeds"])
                ax.scatter([position[x] for x in sx], sy, color=colour, s=10, alpha=0.5)
            if np.isfinite(means).any():
                best = int(np.nanargmax(means) if panel["higher_is_better"] else np.nanargmin(means))
                ax.plot(xs[best], means[best], "*", color=colour, markersize=15, markeredgecolor="black")
            for x in line["failed"]:
                ax.plot(position[x], 1.0, "x", color=colour, transform=ax.get_xaxis_transform(), clip_on=False)
        if numeric:
            ax.set_xscale("log")
        ax.set_xticks(xs, [_short(x) for x in panel["xs"]], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel(panel["over"])
        ax.set_title(panel["title"], fontsize=9)
        ax.legend(fontsize=7)
        if ax is axes[0][0] or not one_metric:
            ax.set_ylabel(f"{panel['metric']} (mean of ok seeds)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


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
