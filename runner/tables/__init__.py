"""Paper tables: reproduction targets, their suites of cells, the committed records, the statistics
and the rule book that turn records into verdicts, and the rendering of reports.

    rulebook   the versioned definitions (outcome of a cell, intervals, tests) every table uses
    evidence   statistics over seeds and the verdict on each pre-registered claim
    records    results/<target>/<tier>/records.jsonl: one audited record per trained cell
    suite      a suite's cells run on this machine, and its report
    reproduce  the targets (the papers' tables), planning, cost, and `deepinit reproduce`

The CLI calls this package; it calls the tools (sweep, bench) and the run layer; nothing below it
imports it (an import-linter contract, pyproject.toml).
"""
