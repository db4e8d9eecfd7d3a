"""The package's import structure: import-linter's layer contracts (pyproject.toml), no import
cycle between modules, and ruff's rules (imports at the top of modules, among others)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import tomllib

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_import_linter_contracts_are_kept():
    proc = subprocess.run([str(BIN / "lint-imports")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    n = len(_contracts())
    assert n >= 3 and f"Contracts: {n} kept, 0 broken." in proc.stdout, proc.stdout[-3000:]


def test_the_layers_are_exhaustive_and_reject_a_new_module_that_imports_the_cli(tmp_path):
    """A copy of the package with one more top-level module that imports the CLI breaks the
    layers contract: every module of runner must sit in a layer, and none below the CLI imports it."""
    layers = next(c for c in _contracts() if c["type"] == "layers")
    assert layers.get("exhaustive") is True and layers.get("containers") == ["runner"]
    listed = {m.strip() for layer in layers["layers"] for m in layer.replace(":", "|").split("|")}
    top = {p.stem if p.is_file() else p.name for p in (REPO / "runner").iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert top == listed  # the contract names every top-level module, no more
    shutil.copytree(REPO / "runner", tmp_path / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "runner" / "shortcut.py").write_text("from runner.cli import main\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([str(BIN / "lint-imports")], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert proc.returncode != 0
    assert "layers import one way BROKEN" in proc.stdout and "runner.shortcut" in proc.stdout, proc.stdout[-3000:]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the strongly connected components with more than one module."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_modules():
    """Every import counts, those inside functions included (grimp reads them all)."""
    graph = grimp.build_graph("runner")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert strongly_connected(edges) == []


def test_strongly_connected_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_ruff_passes():
    proc = subprocess.run([str(BIN / "ruff"), "check", "runner", "hydra_plugins", "tests"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
