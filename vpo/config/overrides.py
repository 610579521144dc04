"""Configs from JSON (`from_dict`) and from `section.key=value` overrides (`apply_overrides`):
values parsed to each field's type, unknown keys named."""

from __future__ import annotations

import dataclasses
from typing import Any

from vpo.errors import ConfigError


def from_dict(cls, data: dict[str, Any]):
    """A (nested) config dataclass from a plain dict; unknown keys raise naming them."""
    import typing

    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(names))}")
    kwargs = {}
    for name, value in data.items():
        sub = _dataclass_in(hints[name])
        kwargs[name] = from_dict(sub, value) if sub and isinstance(value, dict) else value
    return cls(**kwargs)


def _dataclass_in(hint):
    """The dataclass type inside a hint such as `RopeScaling | None`, else None."""
    import typing

    for t in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(t):
            return t
    return None


def parse_value(text: str, hint, field: str):
    """Parse the text of an override for a field annotated `hint` (bool, int, float, str,
    optional variants; a dict as a JSON object); a value of the wrong type raises naming the
    field."""
    import json
    import types
    import typing

    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if text.lower() in ("none", "null") and type(None) in args:
        return None
    for t in args:
        if t is bool and text.lower() in ("true", "false", "1", "0"):
            return text.lower() in ("true", "1")
        if t is int and text.lstrip("-").isdigit():
            return int(text)
        if t is float:
            try:
                return float(text)
            except ValueError:
                pass
        if t is str:
            return text
        if (typing.get_origin(t) or t) is dict:
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if isinstance(value, dict):
                return value
    names = " or ".join(getattr(t, "__name__", str(t)) for t in args)
    raise ConfigError(f"{field}: cannot read {text!r} as {names}")


def apply_overrides(config, overrides: list[str]):
    """Apply `section.key=value` overrides to a nested config dataclass (returns a new one).

    Values are parsed by the field's annotated type; unknown sections or keys raise naming them.
    Every override is parsed first and each dataclass is rebuilt once with all of its changes,
    so validation sees the final values whatever order they were given in (a later override of
    the same key wins).
    """
    import typing

    tree: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value, e.g. "
                              "train.steps=6")
        path, text = item.split("=", 1)
        keys = path.split(".")
        node, obj = tree, config
        for depth, key in enumerate(keys):
            names = [f.name for f in dataclasses.fields(obj)]
            if key not in names:
                raise ConfigError(f"override {path}: unknown key {key!r} in "
                                  f"{type(obj).__name__}; known: {', '.join(names)}")
            if depth == len(keys) - 1:
                node[key] = parse_value(text, typing.get_type_hints(type(obj))[key], path)
                break
            child = getattr(obj, key)
            if not dataclasses.is_dataclass(child):
                raise ConfigError(f"override {path}: {key!r} is not a section")
            if not isinstance(node.get(key, {}), dict):
                raise ConfigError(f"override {path}: {key!r} was set as a whole by an earlier "
                                  "override")
            node, obj = node.setdefault(key, {}), child
    return _rebuilt(config, tree)


def _rebuilt(obj, tree: dict):
    """`obj` with the parsed changes of `tree` ({field: value, or {subfield: ...} for a section}),
    each dataclass replaced (and so validated) once."""
    return dataclasses.replace(obj, **{
        key: _rebuilt(getattr(obj, key), value) if isinstance(value, dict) and
        dataclasses.is_dataclass(getattr(obj, key)) else value
        for key, value in tree.items()})
