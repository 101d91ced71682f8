"""The ``edge-node`` click group and the one place that turns errors into exit codes."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from typing import Any, NoReturn

import click

from edge_node.errors import (
    DiscoveryError,
    EdgeNodeError,
    ListenError,
    PeerUnreachable,
    StorageError,
    TrainingDiverged,
)
from edge_node.exit_codes import ExitCode
from edge_node.version import __version__

# Under torchrun, how long a process other than 0 waits after a refusal of bad input, which process 0 says: the
# launcher ends it once process 0 has exited (edge_node.cli._app._say_error).
QUIET_RANK_WAIT_S = 30.0
# Subcommand name -> module that defines it (a click command of the same name registered on ``app``).
SUBCOMMANDS = {
    "capacity": "edge_node.cli.capacity",
    "certs": "edge_node.cli.certs",
    "energy": "edge_node.cli.energy",
    "export": "edge_node.cli.export",
    "fleet": "edge_node.cli.fleet",
    "loopback": "edge_node.cli.loopback",
    "peers": "edge_node.cli.peers",
    "predict": "edge_node.cli.predict",
    "report": "edge_node.cli.report",
    "simulate": "edge_node.cli.simulate",
    "start": "edge_node.cli.start",
    "status": "edge_node.cli.status",
}
# One-line help of each subcommand for ``edge-node --help`` and shell completion, so that listing the
# commands imports none of them (simulate pulls in torch: seconds). A subcommand missing here is imported
# to read its own help.
SHORT_HELP = {
    "capacity": "Measure throughput, memory, CPUs, accelerator and link; print every tier's check and the one chosen.",
    "certs": "Mutual TLS material: a fleet CA signs one certificate per node (SAN = node id).",
    "energy": "Joules per round and phase, mean power and meter source from RUN_OR_STATE_DIR/energy.jsonl.",
    "export": "Write a trained model (masked weights) as ONNX and check it with onnxruntime.",
    "fleet": "Every node of the fleet in one table: id, host, tier, round, phase, accuracy, last round, refusals.",
    "loopback": "Run N real edge-node daemons on this machine (127.0.0.1 or namespaces) and summarise the fleet.",
    "peers": "Browse for edge-node peers over mDNS and print the live peer table.",
    "predict": "Run the model a node handed over (STATE_DIR/handover/) on image files or .npy arrays.",
    "report": "The paper's table and plots across runs; --masks: mask distance vs data similarity of a run.",
    "simulate": "Simulate N clients of DisPFL or another method (FedSpa, FedP3, a baseline): the paper's figures.",
    "start": "Run this device's DisPFL node: discover peers, pull their models, train, publish, log.",
    "status": "Ask the running node how it is: id, tier, round, phase, peers, accuracy, bytes, energy.",
}


class _LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in SUBCOMMANDS:
            importlib.import_module(SUBCOMMANDS[cmd_name])  # registers itself on ``app``
        return super().get_command(ctx, cmd_name)

    def _short_help(self, ctx: click.Context, name: str, limit: int = 45) -> str | None:
        """A command's one-line help without importing it when it is listed in SHORT_HELP (None: hidden/absent)."""
        if name not in self.commands and name in SHORT_HELP:
            return SHORT_HELP[name]
        cmd = self.get_command(ctx, name)
        return None if cmd is None or cmd.hidden else cmd.get_short_help_str(limit)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, h) for n in names if (h := self._short_help(ctx, n, limit)) is not None]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        items = [
            CompletionItem(n, help=h)
            for n in self.list_commands(ctx)
            if n.startswith(incomplete) and (h := self._short_help(ctx, n)) is not None
        ]
        return items + click.Command.shell_complete(self, ctx, incomplete)


def complete_model(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Completion of ``--model``: built-in models and installed plug-ins' names (a factory path is free text)."""
    from edge_node.models import ENTRY_POINT_GROUP, MODEL_NAMES
    from edge_node.plugins import entry_point_names

    return [name for name in (*MODEL_NAMES, *entry_point_names(ENTRY_POINT_GROUP)) if name.startswith(incomplete)]


def set_verbosity(verbose: int) -> None:
    """Log level from a count of ``-v``: warnings only, -v info, -vv debug (on the root logger, stderr)."""
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger().setLevel(level)


def verbose_option(func: Any) -> Any:
    """``-v/--verbose`` for a subcommand too (``edge-node simulate -v``); more -v than the group's wins."""

    def callback(ctx: click.Context, _param: click.Parameter, value: int) -> int:
        if value:
            set_verbosity(max(value, (ctx.find_root().params or {}).get("verbose", 0)))
        return value

    return click.option(
        "-v", "--verbose", count=True, expose_value=False, callback=callback, help="More logging: -v info, -vv debug."
    )(func)


@click.group(name="edge-node", cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging: -v info, -vv debug.")
@click.version_option(__version__, "-V", "--version", prog_name="edge-node")
def app(verbose: int) -> None:
    """Decentralized personalized federated learning (DisPFL) on fleets of edge devices."""
    set_verbosity(verbose)


def _say_error(message: str, code: ExitCode) -> None:
    """Print ``edge-node: error: message``.

    Under torchrun every process parses the same settings, so a refusal of bad input is said once, by
    process 0; any other error names the process it came from (the launcher reports each failed rank).
    """
    rank = os.environ.get("RANK", "0") if "TORCHELASTIC_RUN_ID" in os.environ else "0"
    if rank == "0":
        print(f"edge-node: error: {message}", file=sys.stderr)
    elif code != ExitCode.BAD_INPUT:
        print(f"edge-node: error: [process {rank}] {message}", file=sys.stderr)
    else:
        # Said by process 0 alone: were this one to exit first, the launcher would stop process 0 before it
        # printed the line (seen on a loaded machine). It waits instead; process 0's exit makes the launcher end it.
        time.sleep(QUIET_RANK_WAIT_S)


def fail(message: str, code: ExitCode = ExitCode.BAD_INPUT) -> click.exceptions.Exit:
    """Print a one-line error and return the Exit to raise (in a command: ``raise fail(...)``)."""
    _say_error(message, code)
    return click.exceptions.Exit(int(code))


def _exit_with(message: str, code: ExitCode) -> NoReturn:
    _say_error(message, code)
    sys.exit(int(code))


def main(argv: list[str] | None = None, *, poisoning: Any = None) -> None:
    """Console-script entry point: run the app, map errors to the documented exit codes.

    ``poisoning``: a loopback fleet's attack settings for ``start`` (edge_node.cli._attacker), the click
    context's object: no flag or config key reaches it.
    """
    try:
        result = app.main(args=argv, prog_name="edge-node", standalone_mode=False, obj=poisoning)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.ClickException as exc:  # usage errors: bad flag values, missing arguments
        _exit_with(exc.format_message(), ExitCode.BAD_INPUT)
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("edge-node: interrupted", file=sys.stderr)
        sys.exit(int(ExitCode.INTERRUPTED))
    except (PeerUnreachable, ListenError, DiscoveryError) as exc:
        _exit_with(str(exc), ExitCode.NETWORK)
    except StorageError as exc:
        _exit_with(str(exc), ExitCode.STORAGE)
    except TrainingDiverged as exc:
        _exit_with(str(exc), ExitCode.DIVERGED)
    except EdgeNodeError as exc:
        _exit_with(str(exc), ExitCode.BAD_INPUT)
    sys.exit(result if isinstance(result, int) else 0)
