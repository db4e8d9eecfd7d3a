"""The checker behind tests/test_results_docs.py: the numbers a doc quotes inside a results block
(`<!-- results: PATH -->` ... `<!-- /results -->`) against what the code renders from the
committed records at test time.

Sources. `results/<target>/real/report.md` is rendered from `records.jsonl` by the suite's own
renderer (runner/tables/report.py, as `deepinit reproduce` writes it; all-schemes by render_combined),
`last-checkpoint-bleu.md` by runner/tables/last_checkpoint.py's write_table from its jsonl; a
`.json`/`.jsonl` file is read for its values at full precision; any other file (a hand-written
measurement report) is taken as committed.

Tables. A markdown table in a block is compared with the rendered tables, cell by cell: its
columns are the rendered columns of the same name (a doc's header may add words after it,
"BLEU (tok) [95% CI]"; "diverged / stalled" is two columns), and each row is the rendered row
with the same label, or, where the doc names the arm in words ("Pre-LN, 500 warmup updates" for
`method=pre_ln warmup.updates=500`), the rendered row whose cells agree with the row's, the label
deciding a tie. A cell of numbers ("33.28 ± 0.42 [32.81, 33.62]", "0 / 0", "2.22 (n=1)") must
equal the rendered cell number by number, in order, at the precision the doc prints (a doc may
leave off trailing numbers, e.g. the interval). A cell of numbers in a table whose columns are
not the report's (a pivot: one column per learning rate, "23.78 ± 0.54 (26.36)") must be cells
of one rendered row whose label has the numbers of the doc's row label and column header
(model.layers=6, optim.lr=0.004), each statistic from the same rendered column throughout the
table.

Prose (and table cells with words): each number must be a number of the rendered source at the
precision the doc prints: the same digits where the source is rendered text, the value rounded to
the printed decimals where it is a JSON value.
"""
from __future__ import annotations

import functools
import json
import re
import tempfile
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Iterable, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- results: (?P<path>\S+) -->(?P<body>.*?)<!-- /results -->", re.S)
# a decimal number as printed: optional sign, thousands separators, decimals, an exponent
# ("6.64e-07"); "v1" and "x86_64" are names, not numbers
NUMBER = re.compile(r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:e[-+]\d+(?![\w.]))?")
# a cell that holds only numbers and their punctuation: "33.28 ± 0.42 [32.81, 33.62]", "0 / 0",
# "3/3", "2.22 (n=1)", "+1.16"
STATISTIC = re.compile(r"[\d\s.,±\[\]()/+\-−n=]+")
SEPARATOR = re.compile(r"\s*\|?[\s:|-]*-[\s:|-]*")  # |---|---|


@dataclass(frozen=True)
class Num:
    text: str
    value: Decimal
    places: Optional[int]  # decimals printed; None: an exact value (a JSON number)


@dataclass(frozen=True)
class Problem:
    """A quoted number (or table cell) that is not what the records render."""

    where: str  # the doc and block
    quoted: str  # the number or cell as the doc prints it
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def parse_number(text: str) -> Num:
    clean = text.replace(",", "").replace("−", "-")
    mantissa, _, exponent = clean.partition("e")  # 6.64e-07: 2 decimals of the mantissa, 9 in all
    places = (len(mantissa.split(".", 1)[1]) if "." in mantissa else 0) - int(exponent or 0)
    return Num(text, Decimal(clean), places)


def numbers(text: str) -> list[Num]:
    return [parse_number(m.group()) for m in NUMBER.finditer(text)]


def _rounded(value: Decimal, places: int) -> set[Decimal]:
    step = Decimal(1).scaleb(-places)
    return {value.quantize(step, rounding=r) for r in (ROUND_HALF_EVEN, ROUND_HALF_UP)}


def agrees(quoted: Num, source: Num) -> bool:
    """Whether a quoted number is the source number at the precision the quote prints: the same
    value where the source is printed text (a report's 3.201 is not quoted as 3.20: it is
    printed to 3 decimals), the value rounded to the printed decimals where the source is exact
    (a JSON value)."""
    if quoted.value == source.value:
        return True
    if source.places is not None:
        return False
    return quoted.value in _rounded(source.value, quoted.places)


