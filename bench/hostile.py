"""What one pull from a hostile peer costs the victim, next to an honest peer's pull, in one run.

    .venv/bin/python bench/hostile.py [--json results.json] [--quick] [--deadline S] [--model cnn]
    .venv/bin/python bench/hostile.py --flood [--flood-seconds 8] [--flood-threads 8] [--json flood.json]

Each attack is a real malicious gRPC server on 127.0.0.1 (in this process); the victim is a fresh
Python process that pulls once with ``pull_models`` and its defaults (limits from its own model,
one deadline), and for models that arrive runs ``screen_peer_models`` against its own model. Per
attack: the outcome (the failure kind, or "accepted" / "refused by the screen"), wall seconds of
the pull, stream bytes the victim's decoder took in, bytes the attacker got out to the transport,
the victim's CPU seconds (all threads) and the growth of its peak RSS during the pull (Linux: the
peak is reset first via /proc/self/clear_refs). Prints a table; writes JSON with ``--json``.
``--quick`` uses a tiny model and a 1 s deadline and runs the victim in this process (its CPU
and RSS figures then include the attacker's threads): the test suite runs it to keep it working.

Then the attacks on the victim's *server* (``SERVER_ATTACKS``, from 127.0.0.2 as raw HTTP/2, see
``tests/net/grpc_attack.py``): calls that send headers and withhold the request (GetModel, Hello),
1,100 idle TCP connections from one host (its cap is ``max_connections_per_host``), and GetModel
calls whose responses are never read (a stream window of 0; the server's connection age is 2 s
here so that the run sees them end). Per attack: an honest peer's Hello and pull latency (median, from
127.0.0.1) before and during the attack, the calls the attacker held, the calls the server ended,
the server's refusals and its process's descriptors. ``bench/soak.py --attack`` repeats them
against one daemon of a fleet (``server_attack``).

``--flood`` runs only the Hello flood (``hello_flood``): a node in a fresh process serving on 127.0.0.1
and [::1]; a flooder process on 127.0.0.1 with ``--flood-threads`` (8) threads calling Hello back to back
for ``--flood-seconds`` (8), on one channel, then each call on a channel of its own (``FLOOD_KINDS``,
the second as ``edge_node.net.hello`` calls); an honest peer on [::1] (another host) saying Hello and
pulling. Per setting (the rate limit off, on with refusals sent at once, on as shipped, holding refusals
back): the node process's CPU seconds per wall second (``/proc/PID/stat``, all its threads), quiet and
in the flood's middle, the honest Hello and pull latency p50/p99, what the flooder got, the refusals.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import torch

from edge_node.algorithm import init_masks, mask_density, read_weights, screen_peer_models
from edge_node.errors import PeerUnreachable
from edge_node.models import build_model
from edge_node.net import (
    ModelSnapshot,
    PeerAddress,
    PeerServer,
    ServerLimits,
    TlsConfig,
    create_ca,
    create_server,
    hello,
    issue_certificate,
    pull_models,
)
from edge_node.wire import ModelSpec, encode_model
from edge_node.wire.messages import PEER_SERVICE_NAME, GetModelRequest, HelloRequest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.net.grpc_attack import IdleConnections, UnreadStreams, WithheldCalls  # noqa: E402

FLEET = "bench"
TINY = {"fc1.weight": (64, 256), "fc1.bias": (64,), "fc2.weight": (10, 64), "fc2.bias": (10,)}
ATTACKS = (
    "honest",
    "slow-loris",
    "never-ending",
    "padding",
    "oversize message",
    "3e38 values",
    "wrong arch",
    "garbage bytes",
    "TLS wrong CA",
    "wrong identity",
    "not-ready round",
)
MIB = 1 << 20
SERVER_ATTACKS = ("withheld GetModel", "withheld Hello", "idle connections", "unread streams")
ATTACKER_HOST = "127.0.0.2"


def model_weights(name: str, num_classes: int = 10) -> tuple[dict[str, torch.Tensor], ModelSpec]:
    if name == "tiny":
        gen = torch.Generator().manual_seed(0)
        weights = {n: torch.randn(s, generator=gen) * 0.05 for n, s in TINY.items()}
        return weights, ModelSpec.from_tensors("tiny", num_classes, weights)
    weights = read_weights(build_model(name, num_classes, seed=0))
    return weights, ModelSpec.from_tensors(name, num_classes, weights)


def masked_model(name: str, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], ModelSpec]:
    weights, spec = model_weights(name)
    masks = init_masks(weights, 0.5, torch.Generator().manual_seed(seed))
    return {n: w * masks[n] for n, w in weights.items()}, masks, spec


# --- the attacker's side ------------------------------------------------------------------------


class Attacker:
    """A gRPC server on 127.0.0.1 whose GetModel runs ``behaviour``; counts the bytes it got out."""

    def __init__(self, behaviour: Callable[[GetModelRequest, grpc.ServicerContext], Iterator[bytes]], tls=None):
        self.behaviour, self.tls, self.bytes_sent = behaviour, tls, 0

    def _get_model(self, request: GetModelRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        for message in self.behaviour(request, context):
            self.bytes_sent += len(message)
            yield message

    def __enter__(self) -> Attacker:
        self._pool = ThreadPoolExecutor(max_workers=4)
        handler = grpc.unary_stream_rpc_method_handler(
            self._get_model, request_deserializer=GetModelRequest.FromString, response_serializer=bytes
        )
        self._server = grpc.server(
            self._pool, handlers=[grpc.method_handlers_generic_handler(PEER_SERVICE_NAME, {"GetModel": handler})]
        )
        if self.tls is None:
            self.port = self._server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self._server.add_secure_port("127.0.0.1:0", self.tls.server_credentials())
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(0).wait(10)
        self._pool.shutdown(wait=True)


def _hold(context: grpc.ServicerContext, seconds: float = 600.0) -> None:
    end = time.monotonic() + seconds
    while context.is_active() and time.monotonic() < end:
        time.sleep(0.02)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def attack_behaviour(attack: str, stream: list[bytes], other: dict[str, list[bytes]]):
    """The GetModel behaviour of ``attack`` given the honest stream (and streams of other kinds)."""
    small = other["small messages"]

    def slow_loris(request, context):  # the model in 4 KiB messages, one every 0.2 s
        for message in small:
            yield message
            _hold(context, 0.2)
        _hold(context)

    def never_ending(request, context):
        yield from stream
        _hold(context)

    def padding(request, context):
        pad = b"\x7a" + _varint(3_000_000) + bytes(3_000_000)  # unknown field 15: protobuf keeps, ignores
        yield stream[0]
        for message in stream[1:]:
            yield message + pad
        while context.is_active():
            yield pad

    def oversize(request, context):
        yield stream[0]
        yield stream[1] + b"\x7a" + _varint(64 * MIB) + bytes(64 * MIB)

    def garbage(request, context):
        chunk = os.urandom(1 * MIB)
        while context.is_active():
            yield chunk

    def replay(name):
        def behaviour(request, context):
            yield from other[name]
            _hold(context)

        return behaviour

    return {
        "slow-loris": slow_loris,
        "never-ending": never_ending,
        "padding": padding,
        "oversize message": oversize,
        "garbage bytes": garbage,
        "wrong arch": replay("wrong arch"),
        "wrong identity": replay("wrong identity"),
        "TLS wrong CA": replay("honest"),
    }[attack]


@contextlib.contextmanager
def serving(attack: str, model: str, tls_dir: Path) -> Iterator[tuple[int, dict]]:
    """Start the server of ``attack``; yields its port and a dict the attacker's counters land in."""
    weights, masks, spec = masked_model(model, 1)
    density = mask_density(masks)
    header = {"node_id": "peer", "fleet_id": FLEET, "round": 1, "density": density}
    stream = [m.SerializeToString() for m in encode_model(spec, weights, masks, **header)]
    counters: dict = {}
    if attack in ("honest", "3e38 values", "not-ready round"):
        if attack == "3e38 values":
            weights = {n: torch.full_like(w, 3e38) for n, w in weights.items()}
        peer = PeerServer(spec, node_id="peer", fleet_id=FLEET)
        peer.publish(ModelSnapshot(weights, masks, 1, density, "peer", FLEET, spec.arch_id))
        server, port = create_server("127.0.0.1:0", peer, insecure=True)
        server.start()
        try:
            yield port, counters
        finally:
            server.stop(None).wait(10)
        return
    other_weights, other_spec = model_weights(model, num_classes=100)  # another architecture
    other_masks = init_masks(other_weights, 0.5, torch.Generator().manual_seed(2))
    other = {
        "honest": stream,
        "small messages": [
            m.SerializeToString() for m in encode_model(spec, weights, masks, **header, max_message_bytes=4096)
        ],
        "wrong arch": [
            m.SerializeToString()
            for m in encode_model(
                other_spec,
                other_weights,
                other_masks,
                node_id="peer",
                fleet_id=FLEET,
                round=1,
                density=mask_density(other_masks),
            )
        ],  # fmt: skip
        "wrong identity": [
            m.SerializeToString() for m in encode_model(spec, weights, masks, **header | {"node_id": "x"})
        ],
    }
    tls = None
    if attack == "TLS wrong CA":
        ca, ca_key = create_ca("intruders")
        tls = TlsConfig(ca, *issue_certificate(ca, ca_key, "peer"))
    with Attacker(attack_behaviour(attack, stream, other), tls=tls) as attacker:
        try:
            yield attacker.port, counters
        finally:
            counters["attacker_bytes_sent"] = attacker.bytes_sent


