"""Everything the user sees: the rich console, the run's start summary, the live progress bars
(training, decoding), the end summary, and how every table writes a number (`fmt`) and a time
span (`format_duration`)."""
from __future__ import annotations

import contextlib
import logging
import math
import numbers
import sys
import textwrap
import time
from typing import Callable, Iterable, Iterator, Optional, Sequence, TypeVar

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

console = Console(stderr=False)
log = logging.getLogger("deepinit")
# train.log only (conf/hydra/job_logging: no console handler): the full config, tracebacks
file_log = logging.getLogger("deepinit.file")

T = TypeVar("T")
_live: list[Progress] = []  # the bars being shown, innermost last (track() nests into them)


class _Field(ProgressColumn):
    """A task field shown through a template (rich markup, e.g. "loss [cyan]{}[/]"); blank for
    tasks without it (a decoding row inside the training bar has no loss)."""

    def __init__(self, template: str, name: str):
        super().__init__()
        self.template, self.name = template, name

    def render(self, task: Task) -> Text:
        value = task.fields.get(self.name)
        return Text("") if value is None else Text.from_markup(self.template.format(escape(str(value))))


class _Progress(Progress):
    """A Progress that registers itself while shown, so that `track` adds its rows to it
    instead of starting a second live display."""

    def __enter__(self) -> "_Progress":
        _live.append(self)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        _live.remove(self)
        super().__exit__(*exc)


def progress_bar(enabled: bool | None, transient: bool = False) -> Progress:
    """Updates done / total, loss, lr, tokens/s, elapsed and ETA. Off when the console is not a
    terminal (sweeps, CI) unless forced with trainer.progress=true."""
    disable = not console.is_terminal if enabled is None else not enabled
    return _Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        _Field("loss [cyan]{}[/]", "loss"), _Field("lr {}", "lr"), _Field("{} tok/s", "tps"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
        disable=disable, transient=transient)


_plain: list[Callable[[str], None]] = []  # where `track` writes lines instead of a bar


