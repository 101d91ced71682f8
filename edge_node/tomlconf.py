"""TOML config files for frozen dataclasses: read, check keys, coerce values, merge with flags, print.

The daemon (``NodeConfig``) and the simulation (``SimConfig``) take the same three layers, later ones
winning: the dataclass's defaults, a TOML file, flags given on the command line. An unknown key or a
value of the wrong type is one :class:`ConfigError` naming the key and the file; the dataclass's own
``__post_init__`` then checks the values.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from edge_node.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_CONFIG_BYTES = 1 << 20  # a config file is a few hundred bytes; refuse anything absurd
_T = TypeVar("_T")


def read_toml(path: Path) -> dict[str, Any]:
    """The table of a TOML file; ConfigError (one line) when it is missing, too large or malformed."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is {len(data)} bytes; at most {MAX_CONFIG_BYTES} are read")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def key(default: Any, help: str, *, choices: tuple[str, ...] = (), metavar: str | None = None) -> Any:
    """A config key of a dataclass: its default, and what its flag shows (edge_node/cli/_config_options.py).

    ``help`` may hold ``{default}``, which the flag's help shows as the default; ``choices`` makes the flag
    take only those values (the dataclass checks the value anyway, from a file too).
    """
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "metavar": metavar})


def key_help(cls: type, name: str) -> str:
    """The help text of config key ``name`` of dataclass ``cls``."""
    return str(next(f for f in dataclasses.fields(cls) if f.name == name).metadata["help"])


def field_names(cls: type) -> list[str]:
    """The init fields of dataclass ``cls``, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(key: str, value: Any, tp: Any, source: str) -> Any:
    """``value`` (as TOML or a flag gave it) as type ``tp``, or ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg, source)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ConfigError(f"{key} = {value!r} in {source} must be one of {choices}")
        return value
    if origin in (tuple, list):
        (item_type, *_rest) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} = {value!r} in {source} must be a list")
        items = [_coerce(key, v, item_type, source) for v in value]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Path:
        if isinstance(value, (str, Path)) and str(value):
            return Path(value).expanduser()
    else:
        raise TypeError(f"no TOML coercion for field {key!r} of type {tp!r}")
    raise ConfigError(f"{key} = {value!r} in {source} must be {_type_name(tp)}")


def build(cls: type[_T], values: Mapping[str, Any], source: str) -> _T:
    """An instance of dataclass ``cls`` from ``values`` (defaults for the rest).

    Raises:
        ConfigError: a key ``cls`` does not have (named, with the file), a value of the wrong type, or
            whatever ``cls.__post_init__`` refuses.
    """
    names = field_names(cls)
    unknown = [k for k in values if k not in names]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {source}; known keys: {', '.join(names)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(k, v, hints[k], source) for k, v in values.items()})


def merge(file_values: Mapping[str, Any], flag_values: Mapping[str, Any]) -> dict[str, Any]:
    """File values overridden by the flags that were given."""
    return {**file_values, **flag_values}


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    return value


def to_toml(config: Any, *, header: str = "") -> str:
    """A dataclass instance as TOML that :func:`build` reads back.

    TOML has no null: a ``None`` field is listed as a comment (``# data = (unset)``), so that a reader
    sees every key there is and reading the text back leaves it unset.
    """
    values = {f: _plain(getattr(config, f)) for f in field_names(type(config))}
    unset = "".join(f"# {k} = (unset)\n" for k, v in values.items() if v is None)
    text = tomli_w.dumps({k: v for k, v in values.items() if v is not None})
    return (header + "\n" if header else "") + unset + text
