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
    """
    import typing

    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value, e.g. "
                              "train.steps=6")
        path, text = item.split("=", 1)
        config = _set(config, path.split("."), text, path, typing)
    return config


def _set(obj, keys, text, path, typing):
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    if keys[0] not in names:
        raise ConfigError(f"override {path}: unknown key {keys[0]!r} in {type(obj).__name__}; "
                          f"known: {', '.join(names)}")
    if len(keys) == 1:
        value = parse_value(text, hints[keys[0]], path)
    else:
        child = getattr(obj, keys[0])
        if not dataclasses.is_dataclass(child):
            raise ConfigError(f"override {path}: {keys[0]!r} is not a section")
        value = _set(child, keys[1:], text, path, typing)
    return dataclasses.replace(obj, **{keys[0]: value})

