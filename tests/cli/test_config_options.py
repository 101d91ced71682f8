"""``simulate``'s flags are generated from ``SimConfig`` as ``start``'s are from ``NodeConfig``; ``--threads`` reaches
torch before training; ``--print-config`` names the demo preset (``loopback``'s too)."""

from __future__ import annotations

import dataclasses

import click
import pytest

from edge_node.cli import main
from edge_node.cli._app import app
from edge_node.exit_codes import ExitCode
from edge_node.node.config import NodeConfig
from edge_node.sim import runner
from edge_node.sim.config import SimConfig
from tests.daemons import run_cli


def _options(command: str) -> dict[str, click.Option]:
    found = app.get_command(click.Context(app), command)
    assert found is not None
    return {p.name: p for p in found.params if isinstance(p, click.Option) and p.name}


@pytest.mark.parametrize(("command", "cls"), [("simulate", SimConfig), ("start", NodeConfig)])
def test_every_key_is_a_flag_with_its_help(command, cls):
    options = _options(command)
    for field in dataclasses.fields(cls):
        option = options[field.name]
        assert option.default is None and option.help, field.name  # a given flag wins over the file
        if field.metadata.get("choices"):
            assert isinstance(option.type, click.Choice) and tuple(option.type.choices) == field.metadata["choices"]
    assert "--threads" in options["threads"].opts and "the thread policy" in (options["threads"].help or "")


class _Stop(Exception):
    pass


def test_simulate_threads_reach_torch_before_anything_trains(monkeypatch, tmp_path):
    order: list[str] = []
    monkeypatch.setattr(runner, "apply_threads", lambda n: order.append(f"threads {n}"))

    def device(name: str) -> None:
        order.append("device")
        raise _Stop

    monkeypatch.setattr(runner, "resolve_device", device)
    with pytest.raises(_Stop):
        runner.run_simulation(SimConfig(threads=3, output=tmp_path), dataset=None)  # type: ignore[arg-type]
    assert order == ["threads 3", "device"]


def _print_config(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    with pytest.raises(SystemExit) as exc:
        main([*args, "--print-config"])
    assert not exc.value.code, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


def test_print_config_names_the_demo_preset_and_what_it_set(tmp_path, capsys):
    sim = _print_config(["simulate", "--epochs", "2"], capsys)
    assert sim[0].startswith("# demo quick-start preset") and "batch_size = 32" in sim[0] and "epochs" not in sim[0]
    assert "epochs = 2" in sim and "threads = 3" in _print_config(["simulate", "--threads", "3"], capsys)
    fleet = _print_config(["loopback", "--nodes", "4", "--output", str(tmp_path / "f")], capsys)
    assert 'capacity = "0.6", threads = 1' in fleet[1] and "batch_size = 32" in fleet
    assert not (tmp_path / "f").exists()  # printed, nothing started
    off = _print_config(["simulate", "--dataset", "tests.plugin_factories:blobs"], capsys)
    assert not any("preset" in line for line in off) and "epochs = 5" in off


@pytest.mark.parametrize("rate", ["0", "-3"])
def test_a_host_rate_of_zero_or_below_is_one_line_and_exit_2(rate: str) -> None:
    result = run_cli(["start", f"--server-host-rate={rate}", "--fleet", "f", "--insecure"])
    assert result.returncode == int(ExitCode.BAD_INPUT)
    assert result.stderr.strip().count("\n") == 0 and "server_host_rate=" in result.stderr
