"""A bench report's tables: printed with rich (print_tables) and as Markdown beside the JSON
(markdown_tables, for docs/performance.md)."""
from __future__ import annotations

from functools import partial
from typing import Optional

from rich.table import Table

from runner.bench.compare import REFERENCE_NAMES
from runner.bench.workers import eager_fallback
from runner.console import console, fmt
from runner.run import hardware

_fmt = partial(fmt, show_nan=False)  # a NaN (a probe that could not measure) reads "-", like a missing value


def _pct(fraction: Optional[float]) -> str:
    return _fmt(None if fraction is None else 100 * fraction, ".1f") + ("" if fraction is None else "%")


def _reference_model(row: dict) -> str:
    return row["model"] + (" compiled" if row.get("compile") else "")


def _reference_sides(reference: dict) -> tuple[str, str]:
    """What the reference rows compare with ("torch.nn.Transformer", "a hand-written GPT"), and
    their targets ("1.2x", "1.2x for translation, 1.0x for lm")."""
    tasks = list(dict.fromkeys(row.get("task", "translation") for row in reference.values()))
    names = " and ".join(f"{REFERENCE_NAMES[t]} ({t})" if len(tasks) > 1 else REFERENCE_NAMES[t] for t in tasks)
    targets = {row.get("task", "translation"): row["tokens_per_s"]["target"] for row in reference.values()}
    target = ", ".join(f"{v}x" + (f" for {t}" if len(targets) > 1 else "") for t, v in targets.items())
    return names, target


