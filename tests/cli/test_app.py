"""The ``edge-node`` group: listing commands stays cheap (no torch), short help matches each command's own."""

from __future__ import annotations

import os
import subprocess
import sys

import click

from edge_node.cli._app import SHORT_HELP, SUBCOMMANDS, app
from edge_node.plugins import entry_point_names


def test_help_lists_every_command_without_importing_any_of_them():
    code = (
        "import sys\n"
        "from edge_node.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "bad = [m for m in ('torch', 'edge_node.cli.simulate', 'edge_node.sim', 'grpc') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in SUBCOMMANDS:
        assert f"  {name} " in proc.stdout, name
    assert "report" in proc.stdout and "Simulate N clients" in proc.stdout


def test_short_help_is_each_commands_own():
    ctx = click.Context(app)
    assert set(SHORT_HELP) == set(SUBCOMMANDS)
    for name, text in SHORT_HELP.items():
        command = app.get_command(ctx, name)
        assert command is not None and command.get_short_help_str(1000) == text, name


def _complete(words: str) -> list[str]:
    env = {**os.environ, "_EDGE_NODE_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "edge_node"], env=env, capture_output=True, text=True, timeout=120)
    return [line.split(",", 1)[1] for line in proc.stdout.splitlines() if "," in line]


def test_shell_completion_offers_commands_and_choices():
    assert {"simulate", "report", "energy"} <= set(_complete("edge-node "))
    installed = entry_point_names("edge_node.models")  # a plug-in package in this environment adds its names
    assert _complete("edge-node simulate --model ") == ["cnn", "resnet18", "vgg11", *installed]
    assert "dispfl-s2s" in _complete("edge-node simulate --method ")
    assert "path-balanced:2" in _complete("edge-node simulate --partition ")
