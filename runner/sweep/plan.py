"""The cells of a sweep preset: what `deepinit -m +sweep=<preset> [overrides]` runs, read from
the preset's hydra.sweeper.params with Hydra's own override grammar (so values compare equal to
what Hydra writes into a cell's .hydra/overrides.yaml)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional, Sequence

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Transformer

from runner.config.paths import sweeps_dir


def norm_key(key: str) -> str:
    return key.lstrip("+~")


def load_preset(preset: str) -> dict:
    path = sweeps_dir() / f"{preset}.yaml"
    with open(path) as f:
        return yaml.safe_load(f) or {}


@dataclass(frozen=True)
class ParsedOverride:
    key: str  # as written, with its +/~ prefix
    value: str  # the value as Hydra writes it into .hydra/overrides.yaml (1e-4 -> 0.0001); "" for a sweep
    sweep: Optional[list[str]]  # the values of a comma sweep (a,b,c), else None
    objects: tuple = ()  # the Python values Hydra parses (1e3 -> 1000.0, 'a' -> a): one, or the sweep's


def parse_overrides(lines: Sequence[str]) -> list[ParsedOverride]:
    """Override strings read with Hydra's own grammar (the only place outside the CLI that uses
    Hydra: sweep files are written in its override syntax)."""
    out = []
    for o in OverridesParser.create().parse_overrides(list(lines)):
        if o.is_discrete_sweep():
            # values and their text in one pass: a shuffle() sweep shuffles each pass anew
            pairs = list(o.sweep_iterator(transformer=lambda v: (v, Transformer.str(v))))
            out.append(ParsedOverride(o.get_key_element(), "", [str(text) for _, text in pairs],
                                      tuple(value for value, _ in pairs)))
        else:
            out.append(ParsedOverride(o.get_key_element(), o.get_value_element_as_str(), None,
                                      (o.value(),)))
    return out


# Overrides that do not change a run's result (runner/run/folder.py keeps them out of folder names):
# a cell run with other values of these is the same cell.
# trainer.compile as trainer.device: torch.compile fuses kernels, the same computation up to
# floating-point rounding (tests/test_cuda.py checks compiled against eager on a GPU)
_NOT_A_RESULT = ("hydra", "trainer.progress", "trainer.device", "trainer.threads", "trainer.resume",
                 "trainer.tensorboard", "logger", "trainer.compile")


def run_only(overrides: Sequence[str]) -> list[str]:
    """The overrides that change how a run runs but not its result (trainer.device=cpu, a
    logger), hydra.* left out: a suite passes them on to its cells without changing their key."""
    return [o for o in overrides if (key := norm_key(o.split("=", 1)[0])).startswith(_NOT_A_RESULT)
            and not key.startswith("hydra")]


def canonical(overrides: Sequence[str]) -> frozenset[str]:
    """Overrides as Hydra writes them into .hydra/overrides.yaml (1e-4 -> 0.0001), hydra.* left
    out, so a planned cell and its run folder compare equal."""
    keep = [o for o in overrides if not norm_key(o.split("=", 1)[0]).startswith(_NOT_A_RESULT)]
    out = []
    for o in parse_overrides(keep):
        out.append(f"{o.key}={o.value}")
    return frozenset(out)


def _as_spelled(obj, text: str, pairs: Sequence[tuple]) -> str:
    """`text` as the preset spells the same value (1e3 -> 1000 where the preset has 1000), else
    unchanged. Numbers compare as numbers, anything else only with its own type (true is not 1)."""
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    for theirs, spelling in pairs:
        if (number(obj) and number(theirs)) or type(obj) is type(theirs):
            if obj == theirs:
                return spelling
    return text


def plan_cells(preset: str, extra: Sequence[str] = (), respell: bool = False,
               ) -> tuple[list[dict[str, str]], list[str]]:
    """The cells a `deepinit -m +sweep=preset *extra` call runs, as {axis: value} in the
    preset's axis order (values as Hydra writes them), and the extra overrides that are not axes
    (fixed for every cell). A command-line value replaces the preset's axis of the same key, as
    Hydra's sweeper does. respell: a command-line value that one of the preset's values equals
    is written as the preset writes it, for a caller that runs the planned overrides itself
    (runner/tables/suite.py, runner/tables/pool.py); a Hydra call runs the text as typed, so its
    run folders keep that."""
    params = ((load_preset(preset).get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    own = parse_overrides([f"{k}={v}" for k, v in params.items()])
    # each preset axis value's spelling by its parsed value, so that a command-line value the
    # preset has, written another way (warmup.updates=1e3 for 1000, method='tfixup'), is the
    # preset's own cell
    spelled = {norm_key(o.key): list(zip(o.objects, o.sweep or [])) for o in own} if respell else {}
    lines = [o for o in extra if not norm_key(o.split("=", 1)[0]).startswith(_NOT_A_RESULT)]
    axes: dict[str, list[str]] = {}
    fixed: dict[str, str] = {}
    for o in own + parse_overrides(lines):
        key = o.key
        for k in list(axes) + list(fixed):  # a later value of the same key replaces it
            if norm_key(k) == norm_key(key):
                axes.pop(k, None)
                fixed.pop(k, None)
        pairs = spelled.get(norm_key(key), [])
        if o.sweep is not None:
            axes[key] = [_as_spelled(obj, text, pairs) for obj, text in zip(o.objects, o.sweep)]
        else:
            fixed[key] = f"{key}={_as_spelled(o.objects[0], o.value, pairs)}"
    cells = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    return cells, list(fixed.values())
