"""How a poisoned loopback fleet starts its daemons: ``python -m edge_node.cli._attacker IDS ATTACK start FLAGS``.

``edge-node loopback --attackers K --attack A`` runs each of its nodes through this module instead of
``python -m edge_node start``: the same ``start`` command with the same flags, handed the fleet's
:class:`~edge_node.algorithm.poison.Poisoning` (who attacks, and how) as the click context's object, which no
flag, config key or environment variable can set. ``edge-node start`` therefore accepts no attack (an unknown
flag or config key is refused, exit 2), and this module is not an ``edge-node`` subcommand; it refuses to run
anything but ``start`` on a loopback address or inside the fleet's own namespaces (``DEFAULT_SUBNET``). It is an
internal entry point of the loopback fleet, not an interface: its arguments may change without notice.
"""

from __future__ import annotations

import ipaddress
import sys

from edge_node.algorithm.poison import Poisoning
from edge_node.errors import ConfigError
from edge_node.fleet.config import DEFAULT_SUBNET
from edge_node.robust_names import parse_attack

USAGE = "usage: python -m edge_node.cli._attacker ATTACKER_IDS ATTACK start FLAGS... (the loopback fleet's own)"


def fleet_address(listen: str) -> bool:
    """Whether ``listen`` (HOST:PORT) is on 127.0.0.0/8 or in the loopback fleet's namespace subnet."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or str(address).startswith(DEFAULT_SUBNET + ".")


def parse_argv(argv: list[str]) -> tuple[Poisoning, list[str]]:
    """The poisoning and the ``start`` arguments of ``argv``; ConfigError when it is not a loopback node's."""
    if len(argv) < 3 or argv[2] != "start":
        raise ConfigError(USAGE)
    ids, spec, rest = argv[0], argv[1], argv[2:]
    attackers = tuple(i for i in ids.split(",") if i)
    if not attackers:
        raise ConfigError(f"attackers {ids!r}: no node id ({USAGE})")
    listen = [rest[i + 1] for i, flag in enumerate(rest[:-1]) if flag == "--listen"]
    if len(listen) != 1 or not fleet_address(listen[0]):
        raise ConfigError(
            "attacks are only for a loopback fleet's nodes: --listen must be one address on 127.0.0.0/8 or "
            f"{DEFAULT_SUBNET}.0/24 (edge-node loopback --attackers K --attack ...)"
        )
    return Poisoning(attackers, parse_attack(spec)), rest


def main(argv: list[str] | None = None) -> None:
    """Run ``start`` with the poisoning (errors: one line, exit 2, like every bad input)."""
    from edge_node.cli import main as cli_main
    from edge_node.exit_codes import ExitCode

    try:
        poisoning, rest = parse_argv(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as exc:
        print(f"edge-node: error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.BAD_INPUT))
    cli_main(rest, poisoning=poisoning)


if __name__ == "__main__":
    main()
