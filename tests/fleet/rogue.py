"""A rogue peer for fleet tests: advertises itself in the fleet over mDNS and serves a hostile model stream.

Run inside a namespace of the fleet's bridge (never on the machine's own interfaces)::

    ip netns exec NS python tests/fleet/rogue.py MODE NODE_ID FLEET ADDRESS

MODE is ``garbage`` (bytes that are no protobuf), ``wrong-arch`` (a valid stream of a ``cnn`` for 100
classes, while its mDNS TXT claims the fleet's architecture) or ``endless`` (a valid header, then the
stream stays open and sends nothing more). It serves on ADDRESS (a free port), advertises NODE_ID with the
fleet's architecture, prints one JSON line ``{"event": "started", "port": P}``, prints a line per GetModel
call, and runs until stdin closes or it is killed. The server is :class:`tests.net.hostile.HostileServer`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODES = ("garbage", "wrong-arch", "endless")


def _emit(obj: dict[str, object]) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def main(mode: str, node_id: str, fleet: str, address: str) -> None:
    import grpc

    from edge_node.models import build_model
    from edge_node.net.discovery import MdnsDiscovery
    from edge_node.wire import ModelSpec, encode_model
    from tests.net.hostile import HostileServer, hold_open
    from tests.wire_models import kept_fraction

    honest_spec = ModelSpec.from_tensors("cnn", 10, dict(build_model("cnn", 10).named_parameters()))

    def stream(spec: ModelSpec, num_classes: int) -> list[bytes]:
        params = {k: v.detach() for k, v in build_model("cnn", num_classes, seed=1).named_parameters()}
        masks = {k: v.abs() > 0.01 if v.dim() > 1 else v.abs() >= 0 for k, v in params.items()}
        return [
            m.SerializeToString()
            for m in encode_model(
                spec, params, masks, node_id=node_id, fleet_id=fleet, round=1, density=kept_fraction(masks)
            )  # fmt: skip
        ]

    if mode == "garbage":
        messages = [b"\x0a\x05hello", b"\xff" * 64, b"not a protobuf at all"]
    elif mode == "wrong-arch":
        messages = stream(ModelSpec.from_tensors("cnn", 100, dict(build_model("cnn", 100).named_parameters())), 100)
    else:
        messages = stream(honest_spec, 10)[:1]  # the header's message, then nothing

    def get_model(request: object, context: grpc.ServicerContext) -> Iterator[bytes]:
        _emit({"event": "get_model", "t": time.monotonic()})
        yield from messages
        if mode == "endless":
            yield from hold_open(context)

    with HostileServer(get_model=get_model, address=f"{address}:0") as server:
        discovery = MdnsDiscovery(
            node_id=node_id, port=server.port, fleet=fleet, arch=honest_spec.arch_id, tier="t3", density=0.6,
            round=1, interfaces=[address],
        )  # fmt: skip
        discovery.start()
        try:
            _emit({"event": "started", "port": server.port})
            for _ in sys.stdin:
                pass
        finally:
            discovery.stop()


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in MODES:
        raise SystemExit(f"usage: python tests/fleet/rogue.py {'|'.join(MODES)} NODE_ID FLEET ADDRESS")
    main(*sys.argv[1:])