def make_fleet_tls(tls_dir: Path) -> None:
    ca, ca_key = create_ca(FLEET)
    cert, key = issue_certificate(ca, ca_key, "victim")
    (tls_dir / "ca.pem").write_bytes(ca)
    (tls_dir / "victim.pem").write_bytes(cert)
    key_path = tls_dir / "victim.key"
    key_path.write_bytes(key)
    key_path.chmod(0o600)


def run_victim(attack: str, port: int, model: str, deadline_s: float, tls_dir: Path) -> dict:
    args = {"attack": attack, "port": port, "model": model, "deadline_s": deadline_s, "tls_dir": str(tls_dir)}
    proc = subprocess.run(
        [sys.executable, __file__, "--victim", json.dumps(args)], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise SystemExit(f"victim of {attack!r} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the victim's side (a fresh process per attack) -------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_bytes() -> int:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def victim(args: dict) -> dict:
    own_w, own_m, spec = masked_model(args["model"], 9)
    kwargs: dict = {"insecure": True}
    if args["attack"] == "TLS wrong CA":
        folder = Path(args["tls_dir"])
        kwargs = {"tls": TlsConfig.from_files(folder / "ca.pem", folder / "victim.pem", folder / "victim.key")}
    round_ = 5 if args["attack"] == "not-ready round" else None
    peer = PeerAddress("peer", "127.0.0.1", args["port"])
    rss_before = _rss_bytes()
    exact_peak = _reset_peak()
    cpu0, start = time.process_time(), time.monotonic()
    result = pull_models([peer], spec, FLEET, round=round_, deadline_s=args["deadline_s"], **kwargs)
    seconds = time.monotonic() - start
    cpu = time.process_time() - cpu0
    peak_growth = max(0, _peak_bytes() - rss_before)
    if result.received:
        model = result.received["peer"]
        screen = screen_peer_models(own_w, own_m, [("peer", model.weights, model.masks)])
        outcome = "accepted" if screen.accepted else "screen: refused"
        wire_bytes = model.wire_bytes
        detail = screen.refused.get("peer", "")
    else:
        failure = result.failures["peer"]
        outcome, wire_bytes, detail = failure.kind, failure.wire_bytes, failure.detail
    return {
        "attack": args["attack"],
        "outcome": outcome,
        "detail": detail[:160],
        "seconds": seconds,
        "victim_bytes": wire_bytes,
        "cpu_s": cpu,
        "peak_rss_growth_bytes": peak_growth,
        "peak_exact": exact_peak,
    }


# --- attacks on the server --------------------------------------------------------------------------


def _median_ms(action: Callable[[], object], n: int) -> tuple[float | None, int]:
    """(median ms of the runs that succeeded or None, how many of ``n`` failed)."""
    times, failed = [], 0
    for _ in range(n):
        start = time.perf_counter()
        try:
            action()
        except Exception:  # an honest call the attack made fail: counted, the figure of the attack
            failed += 1
            continue
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return (times[len(times) // 2] if times else None), failed


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def server_attack(
    attack: str,
    port: int,
    *,
    node_id: str,
    fleet: str,
    spec: ModelSpec | None = None,
    victim_pid: int | None = None,
    hold_s: float = 3.0,
    samples: int = 5,
) -> dict:
    """One attack on the server at 127.0.0.1:``port`` from ``ATTACKER_HOST``, with an honest peer beside it.

    The honest peer's Hello (and pull, with ``spec``) latency is measured before and during the
    attack; the attack lasts ``hold_s`` (longer than the server's request timeout).
    """
    address = PeerAddress(node_id, "127.0.0.1", port)

    def do_hello() -> object:
        return hello(address, node_id="honest", fleet_id=fleet, timeout_s=5, insecure=True)

    def do_pull() -> object:
        assert spec is not None
        result = pull_models([address], spec, fleet, node_id="honest", deadline_s=10, insecure=True)
        if result.failures:
            raise RuntimeError(f"honest pull failed: {result.failures}")
        return result

    pid = victim_pid or os.getpid()
    quiet_hello = _median_ms(do_hello, samples)
    quiet_pull = _median_ms(do_pull, samples) if spec is not None else (None, 0)
    fds_before = _fds(pid)
    if attack == "idle connections":
        context: Any = IdleConnections(ATTACKER_HOST, port, 1100)
    elif attack == "unread streams":  # whole GetModel requests whose responses are never read
        # the request must name the node's architecture (else it is refused before any stream opens)
        arch = spec.arch_id if spec is not None else hello(address, fleet_id=fleet, timeout_s=5, insecure=True).arch_id
        request = GetModelRequest(protocol_version="1.0", node_id="reader", fleet_id=fleet, arch_id=arch)
        context = UnreadStreams(ATTACKER_HOST, port, request.SerializeToString(), calls=8, connections=4)
    else:
        method = f"/{PEER_SERVICE_NAME}/{attack.split()[-1]}"
        context = WithheldCalls(ATTACKER_HOST, port, method, calls=64, connections=8)
    start = time.monotonic()
    with context as running:
        time.sleep(0.3)
        own = len(running.socks) if isinstance(running, IdleConnections) else running.connections
        fds_during = _fds(pid) - (own if pid == os.getpid() else 0)  # not the attacker's own sockets
        busy_hello = _median_ms(do_hello, samples)
        busy_pull = _median_ms(do_pull, samples) if spec is not None else (None, 0)
        time.sleep(max(0.0, hold_s - (time.monotonic() - start)))
        if attack == "idle connections":
            attacker = {"connections": 1100 - running.failed, "still_open": running.open_count()}
        elif attack == "unread streams":
            attacker = {
                "calls": running.sent,
                "ended_by_server": running.ended(),
                "connections_closed": running.closed(),
            }
        else:
            attacker = {"calls": running.sent, "ended_by_server": running.ended()}
    return {
        "attack": attack,
        "honest_hello_ms": [_r(quiet_hello[0]), _r(busy_hello[0])],
        "honest_hello_failed": [quiet_hello[1], busy_hello[1], samples],
        "honest_pull_ms": [_r(quiet_pull[0]), _r(busy_pull[0])] if spec is not None else None,
        "honest_pull_failed": [quiet_pull[1], busy_pull[1], samples] if spec is not None else None,
        "victim_fds": [fds_before, fds_during],
        "attacker": attacker,
        "held_s": round(time.monotonic() - start, 2),
    }


def _r(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 2)


def _ms_text(pair: list[float | None] | None, failed: list[int] | None) -> str:
    if pair is None or failed is None:
        return "-"
    parts = [("-" if ms is None else f"{ms:.1f}") + (f" ({bad}/{failed[2]} failed)" if bad else "")
             for ms, bad in zip(pair, failed[:2], strict=True)]  # fmt: skip
    return " / ".join(parts)


def server_attacks(model: str) -> list[dict]:
    """Every ``SERVER_ATTACKS`` against a fresh server of ``model`` in this process; rows for the table."""
    weights, masks, spec = masked_model(model, 1)
    rows = []
    for attack in SERVER_ATTACKS:
        peer = PeerServer(spec, node_id="victim", fleet_id=FLEET)
        peer.publish(ModelSnapshot(weights, masks, 1, mask_density(masks), "victim", FLEET, spec.arch_id))
        limits = ServerLimits()
        hold_s = limits.request_timeout_s + 1
        if attack == "idle connections":
            limits = ServerLimits(max_connections=200)
        elif attack == "unread streams":  # a short connection age, so that the bench sees the streams end
            limits = ServerLimits(max_connection_age_s=2.0, connection_age_grace_s=1.0)
            hold_s = 1.1 * limits.max_connection_age_s + limits.connection_age_grace_s + 1
        server, port = create_server("127.0.0.1:0", peer, insecure=True, limits=limits)
        server.start()
        try:
            row = server_attack(attack, port, node_id="victim", fleet=FLEET, spec=spec, hold_s=hold_s)
            row["refusals"] = peer.refusals()
            row["unfinished_streams"] = peer.unfinished_streams()
            row["limits"] = {
                "max_calls_per_host": limits.max_calls_per_host, "max_connections": limits.max_connections,
                "max_connections_per_host": limits.max_connections_per_host,
                "max_connection_age_s": limits.max_connection_age_s,
                "connection_age_grace_s": limits.connection_age_grace_s,
            }  # fmt: skip
        finally:
            server.stop(None).wait(5)
        rows.append(row)
    return rows


def print_server_attacks(rows: list[dict], model: str) -> None:
    print(f"\nattacks on the victim's server ({model}), attacker {ATTACKER_HOST}, honest peer 127.0.0.1:")
    for r in rows:
        fds = r["victim_fds"]
        hello_text = _ms_text(r["honest_hello_ms"], r["honest_hello_failed"])
        print(
            f"{r['attack']:<18} honest Hello ms quiet / attack: {hello_text};"
            f" pull: {_ms_text(r['honest_pull_ms'], r['honest_pull_failed'])}; victim fds {fds[0]} -> {fds[1]};"
            f" attacker {r['attacker']}; server refusals {r.get('refusals')}"
        )


# --- a flood of well-formed Hellos from one host (the CPU it costs the node) -------------------------

# ServerLimits of each setting: 1e6 calls/s is no limit; "on" is the default; "at once" answers refusals at once
FLOOD_SETTINGS: dict[str, dict[str, float]] = {
    "off": {"host_rate": 1e6},
    "on, refusals at once": {"host_rate_hold_s": 1e-6},
    "on": {},
}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def flood_server(args: dict) -> None:
    """The node under the flood (a fresh process): serves ``model`` on 127.0.0.1 and [::1] until stdin closes."""
    weights, masks, spec = masked_model(args["model"], 1)
    peer = PeerServer(spec, node_id="victim", fleet_id=FLEET)
    peer.publish(ModelSnapshot(weights, masks, 1, mask_density(masks), "victim", FLEET, spec.arch_id))
    limits = ServerLimits(**args["limits"])
    server, port = create_server("127.0.0.1:0", peer, insecure=True, limits=limits)
    port6 = server.add_insecure_port("[::1]:0")
    server.start()
    print(json.dumps({"port": port, "port6": port6, "host_rate": limits.host_rate, "hold_s": limits.host_rate_hold_s}),
          flush=True)  # fmt: skip
    sys.stdin.read()
    print(json.dumps({"refusals": peer.refusals()}), flush=True)
    server.stop(None).wait(5)


FLOOD_KINDS = ("one channel", "a channel per call")  # the second is how edge_node.net.hello calls


def flooder(args: dict) -> None:
    """``threads`` threads calling Hello back to back to 127.0.0.1 for ``seconds``: on one channel, or each call
    on a channel of its own (``edge_node.net.hello``: a TCP connection and HTTP/2 setup per call)."""
    counts: dict[str, int] = {}  # "answered", or the status code's name (or the hello failure's kind)
    details: dict[str, str] = {}  # a status code's first detail
    lock = threading.Lock()
    address = PeerAddress("victim", "127.0.0.1", args["port"])
    with grpc.insecure_channel(address.target) as channel:
        call = channel.unary_unary(f"/{PEER_SERVICE_NAME}/Hello", request_serializer=bytes, response_deserializer=bytes)
        request = HelloRequest(protocol_version="1.0", node_id="flood", fleet_id=FLEET).SerializeToString()
        print(json.dumps({"ready": True}), flush=True)  # imports done: the flood starts now
        end = time.monotonic() + args["seconds"]

        def run() -> None:
            while time.monotonic() < end:
                try:
                    if args["kind"] == "one channel":
                        call(request, timeout=5)
                    else:
                        hello(address, node_id="flood", fleet_id=FLEET, timeout_s=5, insecure=True)
                    outcome = "answered"
                except grpc.RpcError as exc:
                    outcome = exc.code().name
                    with lock:
                        details.setdefault(outcome, str(exc.details())[:120])
                except PeerUnreachable as exc:
                    outcome = exc.kind
                    with lock:
                        details.setdefault(outcome, str(exc)[:120])
                with lock:
                    counts[outcome] = counts.get(outcome, 0) + 1

        workers = [threading.Thread(target=run) for _ in range(args["threads"])]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    print(json.dumps(counts), flush=True)
    print(json.dumps(details), file=sys.stderr, flush=True)


def _percentiles(times_ms: list[float]) -> tuple[float | None, float | None]:
    if not times_ms:
        return None, None
    ordered = sorted(times_ms)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _honest_calls(address: PeerAddress, spec: ModelSpec | None, seconds: float) -> dict:
    """An honest peer on [::1] (another host than the flood's) saying Hello and pulling, in turns, for ``seconds``."""
    hellos: list[float] = []
    pulls: list[float] = []
    failed = {"hello": 0, "pull": 0}
    end = time.monotonic() + seconds
    while True:
        start = time.perf_counter()
        try:
            hello(address, node_id="honest", fleet_id=FLEET, timeout_s=5, insecure=True)
            hellos.append((time.perf_counter() - start) * 1000)
        except Exception:  # counted: an honest call the flood made fail is the figure
            failed["hello"] += 1
        if spec is not None and len(hellos) % 4 == 1:  # with the first Hello and every 4th: pulls are rarer than Hellos
            start = time.perf_counter()
            result = pull_models([address], spec, FLEET, node_id="honest", deadline_s=10, insecure=True)
            if result.failures:
                failed["pull"] += 1
            else:
                pulls.append((time.perf_counter() - start) * 1000)
        if time.monotonic() >= end:
            break
        time.sleep(0.05)
    return {
        "hello_ms_p50_p99": [_r(x) for x in _percentiles(hellos)],
        "pull_ms_p50_p99": [_r(x) for x in _percentiles(pulls)],
        "hellos": len(hellos),
        "pulls": len(pulls),
        "failed": failed,
    }


def hello_flood(
    model: str,
    *,
    seconds: float,
    threads: int,
    settings: tuple[str, ...] = tuple(FLOOD_SETTINGS),
    pulls: bool = True,
    kinds: tuple[str, ...] = FLOOD_KINDS,
) -> list[dict]:
    """Per setting (rate limit off, on): the node's CPU per wall second, honest calls alone, then under the flood."""
    spec = masked_model(model, 1)[2] if pulls else None
    rows = []
    for setting in settings:
        overrides = FLOOD_SETTINGS[setting]
        args = json.dumps({"model": model, "limits": overrides})
        server = subprocess.Popen(
            [sys.executable, __file__, "--flood-server", args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None and server.stdin is not None
            ports = json.loads(server.stdout.readline())
            address = PeerAddress("victim", "::1", ports["port6"])
            row: dict[str, Any] = {"setting": setting, "host_rate": ports["host_rate"], "hold_s": ports["hold_s"],
                                   "threads": threads}  # fmt: skip
            for _ in range(4):  # warm-up: the first pull's imports and channel are not the figure
                _honest_calls(address, spec, 0.0)
            for phase in ("quiet", *kinds):
                flood = None
                if phase != "quiet":
                    time.sleep(2 * ServerLimits().host_burst_s)  # the flooder's bucket full again, if it is on
                    flood_args = json.dumps({"port": ports["port"], "seconds": seconds, "threads": threads,
                                             "kind": phase})  # fmt: skip
                    flood = subprocess.Popen(
                        [sys.executable, __file__, "--flooder", flood_args], stdout=subprocess.PIPE, text=True
                    )
                    assert flood.stdout is not None
                    flood.stdout.readline()  # its imports done
                    time.sleep(0.5)  # and its calls under way: the window is the flood's middle
                cpu0, start = _cpu_s(server.pid), time.monotonic()
                honest = _honest_calls(address, spec, seconds - 1.0 if flood else seconds / 2)
                wall = time.monotonic() - start
                honest["node_cpu_per_s"] = round((_cpu_s(server.pid) - cpu0) / wall, 3)
                if flood is not None:
                    out, _ = flood.communicate(timeout=60)
                    honest["flooder"] = json.loads(out.strip().splitlines()[-1])
                    honest["flood_calls_per_s"] = round(sum(honest["flooder"].values()) / seconds, 1)
                row[phase] = honest
            server.stdin.close()
            row["refusals"] = json.loads(server.stdout.readline())["refusals"]
        finally:
            if server.poll() is None:
                server.terminate()
            server.wait(10)
        rows.append(row)
    return rows


def print_hello_flood(rows: list[dict], model: str) -> None:
    print(f"\nHello flood ({model}): flooder on 127.0.0.1, honest Hello + pull on [::1]; node = its own process")
    for r in rows:
        for phase in [k for k in ("quiet", *FLOOD_KINDS) if k in r]:
            p = r[phase]
            flood = f"; flood {p['flood_calls_per_s']}/s {p['flooder']}" if phase != "quiet" else ""
            print(
                f"{r['setting']:<20} ({r['host_rate']:g}/s, hold {r['hold_s']:g} s) {phase:<18}:"
                f" node CPU {p['node_cpu_per_s']:.3f} s/s;"
                f" honest Hello ms p50/p99 {p['hello_ms_p50_p99']}, pull {p['pull_ms_p50_p99']},"
                f" failed {p['failed']}{flood}"
            )
        print(f"{r['setting']}: server refusals {r['refusals']}")


# --- the run ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 s deadline (for the test suite)")
    parser.add_argument("--model", default="cnn", help="cnn, resnet18 or vgg11 (default cnn)")
    parser.add_argument("--deadline", type=float, default=5.0, help="the victim's pull deadline, seconds")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated subset")
    parser.add_argument("--no-server-attacks", action="store_true", help="skip the attacks on the server")
    parser.add_argument("--flood", action="store_true", help="only the Hello flood (rate limit off, then on)")
    parser.add_argument("--flood-seconds", type=float, default=8.0, help="length of the flood, seconds")
    parser.add_argument("--flood-threads", type=int, default=8, help="the flooder's threads")
    parser.add_argument("--victim", help=argparse.SUPPRESS)
    parser.add_argument("--flood-server", help=argparse.SUPPRESS)
    parser.add_argument("--flooder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.victim:
        print(json.dumps(victim(json.loads(args.victim))))
        return
    if args.flood_server:
        flood_server(json.loads(args.flood_server))
        return
    if args.flooder:
        flooder(json.loads(args.flooder))
        return
    if args.flood:
        model = "tiny" if args.quick else args.model
        # --quick (the test suite's smoke run): two settings, Hellos only (a fresh process's first pull compiles
        # the wire parser: seconds)
        settings = ("off", "on") if args.quick else tuple(FLOOD_SETTINGS)
        flood_rows = hello_flood(
            model, seconds=args.flood_seconds, threads=args.flood_threads, settings=settings, pulls=not args.quick,
            kinds=FLOOD_KINDS[:1] if args.quick else FLOOD_KINDS,
        )  # fmt: skip
        print_hello_flood(flood_rows, model)
        if args.json:
            args.json.write_text(json.dumps({"hello_flood": flood_rows, "host": platform.node(),
                                             "cpus": os.cpu_count()}, indent=2))  # fmt: skip
        return
    model = "tiny" if args.quick else args.model
    deadline_s = 1.0 if args.quick else args.deadline
    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        raise SystemExit(f"unknown attacks {unknown}; choose from {', '.join(ATTACKS)}")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        tls_dir = Path(folder)
        make_fleet_tls(tls_dir)
        for attack in attacks:
            with serving(attack, model, tls_dir) as (port, counters):
                if args.quick:
                    row = victim({"attack": attack, "port": port, "model": model, "deadline_s": deadline_s,
                                  "tls_dir": str(tls_dir)})  # fmt: skip
                else:
                    row = run_victim(attack, port, model, deadline_s, tls_dir)
            row["attacker_bytes_sent"] = counters.get("attacker_bytes_sent")
            rows.append(row)
    _weights, spec = model_weights(model)
    honest = next((r for r in rows if r["attack"] == "honest"), None)
    where = "in this process" if args.quick else "in a fresh process per attack"
    print(
        f"one pull of {model} ({spec.total_numel:,} parameters, density 0.5), deadline {deadline_s:g} s,"
        f" on {platform.node()} ({os.cpu_count()} CPUs); victim {where}"
    )
    header = f"{'attack':<18} {'outcome':<16} {'seconds':>8} {'victim bytes':>13} {'attacker yielded':>16}"
    header += f" {'CPU s':>7} {'peak RSS +MiB':>14}"
    print(header)
    print("-" * len(header))
    for r in rows:
        sent = "-" if r["attacker_bytes_sent"] is None else f"{r['attacker_bytes_sent']:,}"
        print(
            f"{r['attack']:<18} {r['outcome']:<16} {r['seconds']:>8.3f} {r['victim_bytes']:>13,} {sent:>16}"
            f" {r['cpu_s']:>7.3f} {r['peak_rss_growth_bytes'] / MIB:>14.1f}"
        )
    if honest:
        print(
            f"honest pull: {honest['seconds'] * 1e3:.1f} ms, {honest['victim_bytes']:,} bytes;"
            f" worst attack: {max(r['seconds'] for r in rows):.2f} s (the deadline bounds it),"
            f" {max(r['victim_bytes'] for r in rows):,} bytes"
        )
    server_rows = [] if args.no_server_attacks else server_attacks(model)
    if server_rows:
        print_server_attacks(server_rows, model)
    figures = {
        "server_attacks": server_rows,
        "model": model,
        "parameters": spec.total_numel,
        "deadline_s": deadline_s,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "rows": rows,
        "thread_count_after": threading.active_count(),
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
