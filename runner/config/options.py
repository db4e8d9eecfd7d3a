"""Typed option groups whose string choices are `Literal` types.

A schema dataclass declares a choice as a Literal, beside the code that reads it:

    @options
    @dataclass
    class AdminOptions(InitConfig):
        omega: Literal["vector", "scalar", "constant"] = "vector"

OmegaConf (2.3) holds no Literal type, so `@options` records each Literal field's values
(`choices(cls)`) and shows OmegaConf a plain `str` (`Optional[str]` for an Optional Literal) in
the class's annotations; `check_choices` (called by runner.config.validate) then rejects any other
value with one line naming the key and the allowed values. Type checkers still see the Literal
(the source is unchanged).
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Iterator, Literal, Optional, Union, get_args, get_origin, get_type_hints

_CHOICES = "__deepinit_choices__"


def _literal_values(hint: Any) -> Optional[tuple[tuple, bool]]:
    """(the Literal's values, whether None is allowed) for Literal[...] or Optional[Literal[...]]."""
    if get_origin(hint) is Literal:
        return get_args(hint), False
    if get_origin(hint) is Union:
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1 and get_origin(args[0]) is Literal and len(get_args(hint)) == 2:
            return get_args(args[0]), True
    return None


def options(cls: type) -> type:
    """Class decorator (applied over @dataclass): record the Literal fields' choices and give
    OmegaConf `str` in their place. Applies to the fields the class inherits too."""
    found: dict[str, tuple] = {}
    for klass in reversed(cls.__mro__):
        found.update(klass.__dict__.get(_CHOICES, {}))  # a decorated base's (its str now hides them)
        own = klass.__dict__.get("__annotations__")
        if not own or klass is object:
            continue
        module = sys.modules.get(klass.__module__)
        hints = get_type_hints(klass, vars(module) if module else None)
        for name in list(own):
            literal = _literal_values(hints.get(name)) if name in hints else None
            if literal is None:
                continue
            values, nullable = literal
            found[name] = values + ((None,) if nullable else ())
            own[name] = Optional[str] if nullable else str
    setattr(cls, _CHOICES, found)
    return cls


def choices(cls_or_obj: Any) -> dict[str, tuple]:
    """{field: allowed values (None where the field is an Optional Literal)} of an @options class
    (or instance); {} for any other class."""
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    return dict(getattr(cls, _CHOICES, {}))


def literal_choices(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any, tuple]]:
    """(dotted key, value, allowed values) of every Literal field of a dataclass instance and of
    the dataclasses nested in it (their runtime classes, so an init scheme's options count)."""
    allowed = choices(obj)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name in allowed:
            yield f"{prefix}{f.name}", value, allowed[f.name]
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from literal_choices(value, f"{prefix}{f.name}.")


def recast(obj: Any, cls: type) -> Any:
    """`obj` (a dataclass) as an instance of `cls`, another options class of the same group: the
    fields the two share keep their values, the others start at `cls`'s defaults (an init scheme's
    or norm placement's options after `init.name=` or `norm.placement=` switched the class)."""
    if type(obj) is cls:
        return obj
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name in names})
