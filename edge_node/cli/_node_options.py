"""The flags of ``edge-node start`` (and ``capacity`` / ``export``), generated from ``NodeConfig``'s keys.

One flag per config key, named like it with dashes, with the key's help text; a flag that is given
overrides the config file, which overrides the defaults.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

CONFIG_HELP = "TOML config file, keys as the flags with underscores [default: /etc/edge-node/config.toml if it exists]."


def _click_type(tp: Any) -> tuple[Any, bool]:
    """(click type, is a list) of a NodeConfig field annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _click_type(inner[0])
    if origin is tuple:
        return str, True
    return {int: int, float: float, str: str, bool: bool, Path: click.Path(path_type=Path)}[tp], False


def node_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``command`` with ``--config`` and one option per NodeConfig key (all default None)."""
    from edge_node.node.config import NodeConfig, key_help

    hints = typing.get_type_hints(NodeConfig)
    for field in reversed(dataclasses.fields(NodeConfig)):
        flag = "--" + field.name.replace("_", "-")
        click_type, many = _click_type(hints[field.name])
        default = field.default if field.default is not dataclasses.MISSING else None
        text = key_help(field.name)
        if default not in (None, "", ()) and "[default" not in text:
            text += f" [default: {default}]"
        if click_type is bool:
            option = click.option(f"{flag}/--no-{flag[2:]}", field.name, default=None, help=text)
        else:
            option = click.option(flag, field.name, type=click_type, default=None, multiple=many, help=text)
        command = option(command)
    return click.option("--config", "config_file", type=click.Path(path_type=Path), default=None, help=CONFIG_HELP)(
        command
    )


def load_node_config(config_file: Path | None, flags: dict[str, Any]) -> Any:
    """The effective NodeConfig: defaults < ``config_file`` (or the default file when it exists) < given flags."""
    from edge_node.node.config import DEFAULT_CONFIG_FILE, NodeConfig
    from edge_node.tomlconf import build, merge, read_toml

    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    for key, value in list(given.items()):
        if isinstance(value, tuple):  # --peers a,b --peers c
            given[key] = [item for part in value for item in part.replace(",", " ").split() if item]
    path = config_file if config_file is not None else (DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None)
    file_values = read_toml(path) if path is not None else {}
    source = f"{path} or the flags" if path is not None else "the flags"
    return build(NodeConfig, merge(file_values, given), source)


__all__ = ["load_node_config", "node_options"]
