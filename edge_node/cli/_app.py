"""The ``edge-node`` click group and the one place that turns errors into exit codes."""

from __future__ import annotations

import importlib
import logging
import sys

import click

from edge_node import __version__
from edge_node.errors import (
    DiscoveryError,
    EdgeNodeError,
    ListenError,
    PeerUnreachable,
    StorageError,
    TrainingDiverged,
)
from edge_node.exit_codes import ExitCode

# Subcommand name -> module that defines it (a click command of the same name registered on ``app``).
SUBCOMMANDS = {
    "capacity": "edge_node.cli.capacity",
    "certs": "edge_node.cli.certs",
    "energy": "edge_node.cli.energy",
    "export": "edge_node.cli.export",
    "peers": "edge_node.cli.peers",
    "simulate": "edge_node.cli.simulate",
    "start": "edge_node.cli.start",
    "status": "edge_node.cli.status",
}


class _LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in SUBCOMMANDS:
            importlib.import_module(SUBCOMMANDS[cmd_name])  # registers itself on ``app``
        return super().get_command(ctx, cmd_name)


@click.group(name="edge-node", cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging: -v info, -vv debug.")
@click.version_option(__version__, "-V", "--version", prog_name="edge-node")
def app(verbose: int) -> None:
    """Decentralized personalized federated learning (DisPFL) on fleets of edge devices."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def fail(message: str, code: ExitCode = ExitCode.BAD_INPUT) -> click.exceptions.Exit:
    """Print a one-line error and return the Exit to raise (in a command: ``raise fail(...)``)."""
    print(f"edge-node: error: {message}", file=sys.stderr)
    return click.exceptions.Exit(int(code))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, map errors to the documented exit codes."""
    try:
        result = app.main(args=argv, prog_name="edge-node", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.ClickException as exc:  # usage errors: bad flag values, missing arguments
        print(f"edge-node: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(int(ExitCode.BAD_INPUT))
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("edge-node: interrupted", file=sys.stderr)
        sys.exit(int(ExitCode.INTERRUPTED))
    except (PeerUnreachable, ListenError, DiscoveryError) as exc:
        print(f"edge-node: error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.NETWORK))
    except StorageError as exc:
        print(f"edge-node: error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.STORAGE))
    except TrainingDiverged as exc:
        print(f"edge-node: error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.DIVERGED))
    except EdgeNodeError as exc:
        print(f"edge-node: error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.BAD_INPUT))
    sys.exit(result if isinstance(result, int) else 0)