def print_tables(report: dict) -> None:

    peak = report["peak"]
    entries = [e for e in report["entries"] if e["group"] == "preset"]
    machine = report["machine"]
    if entries:
        t = Table(title=f"deepinit bench: training and decoding on {machine['device_name']} "
                        f"({machine['threads']} threads)", title_justify="left")
        for col in ("preset", "model", "tok/s (min-max)", "ms/upd", "peak MB", "pad", "MFU",
                    "beam5/s", "greedy/s", "load"):
            t.add_column(col, justify="left" if col in ("preset", "model") else "right")
        for e in entries:
            if e["status"] == "failed":
                t.add_row(e["name"], "[red]failed[/]", *["-"] * 8)
                continue
            mfu = hardware.mfu(e["tokens_per_s"], e["flops_per_target_token"], peak["gflops"])
            t.add_row(e["name"], f"{e['model']} {e['precision']}",
                      f"{e['tokens_per_s']:,.0f} ({e['tokens_per_s_min']:,.0f}-{e['tokens_per_s_max']:,.0f})",
                      f"{e['ms_per_update']:,.0f}", f"{e['peak_memory_mb']:,.0f}",
                      f"{100 * e['padding_fraction']:.0f}%", f"{100 * mfu:.1f}%",
                      _fmt((e.get("beam5") or {}).get("sentences_per_s"), ".1f"),
                      _fmt((e.get("greedy") or {}).get("sentences_per_s"), ".1f"),
                      f"{e['load_train']['other_cores']:.2f}")
        console.print(t)
        for e in entries:
            if e.get("compiled") is not None:
                c = e["compiled"]
                fallback = eager_fallback(c)
                console.print(f"{e['name']}: torch.compile made {c['graphs']} graph(s) with "
                              f"{c['graph_breaks']} graph break(s)"
                              + (f"; [red]{fallback}[/]" if fallback else ""))
        timed = next((len(e["windows"]) for e in entries if e["status"] != "failed"), 0)
        console.print(f"tok/s: target tokens per second, median of {timed} timed "
                      f"windows; MFU: model FLOPs per target token x tok/s / peak ({peak['gflops']:,.0f} "
                      f"GFLOP/s {peak['dtype']}, {peak['source']}); load: cores other processes used.")
    depth = [e for e in report["entries"] if e["group"] == "depth"]
    if depth:
        width = next((e["model"].split(",")[0] for e in depth if e.get("model")), "64-128-2")
        t = Table(title=f"depth scaling: {width}, T-Fixup, norm=none", title_justify="left")
        for col in ("layers", "ckpt", "ms/update", "ms/upd/layer", "peak MB", "MB/added layer",
                    "loss", "status"):
            t.add_column(col, justify="right")
        for e in depth:
            if e["status"] == "failed":
                t.add_row(f"{e.get('layers')}", "-", "-", "-", "-", "-", "-", "[red]failed[/]")
                continue
            base = next((b for b in depth if b.get("checkpointing") == e["checkpointing"]
                         and b.get("status") != "failed"), e)
            layers = 2 * e["layers"]
            per_layer_mem = ((e["peak_memory_mb"] - base["peak_memory_mb"]) / (layers - 2 * base["layers"])
                             if e is not base else None)
            t.add_row(f"{e['layers']}+{e['layers']}", "yes" if e["checkpointing"] else "no",
                      f"{e['ms_per_update']:,.0f}", f"{e['ms_per_update'] / layers:.2f}",
                      f"{e['peak_memory_mb']:,.0f}", _fmt(per_layer_mem, ".2f"),
                      _fmt(e["train_loss"], ".3f"), e["status"])
        console.print(t)
        console.print("MB/added layer: peak memory growth over the shallowest entry with the "
                      "same checkpointing setting, per added layer.")
    for name, row in (report.get("peer") or {}).items():
        t = Table(title=f"deepinit vs fairseq: {name} (peer config {row['peer_config']}), medians of "
                        "alternating runs", title_justify="left")
        for col in ("measure", "deepinit", "fairseq", "ratio", "target", "deepinit runs", "fairseq runs"):
            t.add_column(col, justify="right")
        labels = {"tokens_per_s": "train tok/s", "beam5_sentences_per_s": "beam5 sent/s",
                  "greedy_sentences_per_s": "greedy sent/s"}
        for key, label in labels.items():
            r = row[key]
            ok = r["ratio"] is not None and r["target"] is not None and r["ratio"] >= r["target"]
            ratio = _fmt(r["ratio"], ".2f")
            if r["target"] is not None and r["ratio"] is not None:
                ratio = f"[{'green' if ok else 'red'}]{ratio}[/]"
            t.add_row(label, _fmt(r["deepinit"], ",.1f"), _fmt(r["fairseq"], ",.1f"), ratio,
                      _fmt(r["target"], ".1f"), ", ".join(_fmt(v, ",.1f") for v in r["deepinit_runs"]),
                      ", ".join(_fmt(v, ",.1f") for v in r["fairseq_runs"]))
        for key in ("beam5", "greedy"):
            lengths = row.get(f"{key}_output_tokens_per_sentence") or {}
            speed = row.get(f"{key}_output_tokens_per_s") or {}
            if lengths.get("deepinit") or lengths.get("fairseq"):
                t.add_row(f"{key} out tok/sent", _fmt(lengths.get("deepinit"), ".1f"),
                          _fmt(lengths.get("fairseq"), ".1f"), "", "", "", "")
                t.add_row(f"{key} out tok/s", _fmt(speed.get("deepinit"), ",.0f"),
                          _fmt(speed.get("fairseq"), ",.0f"), _fmt(speed.get("ratio"), ".2f"), "", "", "")
        if row.get("mfu"):
            t.add_row("MFU", _fmt(100 * (row["mfu"]["deepinit"] or 0), ".1f") + "%",
                      _fmt(100 * (row["mfu"]["fairseq"] or 0), ".1f") + "%", "", "", "", "")
        console.print(t)
    reference = report.get("reference") or {}
    if reference:
        reps = max(len(row["reference_runs"]) for row in reference.values())
        names, target = _reference_sides(reference)
        t = Table(title=f"deepinit vs plain PyTorch ({names}), the same training step: "
                        f"medians of {reps} alternating runs per side", title_justify="left")
        for col in ("preset", "model", "deepinit tok/s", "PyTorch tok/s", "ratio", "deepinit MFU",
                    "PyTorch MFU", "deepinit MB", "PyTorch MB"):
            t.add_column(col, justify="left" if col in ("preset", "model") else "right")
        for name, row in reference.items():
            r, mfu, mem = row["tokens_per_s"], row.get("mfu") or {}, row["peak_memory_mb"]
            ratio = _fmt(r["ratio"], ".2f")
            if r["ratio"] is not None:
                ratio = f"[{'green' if r['ratio'] >= r['target'] else 'red'}]{ratio}[/]"
            t.add_row(name, _reference_model(row), _fmt(r["deepinit"], ",.0f"), _fmt(r["reference"], ",.0f"),
                      ratio, _pct(mfu.get("deepinit")), _pct(mfu.get("reference")),
                      _fmt(mem["deepinit"], ",.0f"), _fmt(mem["reference"], ",.0f"))
        console.print(t)
        memory = "max allocated" if machine["device"] == "cuda" else "max RSS"
        console.print(f"ratio: deepinit's median tok/s over the plain-PyTorch reference's, both trained on "
                      f"the same batches (target {target}: green when met); MFU against the same "
                      f"peak as above; MB: peak memory ({memory}).")
    profiled = _profile_rows(report)
    if profiled:
        t = Table(title="where an update's time goes (torch.profiler, --profile)", title_justify="left")
        for col in ("entry", "operator", "self ms/update", "share", "calls/update"):
            t.add_column(col, justify="left" if col in ("entry", "operator") else "right")
        for row in profiled:
            t.add_row(*row)
        console.print(t)
        console.print("self time: in the operator itself, not in the operators it calls (on CUDA: the "
                      "GPU time of the kernels it launched); share: of all operators' self time (on "
                      "CUDA: of the GPU's busy time)." + _gpu_busy_line(report) + " Full tables and traces: "
                      + ", ".join(e["profile"]["table"] for e in report["entries"] if e.get("profile")))


