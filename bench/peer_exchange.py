"""What a hostile peer-exchange seed costs a node: its honest pulls' latency, and the dials it is made to send.

    .venv/bin/python bench/peer_exchange.py [--json results.json] [--quick] [--seconds S] [--model cnn]

In one process, on 127.0.0.1: an honest peer serving a model, and a lying seed whose every ``ListPeers``
answers 64 fresh fake entries (new ids each time, on a handful of "victim" addresses 127.0.0.5-.8 where nothing
listens, so every dial fails). A real :class:`PeerExchange` (interval 1 s) asks both. The honest peer's pull
latency (median of pulls in a row) is measured before exchange starts and while it runs against the liar, in
the same run; then the exchange's counts: entries refused by reason, Hellos sent to unverified addresses
(dials) per second and per victim address, against the bounds of ``edge_node/net/discovery/exchange.py``.
``--quick`` (a tiny model, 3 s) is what the test suite runs to keep it working.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import random
import time
from collections import Counter
from collections.abc import Iterator

import torch

from edge_node.algorithm import init_masks, read_weights
from edge_node.models import build_model
from edge_node.net import ModelSnapshot, PeerAddress, PeerHello, PeerServer, create_server, hello, list_peers
from edge_node.net import pull_models as _pull_models
from edge_node.net.discovery import AddressPolicy, StaticDiscovery
from edge_node.net.discovery.exchange import MAX_CANDIDATES_PER_HOST, MAX_DIALS_PER_CYCLE, PeerExchange
from edge_node.protocol import MAX_PEER_ENTRIES
from edge_node.wire import ModelSpec
from edge_node.wire.messages import PeerEntry

FLEET = "bench"
VICTIMS = [f"127.0.0.{i}" for i in range(5, 9)]
TINY = {"fc1.weight": (32, 16), "fc1.bias": (32,), "fc2.weight": (10, 32), "fc2.bias": (10,)}


def model(name: str) -> tuple[ModelSnapshot, ModelSpec]:
    if name == "tiny":
        gen = torch.Generator().manual_seed(0)
        weights = {n: torch.randn(s, generator=gen) * 0.05 for n, s in TINY.items()}
    else:
        weights = read_weights(build_model(name, 10, seed=0))
    spec = ModelSpec.from_tensors(name, 10, weights)
    masks = init_masks(weights, 0.5, torch.Generator().manual_seed(1))
    masked = {n: w * masks[n] for n, w in weights.items()}
    return ModelSnapshot(masked, masks, 1, 0.5, "honest", FLEET, spec.arch_id, "t3"), spec


@contextlib.contextmanager
def serving(server: PeerServer) -> Iterator[int]:
    grpc_server, port = create_server("127.0.0.1:0", server, insecure=True)
    grpc_server.start()
    try:
        yield port
    finally:
        grpc_server.stop(None).wait(5)


def fake_entries() -> list[PeerEntry]:
    """64 entries never seen before, on the victim addresses (random ports)."""
    tag = random.getrandbits(40)
    return [PeerEntry(node_id=f"fake-{tag:x}-{i}", host=VICTIMS[i % len(VICTIMS)], port=random.randint(1024, 65000))
            for i in range(MAX_PEER_ENTRIES)]  # fmt: skip


def median_pull_ms(address: PeerAddress, spec: ModelSpec, seconds: float) -> tuple[float, int]:
    """Median ms of honest pulls in a row for ``seconds``, and how many were done."""
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        result = _pull_models([address], spec, FLEET, node_id="me", deadline_s=10.0, insecure=True)
        assert "honest" in result.received, result.failures
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return times[len(times) // 2], len(times)


def run(model_name: str, seconds: float) -> dict:
    snapshot, spec = model(model_name)
    honest, liar = PeerServer(spec, node_id="honest", fleet_id=FLEET), PeerServer(spec, node_id="liar", fleet_id=FLEET)
    honest.publish(snapshot)
    liar.reached = fake_entries
    dials: Counter[str] = Counter()
    with serving(honest) as honest_port, serving(liar) as liar_port:
        address = PeerAddress("honest", "127.0.0.1", honest_port)
        _pull_models([address], spec, FLEET, node_id="me", deadline_s=10.0, insecure=True)  # warm the channel
        before_ms, before_n = median_pull_ms(address, spec, seconds)
        static = StaticDiscovery([f"liar@127.0.0.1:{liar_port}", f"honest@127.0.0.1:{honest_port}"], node_id="me",
                                 fleet=FLEET)  # fmt: skip
        static.start()

        def counted_hello(peer: PeerAddress) -> PeerHello:
            dials[peer.host] += 1
            return hello(peer, node_id="me", fleet_id=FLEET, timeout_s=2.0, insecure=True)

        exchange = PeerExchange(
            node_id="me", fleet=FLEET, arch=spec.arch_id, sources=[static], hello=counted_hello,
            ask=lambda a: list_peers(a, node_id="me", fleet_id=FLEET, timeout_s=2.0, insecure=True),
            policy=AddressPolicy(None, allow_loopback=True), interval_s=1.0,
        )  # fmt: skip
        started = time.monotonic()
        exchange.start()
        try:
            during_ms, during_n = median_pull_ms(address, spec, seconds)
        finally:
            exchange.stop()
            static.stop()
        ran_s = time.monotonic() - started
    victim_dials = {h: dials[h] for h in VICTIMS}
    return {
        "model": model_name, "seconds": seconds, "exchange_ran_s": round(ran_s, 2),
        "honest_pull_ms": {"before": round(before_ms, 2), "during": round(during_ms, 2)},
        "pulls": {"before": before_n, "during": during_n},
        "refusals": exchange.refusals(), "exchange": exchange.to_json(),
        "dials_to_victims": victim_dials, "dials_per_s": round(sum(victim_dials.values()) / ran_s, 2),
        "bound_dials_per_s": MAX_DIALS_PER_CYCLE, "bound_dials_per_victim_per_s": MAX_CANDIDATES_PER_HOST,
        "machine": platform.machine(), "python": platform.python_version(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 3 s each: keeps the bench working")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of pulls before, and during")
    parser.add_argument("--model", default="cnn")
    args = parser.parse_args()
    figures = run("tiny" if args.quick else args.model, 3.0 if args.quick else args.seconds)
    ms, n = figures["honest_pull_ms"], figures["pulls"]
    print(f"honest pull of {figures['model']}: median {ms['before']} ms before ({n['before']} pulls), "
          f"{ms['during']} ms while a lying seed is asked every 1 s ({n['during']} pulls)")  # fmt: skip
    print(
        f"dials to the victims: {figures['dials_to_victims']} in {figures['exchange_ran_s']} s "
        f"({figures['dials_per_s']}/s; bound {MAX_DIALS_PER_CYCLE}/s, {MAX_CANDIDATES_PER_HOST}/s per address)"
    )
    print(f"refused: {figures['refusals']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(figures, out, indent=1)


if __name__ == "__main__":
    main()