def agree_in_order(quoted: Sequence[Num], source: Sequence[Num]) -> bool:
    """A doc's cell against a rendered cell: its numbers are the rendered cell's first numbers,
    position by position."""
    return 0 < len(quoted) <= len(source) and all(agrees(q, s) for q, s in zip(quoted, source))


def in_order(quoted: Sequence[Num], source: Sequence[Num]) -> bool:
    """A doc's text cell against a rendered one: its numbers occur among the rendered cell's in
    the same order (the doc may leave words and numbers out, not change them). Words are not
    compared: "(3 diverged)" for "(0 diverged, 3 stalled)" passes; the label and the verdict are."""
    it = iter(source)
    return all(any(agrees(q, s) for s in it) for q in quoted)


# ----------------------------------------------------------------------------- markdown tables
@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


def split_row(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[Table]:
    out, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if (lines[i].lstrip().startswith("|") and i + 1 < len(lines)
                and SEPARATOR.fullmatch(lines[i + 1])):
            header, rows, i = split_row(lines[i]), [], i + 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(split_row(lines[i]))
                i += 1
            out.append(Table(header, rows))
        else:
            i += 1
    return out


def table_spans(text: str) -> list[tuple[int, int]]:
    """Where the tables of `text` are (start, end offsets), to tell prose from tables."""
    spans, offset = [], 0
    lines = text.splitlines(keepends=True)
    starts = []
    for line in lines:
        starts.append(offset)
        offset += len(line)
    i = 0
    while i < len(lines):
        if (lines[i].lstrip().startswith("|") and i + 1 < len(lines)
                and SEPARATOR.fullmatch(lines[i + 1].rstrip("\n"))):
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            spans.append((starts[i], starts[j] if j < len(lines) else offset))
            i = j
        else:
            i += 1
    return spans


def _norm(text: str) -> str:
    return " ".join(text.replace("`", "").replace("*", "").lower().split())


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def is_statistic(cell: str) -> bool:
    return bool(re.search(r"\d", cell)) and bool(STATISTIC.fullmatch(cell.replace("*", "")))


def column_map(header: Sequence[str], source_header: Sequence[str]) -> dict[int, list[int]]:
    """The doc's columns (after the label) that are rendered columns: the same name, a name that
    begins with a rendered column's name, or "a / b" for two of them."""
    names = [_norm(h) for h in source_header]
    out = {}
    for j, h in enumerate(header):
        if j == 0:
            continue
        h = _norm(h)
        if h in names[1:]:
            out[j] = [names.index(h, 1)]
            continue
        parts = [p.strip() for p in h.split(" / ")]
        if len(parts) > 1 and all(p in names[1:] for p in parts):
            out[j] = [names.index(p, 1) for p in parts]
            continue
        prefixes = [i for i, n in enumerate(names) if i > 0 and n and h.startswith(n)
                    and not h[len(n):len(n) + 1].isalnum()]
        if prefixes:
            out[j] = [max(prefixes, key=lambda i: len(names[i]))]
    return out


def _cell_parts(cell: str, width: int) -> Optional[list[str]]:
    if width == 1:
        return [cell]
    parts = [p.strip() for p in cell.split("/")]
    return parts if len(parts) == width else None


def _cell_agrees(cell: str, source_row: Sequence[str], cols: Sequence[int]) -> bool:
    parts = _cell_parts(cell, len(cols))
    return parts is not None and all(
        i < len(source_row) and agree_in_order(numbers(p), numbers(source_row[i]))
        for p, i in zip(parts, cols))


def pivot_parts(cell: str) -> list[list[Num]]:
    """A pivot's cell as its statistics: "23.78 ± 0.54 (26.36)" is [23.78, 0.54] and [26.36]
    ("(n=1)" stays with the statistic it counts)."""
    groups = re.findall(r"\(([^()]*)\)", cell)
    main = re.sub(r"\((?!n=)[^()]*\)", " ", cell)
    return [numbers(main)] + [numbers(g) for g in groups if not g.strip().startswith("n=")]


def _label_numbers(text: str) -> set[Decimal]:
    return {n.value for n in numbers(text)}


def check_pivot(table: Table, rendered: Sequence[Table], where: str) -> list[Problem]:
    """A table whose columns are not the report's (one column per learning rate, say): each cell
    of numbers must be one rendered row's cells, and each of its statistics the same rendered
    column for every cell of the table (the column most of them agree with); the numbers of
    the row's label and the column's header must be numbers of that row's label (layers=6,
    optim.lr=0.004)."""
    rows = [r for t in rendered for r in t.rows]
    cells = [(i, j) for i, row in enumerate(table.rows) for j in range(1, len(row))
             if is_statistic(row[j])]
    if not cells:
        return []

    def candidates(i: int, j: int) -> list[list[str]]:
        wanted = _label_numbers(table.rows[i][0]) | _label_numbers(table.header[j] if j < len(table.header) else "")
        return [r for r in rows if wanted <= _label_numbers(r[0])]

    width = max(len(r) for r in rows) if rows else 0
    columns = []  # per statistic of a cell, the rendered column it is
    for k in range(max(len(pivot_parts(table.rows[i][j])) for i, j in cells)):
        def votes(c: int) -> int:
            return sum(any(c < len(r) and len(pivot_parts(table.rows[i][j])) > k
                           and agree_in_order(pivot_parts(table.rows[i][j])[k], numbers(r[c]))
                           for r in candidates(i, j)) for i, j in cells)
        columns.append(max(range(1, width), key=votes, default=1))
    problems = []
    for i, j in cells:
        parts = pivot_parts(table.rows[i][j])
        if not any(all(c < len(r) and agree_in_order(p, numbers(r[c])) for p, c in zip(parts, columns))
                   for r in candidates(i, j)):
            problems.append(Problem(where, table.rows[i][j], (
                f"row '{table.rows[i][0]}', column '{table.header[j]}': the doc says "
                f"'{table.rows[i][j]}', which is no rendered row's numbers there")))
    return problems


def check_table(table: Table, rendered: Sequence[Table], where: str) -> tuple[list[Problem], list[str]]:
    """(problems, text left for the prose check) of one table of a doc against the rendered
    tables of its source."""
    problems, prose = [], [" ".join(table.header)]
    groups: dict[tuple, list[Table]] = {}
    for t in rendered:
        groups.setdefault(tuple(t.header), []).append(t)
    best_map, best_rows = {}, []
    for header, members in groups.items():
        mapping = column_map(table.header, header)
        if len(mapping) > len(best_map):
            best_map, best_rows = mapping, [r for t in members for r in t.rows]
    if not best_map:
        problems += check_pivot(table, rendered, where)
    for row in table.rows:
        label = row[0] if row else ""
        strict = {j: cols for j, cols in best_map.items() if j < len(row) and is_statistic(row[j])}
        pivot = [] if best_map else [j for j in range(1, len(row)) if is_statistic(row[j])]
        prose += [c for j, c in enumerate(row) if j not in strict and j not in pivot]
        same = [r for r in best_rows if _norm(r[0]) == _norm(label)]
        for j, cols in best_map.items():
            # a text cell of a row the records render under the same label: its numbers are the
            # rendered cell's, in order ("3 of 3 seeds ... 3 stalled" is not "... 2 stalled")
            if j in strict or j >= len(row) or not same or not numbers(row[j]):
                continue
            if not any(in_order(numbers(row[j]), numbers(r[cols[0]])) for r in same if cols[0] < len(r)):
                rendered_cell = same[0][cols[0]] if cols[0] < len(same[0]) else "-"
                problems.append(Problem(where, row[j], (
                    f"row '{label}', column '{table.header[j]}': the doc says '{row[j]}', the "
                    f"records render '{rendered_cell}'")))
        if strict:

            def score(r):
                agree = sum(_cell_agrees(row[j], r, cols) for j, cols in strict.items())
                agree += sum(j < len(row) and i < len(r) and _norm(row[j]) == _norm(r[i])
                             for j, cols in best_map.items() if j not in strict for i in cols[:1])
                return agree, len(_words(label) & _words(r[0]))

            chosen = max(same or best_rows, key=score, default=None)
            for j, cols in strict.items():
                if chosen is None or not _cell_agrees(row[j], chosen, cols):
                    rendered_cell = " / ".join(chosen[i] for i in cols if i < len(chosen)) if chosen else "-"
                    problems.append(Problem(where, row[j], (
                        f"row '{label}', column '{table.header[j]}': the doc says '{row[j]}', the "
                        f"records render '{rendered_cell}' (row '{chosen[0] if chosen else '-'}')")))
    return problems, prose


# ----------------------------------------------------------------------------- sources
@dataclass
class Source:
    text: Optional[str]  # rendered markdown (None for JSON)
    pool: list[Num]  # every number of the source

    def __post_init__(self):
        self.tables = tables(self.text) if self.text else []


def _json_numbers(value) -> Iterable[Num]:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        if value == value and value not in (float("inf"), float("-inf")):
            yield Num(repr(value), Decimal(repr(value)), None)
            if isinstance(value, float):
                yield Num(repr(value), Decimal(value), None)
    elif isinstance(value, str):
        yield from numbers(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _json_numbers(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _json_numbers(v)


def render_report(target: str) -> str:
    """results/<target>/real/report.md as the code renders it from the records now."""
    from runner.tables.all_schemes import (
        ALL_SCHEMES,
        ALL_SCHEMES_BASELINE,
        ALL_SCHEMES_INTRO,
        ALL_SCHEMES_TITLE,
        LM_ALL_SCHEMES,
        all_schemes_sections,
        render_lm_all_schemes,
    )
    from runner.tables.combined import render_combined
    from runner.tables.plan import real_suite
    from runner.tables.report import render
    from runner.tables.targets import TARGETS

    if target == ALL_SCHEMES:
        return render_combined(ALL_SCHEMES_TITLE, ALL_SCHEMES_INTRO, all_schemes_sections(), ALL_SCHEMES_BASELINE)
    if target == LM_ALL_SCHEMES:
        return render_lm_all_schemes()
    spec = TARGETS[target]
    real = real_suite(spec)
    return render(target, spec.title, real.part.preset, real.cells)


def render_last_checkpoint_table(target: str) -> str:
    """results/<target>/real/last-checkpoint-bleu.md as `deepinit reproduce TARGET
    --last-checkpoint-bleu` writes it from its jsonl (runner/tables/last_checkpoint.py)."""
    from runner.tables.last_checkpoint import write_table

    folder = REPO / "results" / target / "real"
    lines = [json.loads(line) for line in (folder / "last-checkpoint-bleu.jsonl").read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "last-checkpoint-bleu.md"
        write_table(target, lines, out)
        return out.read_text()


@functools.lru_cache(maxsize=None)
def source(path: str) -> Source:
    """What a results block that names results/`path` is checked against."""
    file = REPO / "results" / path
    if not file.is_file():
        raise FileNotFoundError(f"results/{path} is not committed")
    parts = Path(path).parts
    if len(parts) == 3 and parts[1] == "real" and parts[2] == "report.md":
        text = render_report(parts[0])
    elif len(parts) == 3 and parts[1] == "real" and parts[2] == "last-checkpoint-bleu.md":
        text = render_last_checkpoint_table(parts[0])
    elif file.suffix in (".json", ".jsonl"):
        lines = file.read_text().splitlines() if file.suffix == ".jsonl" else [file.read_text()]
        pool = [n for line in lines if line.strip() for n in _json_numbers(json.loads(line))]
        return Source(None, pool)
    else:
        text = file.read_text()
    return Source(text, numbers(text))


# ----------------------------------------------------------------------------- the check
def blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group("path"), m.group("body")) for m in BLOCK.finditer(text)]


def _magnitude(n: Num) -> Num:
    return Num(n.text, abs(n.value), n.places)


def signed(n: Num) -> bool:
    return n.text[:1] in "+-−"


def _agrees_in_size(quoted: Num, source: Num) -> bool:
    """agrees; for a quote printed without a sign, also agrees in magnitude (prose may drop a
    sign: "falls by 0.052" for a slope of -0.052). A quote printed with a sign keeps it: "+0.03"
    is not a report's "-0.03"."""
    return agrees(quoted, source) or (not signed(quoted) and agrees(_magnitude(quoted), _magnitude(source)))


# A number and the interval after it, with the p that may follow: "+0.78 [-0.62, +2.18], p=0.14",
# "0.16 nats above Pre-LN [95% paired t 0.13 to 0.19]"; "1.901 (SD 0.009, ...)" is not one, nor
# a link's path in brackets
INTERVAL_GROUP = re.compile(
    rf"(?P<head>{NUMBER.pattern})[^\d\[\].;|]{{0,40}}?\[(?P<inside>[^\]|/`]*)\]"
    rf"(?P<p>,?\s*(?:one-sided\s+|two-sided\s+)?p\s*=\s*{NUMBER.pattern})?")
# how many numbers of the source's stream a group's numbers may spread over beyond its own count
# (an interval's "95%" the doc leaves out, a source's Holm p between)
GROUP_SLACK = 2
# an interval's level at its start ("[95% paired t ..."): the doc's label, not a result
LEVEL = re.compile(r"^\s*\d+(?:\.\d+)?%")


@dataclass(frozen=True)
class IntervalGroup:
    head: Num
    bounds: tuple[Num, ...]  # the numbers inside the brackets, but the level
    p: tuple[Num, ...]

    @property
    def numbers(self) -> list[Num]:
        return [self.head, *self.bounds, *self.p]

    def readings(self) -> list[list[Num]]:
        """The orders the source may print these numbers in: as quoted; and, where no number is
        quoted with a sign, with the bounds the other way round (prose says "0.16 ... [0.13 to
        0.19]" for a report's "-0.16 [-0.19, -0.13]")."""
        as_quoted = self.numbers
        if any(signed(n) for n in as_quoted):
            return [as_quoted]
        return [as_quoted, [self.head, *reversed(self.bounds), *self.p]]


def interval_groups(text: str) -> list[IntervalGroup]:
    """Each interval group of prose (INTERVAL_GROUP), in the order printed."""
    return [IntervalGroup(parse_number(m.group("head")), tuple(numbers(LEVEL.sub(" ", m.group("inside")))),
                          tuple(numbers(m.group("p") or "")))
            for m in INTERVAL_GROUP.finditer(text)]


def in_one_window(group: IntervalGroup, stream: Sequence[Num], slack: int = GROUP_SLACK) -> bool:
    """Whether the group's numbers occur in order (one of its readings) within one stretch of
    len(group) + slack consecutive numbers of `stream`."""
    width = len(group.numbers) + slack
    for start in range(max(1, len(stream) - width + 1)):
        window = stream[start:start + width]
        for reading in group.readings():
            it = iter(window)
            if all(any(_agrees_in_size(q, s) for s in it) for q in reading):
                return True
    return False


def prose_problems(text: str, src: Source, where: str) -> list[Problem]:
    """Numbers of prose that are no number of the source at their printed precision, anywhere in
    it; and, where the source is rendered text, an estimate quoted with its interval ("+0.78
    [-0.62, +2.18], p=0.14") whose numbers are not printed together in the source, within a few
    numbers of one another: so one changed digit of such a group is caught even when the new
    value is some other number of the source."""
    problems = [Problem(where, n.text, f"{n.text} is no number of the source at the printed precision")
                for n in numbers(text) if not any(_agrees_in_size(n, s) for s in src.pool)]
    if src.text is None:
        return problems
    missing = {p.quoted for p in problems}
    for group in interval_groups(text):
        # a group with a number the source lacks is reported by that number already
        if not any(n.text in missing for n in group.numbers) and not in_one_window(group, src.pool):
            quoted = " ".join(n.text for n in group.numbers)
            problems.append(Problem(where, quoted, f"the numbers {quoted} are not printed together in the "
                                                  "source (an estimate and its interval)"))
    return problems


def check_block(path: str, body: str, where: str = "") -> list[Problem]:
    """The problems of one results block: each a line naming the number and what the records
    render instead."""
    where = where or f"results/{path}"
    src = source(path)
    problems, prose = [], []
    spans = table_spans(body)
    at = 0
    for start, end in spans:
        prose.append(body[at:start])
        at = end
    prose.append(body[at:])
    rendered = src.tables
    for table in tables(body):
        if rendered:
            found, left = check_table(table, rendered, where)
            problems += found
            prose += left
        else:
            prose += [" ".join(table.header)] + [" ".join(row) for row in table.rows]
    for text in prose:
        problems += prose_problems(text, src, where)
    return problems


def check_doc(text: str, doc: str = "") -> list[Problem]:
    """Every problem of every results block of a doc's text."""
    problems = []
    for i, (path, body) in enumerate(blocks(text)):
        problems += check_block(path, body, f"{doc} block {i + 1} (results/{path})")
    return problems