def _gpu_busy_line(report: dict) -> str:
    """' GPU busy X of Y ms per profiled update (entry)' for the entries profiled on CUDA."""
    parts = [f"{e['name']}: {p['device_busy_ms_per_update']:,.1f} of {p['step_ms_per_update']:,.1f} ms"
             for e in report["entries"] if (p := e.get("profile") or {}).get("step_ms_per_update")]
    return (" GPU busy per profiled update (profiler overhead included in the span): "
            + "; ".join(parts) + ".") if parts else ""


PROFILE_ROWS = 5  # operators per profiled entry in the printed and Markdown tables


def _profile_rows(report: dict) -> list[tuple[str, ...]]:
    rows = []
    for e in report["entries"]:
        for op in ((e.get("profile") or {}).get("top") or [])[:PROFILE_ROWS]:
            rows.append((e["name"], op["name"], f"{op['self_ms_per_update']:,.2f}",
                         _pct(op["share"]), f"{op['calls_per_update']:,.0f}"))
    return rows


def markdown_tables(report: dict) -> str:
    """The report's tables as Markdown (written next to the JSON, for docs/performance.md)."""
    peak, m = report["peak"], report["machine"]
    lines = [f"Machine: {m['device_name']}, {m['cpus']} CPUs, {m['threads']} threads, torch {m['torch']}; "
             f"peak {peak['gflops']:,.0f} GFLOP/s {peak['dtype']} ({peak['source']}); load average "
             f"{m['loadavg_start'][0]:.2f} at the start, {m.get('loadavg_end', [float('nan')])[0]:.2f} at the end. "
             f"Command: `{' '.join(report['command'])}`.", ""]
    entries = [e for e in report["entries"] if e["group"] == "preset" and e["status"] != "failed"]
    if entries:
        lines += ["| preset | model | tok/s median (min-max) | tok/CPU-s | ms/update | tok/update | peak MB "
                  "| padding | MFU | beam5 sent/s | greedy sent/s | other load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for e in entries:
            mfu = hardware.mfu(e["tokens_per_s"], e["flops_per_target_token"], peak["gflops"])
            lines.append(
                f"| {e['name']} | {e['model']} {e['precision']} | {e['tokens_per_s']:,.0f} "
                f"({e['tokens_per_s_min']:,.0f}-{e['tokens_per_s_max']:,.0f}) | {e['tokens_per_cpu_s']:,.0f} "
                f"| {e['ms_per_update']:,.0f} | {e['tokens_per_update']:,.0f} | {e['peak_memory_mb']:,.0f} "
                f"| {100 * e['padding_fraction']:.1f}% | {100 * mfu:.1f}% "
                f"| {_fmt((e.get('beam5') or {}).get('sentences_per_s'), '.1f')} "
                f"| {_fmt((e.get('greedy') or {}).get('sentences_per_s'), '.1f')} "
                f"| {e['load_train']['other_cores']:.2f} |")
        lines.append("")
    depth = [e for e in report["entries"] if e["group"] == "depth" and e["status"] != "failed"]
    if depth:
        lines += ["| layers | checkpointing | ms/update | ms/update/layer | peak MB | loss | other load |",
                  "|---|---|---|---|---|---|---|"]
        for e in depth:
            lines.append(f"| {e['layers']}+{e['layers']} | {'yes' if e['checkpointing'] else 'no'} "
                         f"| {e['ms_per_update']:,.0f} | {e['ms_per_update'] / (2 * e['layers']):.2f} "
                         f"| {e['peak_memory_mb']:,.0f} | {_fmt(e['train_loss'], '.3f')} "
                         f"| {e['load_train']['other_cores']:.2f} |")
        lines.append("")
    for name, row in (report.get("peer") or {}).items():
        lines += [f"{name} (fairseq config `{row['peer_config']}`), medians of alternating runs:", "",
                  "| measure | deepinit | fairseq | ratio | target | deepinit runs | fairseq runs |",
                  "|---|---|---|---|---|---|---|"]
        for key, label in (("tokens_per_s", "train tok/s"), ("beam5_sentences_per_s", "beam-5 sent/s"),
                           ("greedy_sentences_per_s", "greedy sent/s")):
            r = row[key]
            lines.append(f"| {label} | {_fmt(r['deepinit'], ',.1f')} | {_fmt(r['fairseq'], ',.1f')} "
                         f"| {_fmt(r['ratio'], '.2f')} | {_fmt(r['target'], '.1f')} "
                         f"| {', '.join(_fmt(v, ',.1f') for v in r['deepinit_runs'])} "
                         f"| {', '.join(_fmt(v, ',.1f') for v in r['fairseq_runs'])} |")
        for key in ("beam5", "greedy"):
            lengths = row.get(f"{key}_output_tokens_per_sentence") or {}
            if lengths.get("deepinit") or lengths.get("fairseq"):
                lines.append(f"| {key} output tok/sentence | {_fmt(lengths.get('deepinit'), '.1f')} "
                             f"| {_fmt(lengths.get('fairseq'), '.1f')} | | | | |")
        if row.get("mfu"):
            lines.append(f"| MFU | {_fmt(100 * (row['mfu']['deepinit'] or 0), '.1f')}% "
                         f"| {_fmt(100 * (row['mfu']['fairseq'] or 0), '.1f')}% | | | | |")
        loads = [r["load_train"]["other_cores"] for r in row["deepinit_runs"] if r.get("load_train")]
        peer_loads = [r["load"]["other_cores"] for r in row["fairseq_runs"] if r.get("load")]
        lines += ["", f"Other processes' load (cores): deepinit runs {', '.join(f'{x:.2f}' for x in loads)}; "
                      f"fairseq runs {', '.join(f'{x:.2f}' for x in peer_loads)}.", ""]
    reference = report.get("reference") or {}
    if reference:
        reps = max(len(row["reference_runs"]) for row in reference.values())
        names, target = _reference_sides(reference)
        lines += [f"deepinit against plain PyTorch ({names}, runner/bench/reference.py, lm.py) on the "
                  f"same batches, medians of {reps} alternating runs per side; ratio = deepinit / PyTorch "
                  f"tok/s, target {target}:", "",
                  "| preset | model | deepinit tok/s | PyTorch tok/s | ratio | target | deepinit MFU | PyTorch MFU "
                  "| deepinit peak MB | PyTorch peak MB | deepinit runs tok/s | PyTorch runs tok/s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, row in reference.items():
            r, mfu, mem = row["tokens_per_s"], row.get("mfu") or {}, row["peak_memory_mb"]
            lines.append(f"| {name} | {_reference_model(row)} | {_fmt(r['deepinit'], ',.0f')} "
                         f"| {_fmt(r['reference'], ',.0f')} | {_fmt(r['ratio'], '.2f')} | {r['target']:.1f} "
                         f"| {_pct(mfu.get('deepinit'))} | {_pct(mfu.get('reference'))} "
                         f"| {_fmt(mem['deepinit'], ',.0f')} | {_fmt(mem['reference'], ',.0f')} "
                         f"| {', '.join(_fmt(v, ',.0f') for v in r['deepinit_runs'])} "
                         f"| {', '.join(_fmt(v, ',.0f') for v in r['reference_runs'])} |")
        lines.append("")
        for name, row in reference.items():
            loads = [", ".join(f"{r['load_train']['other_cores']:.2f}" for r in row[f"{side}_runs"]
                               if r.get("load_train")) or "-" for side in ("deepinit", "reference")]
            lines.append(f"{name}: other processes' load (cores) during the deepinit runs {loads[0]}; "
                         f"during the PyTorch runs {loads[1]}.")
        lines.append("")
    profiled = _profile_rows(report)
    if profiled:
        lines += ["| entry | operator (torch.profiler) | self ms/update | share | calls/update |",
                  "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in profiled]
        lines.append("")
    return "\n".join(lines)

