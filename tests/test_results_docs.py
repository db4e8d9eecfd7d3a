"""Docs quote results, never type them: every number inside a results block of
docs/reproductions.md, docs/performance.md, docs/methods.md or README.md (between `<!-- results: PATH -->` and `<!-- /results -->`) appears in the
committed file results/PATH it names. Measured numbers appear in the docs only inside such
blocks; the rest of the page states options, recipes and the papers' numbers."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- results: (?P<path>\S+) -->(?P<body>.*?)<!-- /results -->", re.S)
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?")


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group("path"), m.group("body")) for m in BLOCK.finditer(text)]


def missing_numbers(body: str, source: str) -> list[str]:
    return [n for n in NUMBER.findall(body) if n not in source]


def test_block_parser():
    text = "a <!-- results: t/r.md -->\n| 1.25 | 3 |\n<!-- /results --> b"
    assert blocks(text) == [("t/r.md", "\n| 1.25 | 3 |\n")]
    assert missing_numbers("| 1.25 | 3 | 7.5 |", "x 1.25 y 3") == ["7.5"]


@pytest.mark.parametrize("doc", ["docs/reproductions.md", "docs/performance.md", "docs/methods.md", "README.md"])
def test_every_quoted_number_is_in_its_results_file(doc):
    for path, body in blocks((REPO / doc).read_text()):
        source = REPO / "results" / path
        assert source.is_file(), f"{doc} quotes results/{path}, which is not committed"
        missing = missing_numbers(body, source.read_text())
        assert not missing, f"{doc}: numbers not in results/{path}: {missing[:10]}"
