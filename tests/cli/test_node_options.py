"""Flags of ``edge-node start`` / ``capacity`` / ``export``: one name for one thing across commands."""

from __future__ import annotations

import sys

import click

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from edge_node.cli._app import app
from tests.daemons import run_cli

BASE = ["start", "--fleet", "lab", "--insecure", "--print-config"]


def _flags(command: str) -> set[str]:
    found = app.get_command(click.Context(app), command)
    assert found is not None
    return {name for param in found.params for name in getattr(param, "opts", [])}


def test_interface_is_one_flag_name_in_start_and_peers():
    assert "--interface" in _flags("start") and "--interface" in _flags("peers")
    assert "--interface" in _flags("capacity")


def test_start_interface_repeats_and_the_old_plural_still_works():
    new = run_cli([*BASE, "--interface", "127.0.0.1", "--interface", "lo"])
    old = run_cli([*BASE, "--interfaces", "127.0.0.1", "--interfaces", "lo"])
    assert new.returncode == 0 and old.returncode == 0, new.stderr + old.stderr
    assert tomllib.loads(new.stdout)["interfaces"] == ["127.0.0.1", "lo"] == tomllib.loads(old.stdout)["interfaces"]
