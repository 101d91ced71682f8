"""Users' own code, named as ``package.module:function`` or registered under an entry-point group.

A model or data factory enters edge-node here, once, by name; whatever goes wrong while finding it (no such
module, no such attribute, not callable, an import that raises) is one line that names it, raised as the
caller's error class so that the command exits with the code of bad input.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"  # a.b.c of Python identifiers
_FACTORY_PATH = re.compile(f"^{_DOTTED}:{_DOTTED}$")


def is_factory_path(name: str) -> bool:
    """True for a ``package.module:function`` reference (the colon sets it apart from built-in names)."""
    return ":" in name


def one_line(exc: BaseException) -> str:
    """An exception as ``Type: message`` on one line (a traceback would hide the one fact that matters)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_factory(path: str, what: str, error: type[Exception]) -> Callable[..., Any]:
    """The callable that ``path`` (``package.module:function``, dots allowed after the colon) names.

    Args:
        what: the kind of factory, for the message ("model factory", "data factory").
        error: raised with one line on any failure.
    """
    if not _FACTORY_PATH.match(path):
        raise error(f"{what} {path!r} must be package.module:function")
    module_name, _, attr_path = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise error(f"{what} {path!r}: no module {exc.name!r} (is its package installed?)") from None
    except Exception as exc:  # the user's module raised while importing: say so, in one line
        raise error(f"{what} {path!r}: importing {module_name} failed: {one_line(exc)}") from None
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise error(f"{what} {path!r}: {module_name} has no attribute {attr_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise error(f"{what} {path!r} is a {type(target).__name__}, not a function")
    return target  # type: ignore[no-any-return]


def entry_point_names(group: str) -> list[str]:
    """Names registered under the entry-point ``group`` by installed packages, sorted."""
    return sorted({ep.name for ep in entry_points(group=group)})


def load_entry_point(group: str, name: str, what: str, error: type[Exception]) -> Callable[..., Any] | None:
    """The callable registered as ``name`` under ``group``, or None when no installed package registers it."""
    found = [ep for ep in entry_points(group=group) if ep.name == name]
    if not found:
        return None
    if len({ep.value for ep in found}) > 1:
        raise error(f"{what} {name!r} is registered by several packages: {', '.join(sorted(ep.value for ep in found))}")
    try:
        target = found[0].load()
    except Exception as exc:  # an installed package's broken registration
        raise error(f"{what} {name!r} ({found[0].value}): loading it failed: {one_line(exc)}") from None
    if not callable(target):
        raise error(f"{what} {name!r} ({found[0].value}) is a {type(target).__name__}, not a function")
    return target  # type: ignore[no-any-return]
