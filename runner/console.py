"""Everything the user sees: the rich console, the live progress bar and the end summary."""
from __future__ import annotations

import logging

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

console = Console(stderr=False)
log = logging.getLogger("deepinit")


def progress_bar(enabled: bool | None) -> Progress:
    """Updates done / total, loss, lr, tokens/s, elapsed and ETA. Off when the console is not a
    terminal (sweeps, CI) unless forced with trainer.progress=true."""
    disable = not console.is_terminal if enabled is None else not enabled
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss [cyan]{task.fields[loss]}"), TextColumn("lr {task.fields[lr]}"),
        TextColumn("{task.fields[tps]} tok/s"), TimeElapsedColumn(), TextColumn("ETA"),
        TimeRemainingColumn(), console=console, disable=disable, transient=False)


def fmt(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def summary_table(result: dict, run_dir: str) -> Table:
    status = result["status"]
    colour = {"ok": "green", "diverged": "red", "failed": "red"}.get(status, "yellow")
    table = Table(title="deepinit run summary", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("status", f"[{colour}]{status}[/]" + (f" ({result['reason']})" if result.get("reason") else "")),
        ("updates / epochs", f"{result['updates']} / {result.get('epochs', '-')}"),
        ("train loss", fmt(result.get("train_loss"))),
        ("valid loss (best)", f"{fmt(result.get('valid_loss'))} ({fmt(result.get('best_valid_loss'))})"),
        ("valid ppl", fmt(result.get("valid_ppl"), ".2f")),
        ("throughput", f"{fmt(result.get('tokens_per_s'), ',.0f')} target tokens/s"),
        ("wall time", f"{fmt(result.get('wall_s'), '.1f')} s"),
        ("parameters", f"{result.get('parameters', 0):,}"),
        ("run folder", run_dir),
    ]
    if result.get("bleu") is not None:
        rows.insert(5, ("BLEU", fmt(result["bleu"], ".2f")))
    for key, value in rows:
        table.add_row(key, value)
    return table