@contextlib.contextmanager
def progress_lines(emit: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Inside this block, a `track` that draws no bar (the console is not a terminal: a pipe,
    a log file, a batch job) writes a line instead each time a tenth of its total is done (at
    most every 500 items), with the rate and the time left. emit: where the lines go (default:
    stderr)."""
    _plain.append(emit or (lambda line: print(line, file=sys.stderr, flush=True)))
    try:
        yield
    finally:
        _plain.pop()


def _progress_lines(items: Iterable[T], description: str, total: Optional[float],
                    advance: Callable[[T], float], emit: Callable[[str], None]) -> Iterator[T]:
    every = min(500.0, max(1.0, math.ceil(total / 10))) if total else 500.0
    done, shown, started = 0.0, 0.0, time.monotonic()
    for item in items:
        yield item
        done += advance(item)
        if done - shown >= every or (total and done >= total):
            shown = done
            seconds = time.monotonic() - started
            rate = done / seconds if seconds > 0 else 0.0
            left = (f", {format_duration((total - done) / rate)} left"
                    if total and done < total and rate > 0 else "")
            of = f"/{total:,.0f}" if total else ""
            emit(f"{description}: {done:,.0f}{of} done, {rate:,.1f}/s{left}")


def track(items: Iterable[T], description: str, total: Optional[float] = None,
          advance: Callable[[T], float] = lambda _: 1, enabled: bool | None = None) -> Iterator[T]:
    """Iterate `items` with a progress row (e.g. decoding: advance=len over batches of
    sentences). Inside a shown bar (training) the row is added to it and removed when done;
    otherwise a bar of its own that disappears when done. Off when the console is not a
    terminal, unless enabled=True; then (enabled=None), inside `progress_lines`, a line every
    tenth."""
    if total is None and isinstance(items, Sequence):
        total = len(items)
    if _plain and not _live and enabled is None and not console.is_terminal:
        yield from _progress_lines(items, description, total, advance, _plain[-1])
        return
    if _live:
        progress = _live[-1]
        task = progress.add_task(description, total=total)
        try:
            for item in items:
                yield item
                progress.advance(task, advance(item))
        finally:
            progress.remove_task(task)
        return
    with progress_bar(enabled, transient=True) as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task, advance(item))


class Overview:
    """The run's start summary: a title and a few `key  value` lines, values wrapped to the
    console's width under themselves (no borders, no trailing blanks)."""

    def __init__(self, title: str, rows: Sequence[tuple[str, str]]):
        self.title, self.rows = title, list(rows)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        indent = max((len(key) for key, _ in self.rows), default=0) + 2
        width = max(options.max_width - indent, 20)
        yield Text(self.title, style="bold")
        for key, value in self.rows:
            lines = textwrap.wrap(value, width=width, break_on_hyphens=False) or [""]
            yield Text.assemble((key.ljust(indent), "bold"), lines[0])
            for line in lines[1:]:
                yield Text(" " * indent + line)


def overview_text(title: str, rows: Sequence[tuple[str, str]]) -> str:
    """The same summary as plain `key: value` lines (train.log)."""
    width = max((len(key) for key, _ in rows), default=0)
    return "\n".join([title, *(f"  {key.ljust(width)}  {value}" for key, value in rows)])


def fmt(value, spec: str = ".4f", missing: str = "-", *, show_nan: bool = True, show_inf: bool = True,
        small: float = 0.0, small_spec: str = ".2e") -> str:
    """A number for a table or a summary: `value` formatted with `spec`, or `missing` when it is
    None (not measured), or NaN with show_nan=False, or +-inf with show_inf=False (else they read
    "nan", "inf"). A nonzero value closer to 0 than `small` is formatted with `small_spec`
    instead (scientific notation, so that 0.0004 does not read 0.000)."""
    if value is None:
        return missing
    if isinstance(value, numbers.Real) and ((not show_nan and math.isnan(value))
                                           or (not show_inf and math.isinf(value))):
        return missing
    if small and value != 0 and abs(value) < small:
        return format(value, small_spec)
    return format(value, spec)


def summary_table(result: dict, status: Optional[str] = None) -> Table:
    """The end-of-run summary. `status` is the run's status as every report words it (a run
    that finished but learned nothing is "stalled"); result["status"] when not given. The run
    folder is not in the table: `print_summary` prints it on a line of its own, whole."""
    status = status or result["status"]
    colour = {"ok": "green", "diverged": "red", "failed": "red", "stalled": "magenta"}.get(status, "yellow")
    table = Table(title="deepinit run summary", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    lm = result.get("task") == "lm"  # blocks at random offsets: tokens trained on, not epochs
    rows = [
        ("status", f"[{colour}]{status}[/]" + (f" ({escape(str(result['reason']))})" if result.get("reason") else "")),
        ("updates / tokens seen", f"{result['updates']} / {fmt(result.get('train_tokens'), ',')}") if lm else
        ("updates / epochs", f"{result['updates']} / {result.get('epochs', '-')}"),
        ("train loss", fmt(result.get("train_loss"))),
        ("valid loss (best)", f"{fmt(result.get('valid_loss'))} ({fmt(result.get('best_valid_loss'))})"),
        ("valid ppl", fmt(result.get("valid_ppl"), ".2f")),
        ("throughput", f"{fmt(result.get('tokens_per_s'), ',.0f')} {'' if lm else 'target '}tokens/s"),
        ("wall time", f"{fmt(result.get('wall_s'), '.1f')} s"),
        ("parameters", f"{result.get('parameters', 0):,}"),
    ]
    if result.get("bleu") is not None:
        rows.insert(5, ("BLEU", fmt(result["bleu"], ".2f")))
    for key, value in rows:
        table.add_row(key, value)
    return table


def print_summary(result: dict, run_dir: str, status: Optional[str] = None,
                  notes: Sequence[str] = ()) -> None:
    """The summary table, then the run folder on a line of its own, never cut or wrapped (so
    that it can be copied from a terminal or a log), then any notes (one line each)."""
    console.print(summary_table(result, status))
    console.print(f"run folder: {run_dir}", soft_wrap=True, markup=False, highlight=False)
    for note in notes:
        console.print(note, soft_wrap=True, markup=False, highlight=False)


def format_duration(seconds: float, short: bool = False) -> str:
    """A time span as people read it: "95 s", "12.5 min", "3.2 h"; short=True: "95s", "12.5m",
    "3.2h" (a table column)."""
    s = float(seconds)
    unit_s, unit_min, unit_h = ("s", "m", "h") if short else (" s", " min", " h")
    if s < 120:
        return f"{s:.0f}{unit_s}"
    if s < 7200:
        return f"{s / 60:.1f}{unit_min}"
    return f"{s / 3600:.1f}{unit_h}"
