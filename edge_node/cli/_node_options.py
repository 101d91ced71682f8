"""The flags of ``edge-node start`` (and ``capacity`` / ``export``), generated from ``NodeConfig``'s keys.

One flag per config key, named like it with dashes, with the key's help text; a flag that is given
overrides the config file, which overrides the defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edge_node.cli._config_options import config_options, given_flags

# One flag name for one thing across commands: ``peers --interface`` and ``start --interface`` (the key stays
# ``interfaces``, a list). The plural flag is kept as a deprecated alias for scripts written before.
FLAG_NAMES = {"interfaces": ("--interface", "--interfaces")}
DEPRECATED_ALIASES = {"interfaces": "--interfaces"}
CONFIG_HELP = "TOML config file, keys as the flags with underscores [default: /etc/edge-node/config.toml if it exists]."


def node_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``command`` with ``--config`` and one option per NodeConfig key (all default None)."""
    from edge_node.node.config import NodeConfig

    config = click.option("--config", "config_file", type=click.Path(path_type=Path), default=None, help=CONFIG_HELP)
    aliases = {k: f" Repeatable. ({alias}: deprecated alias.)" for k, alias in DEPRECATED_ALIASES.items()}
    return config_options(NodeConfig, config, flag_names=FLAG_NAMES, aliases_help=aliases)(command)


def _config_file(config_file: Path | None) -> Path | None:
    """``config_file``, else the default file when it exists."""
    from edge_node.node.config import DEFAULT_CONFIG_FILE

    return config_file if config_file is not None else (DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None)


def load_node_config(config_file: Path | None, flags: dict[str, Any]) -> Any:
    """The effective NodeConfig: defaults < ``config_file`` (or the default file when it exists) < given flags."""
    from edge_node.node.config import NodeConfig
    from edge_node.tomlconf import build, merge, read_toml

    path = _config_file(config_file)
    file_values = read_toml(path) if path is not None else {}
    source = f"{path} or the flags" if path is not None else "the flags"
    return build(NodeConfig, merge(file_values, given_flags(flags)), source)


def state_dir_of(state_dir: Path | None, config_file: Path | None) -> Path:
    """The node's state dir: ``state_dir``, else the config file's (or the default file's), else the default."""
    from edge_node.node.config import DEFAULT_STATE_DIR
    from edge_node.tomlconf import read_toml

    if state_dir is not None:
        return state_dir
    path = _config_file(config_file)
    value = read_toml(path).get("state_dir") if path is not None else None
    return Path(value).expanduser() if isinstance(value, str) and value else DEFAULT_STATE_DIR


def _saved_model(saved: Any, arch_id: str) -> str:
    """The model name a node ran with: its saved config's, when the checkpoint's architecture id is that
    name's; else the id's name part (a built-in or entry-point name is its own; a ``package.module:function``
    path's is mangled, and a state dir of a release before ``node-config.toml`` has nothing better)."""
    from edge_node.models import arch_name

    name = arch_id.split("/")[0]
    return saved if isinstance(saved, str) and saved and arch_name(saved) == name else name


def load_saved_node_config(config_file: Path | None, flags: dict[str, Any]) -> Any:
    """The config of the node whose state dir this is: the node's saved config and checkpoint identity < an
    explicit ``config_file`` < given flags (the default config file only locates the state dir).

    Raises:
        CheckpointError: the state dir holds no checkpoint, or an unreadable one.
    """
    from edge_node.errors import CheckpointError
    from edge_node.node.config import NodeConfig
    from edge_node.node.state import CHECKPOINT_FILE, NODE_CONFIG_FILE, checkpoint_identity
    from edge_node.tomlconf import build, read_toml

    state_dir = state_dir_of(flags.get("state_dir"), config_file)
    if not state_dir.is_dir():
        raise CheckpointError(f"no state dir {state_dir}: give the --state-dir a node ran with")
    identity = checkpoint_identity(state_dir / CHECKPOINT_FILE)
    if identity is None:
        raise CheckpointError(f"no checkpoint in {state_dir}: the node has not completed a round there yet")
    saved_file = state_dir / NODE_CONFIG_FILE
    saved = read_toml(saved_file) if saved_file.is_file() else {}  # absent in state dirs of releases before it
    identified = {"node_id": identity.node_id, "fleet": identity.fleet, "seed": identity.seed,
                  "model": _saved_model(saved.get("model"), identity.arch_id), "state_dir": str(state_dir)}  # fmt: skip
    file_values = read_toml(config_file) if config_file is not None else {}
    source = f"{saved_file}, {config_file} or the flags" if config_file else f"{saved_file} or the flags"
    return build(NodeConfig, {**saved, **identified, **file_values, **given_flags(flags)}, source)


__all__ = ["load_node_config", "load_saved_node_config", "node_options", "state_dir_of"]
