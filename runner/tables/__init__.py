"""Paper tables: reproduction targets, their suites of cells, the committed records, the statistics
and the rule book that turn records into verdicts, and the rendering of reports.

The modules, each importing only those listed below it (an import-linter contract, pyproject.toml):

    reproduce     `deepinit reproduce`: which tier or table a call asks for
    real_tier     the real and gpu tiers: a suite's cells, `all` in one pool, `status`
    sweep_tier    the cpu and paper scales: a target's presets through `deepinit -m`
    all_schemes   one table of every scheme from the real-tier suites' records
    cost          the paper scale's GPU-hours, from model FLOPs
    render        the cpu and paper tables (reproduction.md)
    plan          what a call asks for, a target's cells and their state, time estimates
    pool          a suite's cells trained on this machine, each record written at once
    combined      a table of several suites' arms, compared with a baseline
    report        a suite's report: its arms, notes and verdicts
    plots         a suite's figures
    suite         a suite's cells and the verdicts on its claims
    evidence      statistics over seeds and the verdict on each pre-registered claim
    records       results/<target>/<tier>/records.jsonl: one audited record per trained cell
    targets       the targets (the papers' tables), their presets and the papers' numbers
    rulebook      the versioned definitions (outcome of a cell, intervals, tests) every table uses

The CLI calls this package; it calls the sweep tool and the run layer; nothing below it imports
it (an import-linter contract, pyproject.toml).
"""
