"""Flags generated from a config dataclass's keys: ``edge-node start``'s from ``NodeConfig``, ``simulate``'s from
``SimConfig``.

One flag per key (``edge_node.tomlconf.key``), named like it with dashes, with the key's help text and, where
the key lists them, its choices; every flag defaults to None, so that a flag that is given overrides the
config file, which overrides the dataclass's defaults (``given_flags``). A bool key is ``--x/--no-x``, a
tuple key a repeatable flag whose values may also be comma-separated.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

Completer = Callable[[click.Context, click.Parameter, str], list[str]]


def _click_type(tp: Any) -> tuple[Any, bool]:
    """(click type, is a list) of a config field annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _click_type(inner[0])
    if origin is tuple:
        return str, True
    return {int: int, float: float, str: str, bool: bool, Path: click.Path(path_type=Path)}[tp], False


def _shown(default: Any) -> str:
    return "none" if default is None else str(default)


def key_help_text(field: dataclasses.Field[Any], default: Any) -> str:
    """The help of a key's flag: its text with ``{default}`` filled in, or ``[default: X]`` added when it says none."""
    text = str(field.metadata["help"])
    if "{default}" in text:
        return text.replace("{default}", _shown(default))
    if default not in (None, "", ()) and "[default" not in text:
        text += f" [default: {default}]"
    return text


def config_options(
    cls: type,
    config_option: Callable[[Any], Any],
    *,
    flag_names: Mapping[str, tuple[str, ...]] = types.MappingProxyType({}),
    aliases_help: Mapping[str, str] = types.MappingProxyType({}),
    complete: Mapping[str, Completer] = types.MappingProxyType({}),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator adding ``config_option`` (``--config``) and one option per key of dataclass ``cls``.

    Args:
        flag_names: a key's flags when not ``--key-name`` (the first is shown; the others are aliases).
        aliases_help: a sentence added to a key's help (e.g. naming a deprecated alias).
        complete: a key's shell completion.
    """

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(cls)
        for field in reversed(dataclasses.fields(cls)):
            flags = flag_names.get(field.name, ("--" + field.name.replace("_", "-"),))
            click_type, many = _click_type(hints[field.name])
            default = field.default if field.default is not dataclasses.MISSING else None
            text = key_help_text(field, default) + aliases_help.get(field.name, "")
            choices = field.metadata.get("choices") or ()
            if choices:
                click_type = click.Choice(list(choices), case_sensitive=False)
            extra: dict[str, Any] = {"help": text, "default": None}
            if field.metadata.get("metavar"):
                extra["metavar"] = field.metadata["metavar"]
            if field.name in complete:
                extra["shell_complete"] = complete[field.name]
            if click_type is bool:
                option = click.option(f"{flags[0]}/--no-{flags[0][2:]}", field.name, **extra)
            else:
                option = click.option(*flags, field.name, type=click_type, multiple=many, **extra)
            command = option(command)
        return config_option(command)

    return decorate


def given_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The flags that were given, lists flattened (``--peers a,b --peers c``)."""
    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    for key, value in list(given.items()):
        if isinstance(value, tuple):
            given[key] = [item for part in value for item in part.replace(",", " ").split() if item]
    return given


__all__ = ["config_options", "given_flags", "key_help_text"]
