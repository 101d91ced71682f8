"""Peers for daemon tests, in the test process: honest ones (the real ``PeerServer``) and hostile ones.

The hostile ones are :class:`tests.net.hostile.HostileServer` serving a stream that is valid on the wire
but lies (a round of 10^15, values of 3e38). Every model is the demo ``cnn`` for 10 classes of the
fleet seed 0 at an ERK density, so that it passes the daemon's header checks (fleet, architecture).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import torch

from edge_node.algorithm import read_weights
from edge_node.algorithm.dispfl import published, start
from edge_node.models import build_model
from edge_node.net import PeerServer, ServerLimits, TlsConfig, create_server
from edge_node.net.server import ModelSnapshot
from edge_node.wire import ModelSpec, encode_model
from tests.net.hostile import HostileServer

FLEET = "test"
DENSITY = 0.6


def demo_spec() -> ModelSpec:
    return ModelSpec.from_tensors("cnn", 10, read_weights(build_model("cnn", 10, seed=0)))


def demo_model(client: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What a fresh node of the fleet (seed 0) with client index ``client`` publishes: weights and mask."""
    state = start(read_weights(build_model("cnn", 10, seed=0)), DENSITY, seed=0, client=client)
    return published(state)


def snapshot(node_id: str, round: int, client: int, *, fill: float | None = None) -> ModelSnapshot:
    weights, masks = demo_model(client)
    if fill is not None:
        weights = {n: torch.where(masks[n], torch.full_like(w, fill), w) for n, w in weights.items()}
    return ModelSnapshot(
        weights=weights, masks=masks, round=round, density=DENSITY, node_id=node_id, fleet_id=FLEET,
        arch_id=demo_spec().arch_id,
    )  # fmt: skip


@dataclasses.dataclass
class ServedPeer:
    """A real peer server: its ``port``, ``publish`` a later round, ``stop`` it (as a peer killed unannounced)."""

    node_id: str
    client: int
    fleet: str
    port: int
    state: PeerServer
    server: grpc.Server

    def publish(self, round: int) -> None:
        self.state.publish(dataclasses.replace(snapshot(self.node_id, round, self.client), fleet_id=self.fleet))

    def stop(self) -> None:
        self.server.stop(None).wait(5)  # a no-op once stopped


@contextmanager
def served_peer(
    node_id: str, round: int, client: int, *, fleet: str = FLEET, tls: TlsConfig | None = None,
    address: str = "127.0.0.1:0", limits: ServerLimits | None = None,
) -> Iterator[ServedPeer]:  # fmt: skip
    """A real peer server publishing a fresh model at ``round``; stopped by ``stop()`` or at the end."""
    server_state = PeerServer(demo_spec(), node_id=node_id, fleet_id=fleet)
    server, port = create_server(address, server_state, tls=tls, insecure=tls is None, limits=limits)
    served = ServedPeer(node_id, client, fleet, port, server_state, server)
    served.publish(round)
    server.start()
    try:
        yield served
    finally:
        served.stop()


@contextmanager
def honest_peer(
    node_id: str, round: int, client: int, *, fleet: str = FLEET, tls: TlsConfig | None = None,
    address: str = "127.0.0.1:0",
) -> Iterator[int]:  # fmt: skip
    """A real peer server publishing a fresh model at ``round``; yields its port."""
    with served_peer(node_id, round, client, fleet=fleet, tls=tls, address=address) as served:
        yield served.port


@contextmanager
def lying_peer(node_id: str, round: int, client: int, *, fill: float | None = None) -> Iterator[HostileServer]:
    """A hostile server streaming a wire-valid model that claims ``round`` (and, with ``fill``, those values)."""
    snap = snapshot(node_id, round, client, fill=fill)
    messages = [
        m.SerializeToString()
        for m in encode_model(
            demo_spec(), snap.weights, snap.masks, node_id=node_id, fleet_id=FLEET, round=round, density=DENSITY
        )
    ]

    def get_model(request: object, context: object) -> Iterator[bytes]:
        yield from messages

    with HostileServer(get_model=get_model) as server:
        yield server
