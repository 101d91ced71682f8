"""The peer service over real gRPC on 127.0.0.1: pulls, retries, deadlines, and refusal of bad input."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch

from edge_node.errors import ConfigError, ListenError, WireDecodeError
from edge_node.net import (
    ModelSnapshot,
    PeerAddress,
    PeerServer,
    ServerLimits,
    create_server,
    hello,
    pull_model,
    pull_models,
)
from edge_node.net import tls as tls_module
from edge_node.net.channels import CHANNELS
from edge_node.wire import PROTOCOL_VERSION, DecodedModel, ModelSpec, ValueType, WireLimits, decode_model, encode_model
from edge_node.wire.messages import GET_MODEL_METHOD, GetModelRequest, ProtoModelChunk
from tests import wire_models
from tests.net.hostile import connections_to, no_connections_to
from tests.wire_models import PEER_FLEET as FLEET
from tests.wire_models import PEER_SHAPES as SHAPES
from tests.wire_models import PEER_SPEC as SPEC
from tests.wire_models import find_tensor, kept_fraction

FAST = {"deadline_s": 5.0, "retries": 1, "backoff_s": 0.05, "insecure": True}


def random_model(seed: int, density: float = 0.5) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return wire_models.random_model(SHAPES, seed, density)


def snapshot(node_id: str, seed: int, round: int = 3) -> ModelSnapshot:
    weights, masks = random_model(seed)
    return ModelSnapshot(weights, masks, round, kept_fraction(masks), node_id, FLEET, SPEC.arch_id, "t2")


@contextlib.contextmanager
def serving(peer: PeerServer, **kwargs) -> Iterator[int]:
    """A started server for ``peer`` on 127.0.0.1; stopped (and its threads ended) on exit."""
    kwargs.setdefault("insecure", "tls" not in kwargs)
    server, port = create_server("127.0.0.1:0", peer, **kwargs)
    server.start()
    try:
        yield port
    finally:
        server.stop(None).wait(5)


@contextlib.contextmanager
def good_and_bad(bad_messages: list[ProtoModelChunk] | None = None) -> Iterator[tuple[PeerServer, list[PeerAddress]]]:
    """A well-behaved peer "good" and a peer "bad" serving ``bad_messages`` verbatim."""
    good = PeerServer(SPEC, node_id="good", fleet_id=FLEET, max_message_bytes=4096)
    good.publish(snapshot("good", 1))
    bad = PeerServer(SPEC, node_id="bad", fleet_id=FLEET)
    if bad_messages is not None:
        bad.publish_messages(bad_messages, round=3, density=0.5)
    with serving(good) as good_port, serving(bad) as bad_port:
        yield bad, [PeerAddress("bad", "127.0.0.1", bad_port), PeerAddress("good", "127.0.0.1", good_port)]


def crafted(mutate) -> list[ProtoModelChunk]:
    weights, masks = random_model(2)
    messages = encode_model(
        SPEC, weights, masks, node_id="bad", fleet_id=FLEET, round=3, density=kept_fraction(masks),
        max_message_bytes=4096,
    )  # fmt: skip
    messages = [ProtoModelChunk.FromString(m.SerializeToString()) for m in messages]
    return mutate(messages) or messages


def _truncate_bitmap(ms):
    tensor = find_tensor(ms, "conv1.weight")
    tensor.bitmap = tensor.bitmap[:-1]


def _drop_value(ms):
    tensor = find_tensor(ms, "fc2.weight")
    tensor.values, tensor.nnz = tensor.values[:-4], tensor.nnz - 1


def _rename(ms):
    find_tensor(ms, "fc2.bias").name = "head.bias"


def _reshape(ms):
    tensor = find_tensor(ms, "fc2.weight")
    del tensor.shape[:]
    tensor.shape.extend([40, 10])


def _nan(ms):
    tensor = find_tensor(ms, "fc2.weight")
    tensor.values = np.float32("nan").tobytes() + tensor.values[4:]


def _inf(ms):
    tensor = find_tensor(ms, "conv1.bias")
    tensor.values = np.float32("inf").tobytes() + tensor.values[4:]


def _other_fleet(ms):
    ms[0].header.fleet_id = "fleet-2"


def _halfway(ms):
    return ms[: len(ms) // 2]


BAD_STREAMS = {
    "truncated bitmap": (
        _truncate_bitmap,
        "decode: WireDecodeError: message \\d+, tensor 'conv1.weight': bitmap has 26 bytes, expected 27",
    ),
    "value count != bitmap": (
        _drop_value,
        "decode: WireDecodeError: tensor 'fc2.weight': bitmap has \\d+ active elements but",
    ),
    "unknown tensor name": (_rename, "decode: WireDecodeError: .*'head.bias': unknown tensor name"),
    "wrong shape": (
        _reshape,
        "decode: WireDecodeError: .*'fc2.weight': shape \\(40, 10\\) does not match the model's \\(10, 40\\)",
    ),
    "NaN values": (_nan, "decode: WireDecodeError: tensor 'fc2.weight': 1 values are NaN or Inf"),
    "Inf values": (_inf, "decode: WireDecodeError: tensor 'conv1.bias': 1 values are NaN or Inf"),
    "stream stops halfway": (_halfway, "decode: WireDecodeError: stream ended after \\d+ of the \\d+ tensor messages"),
    "header from another fleet": (
        _other_fleet,
        "header: HeaderMismatch: header: stream is from fleet 'fleet-2', expected 'fleet-1'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_STREAMS))
def test_bad_stream_is_refused_and_receiver_untouched(case: str) -> None:
    mutate, reason = BAD_STREAMS[case]
    with good_and_bad(crafted(mutate)) as (_bad, peers):
        result = pull_models(peers, SPEC, FLEET, **FAST)
        assert list(result.received) == ["good"]  # the round goes on with the peer that answered well
        assert list(result.failures) == ["bad"]
        assert re.fullmatch(reason + ".*", str(result.failures["bad"])), result.failures
        again = pull_models(peers[1:], SPEC, FLEET, **FAST)  # and both servers keep serving
        assert list(again.received) == ["good"]
        assert hello(peers[0], insecure=True).identity.node_id == "bad"
    # The client never gets the receiver's model: it hands back new tensors, and only for streams that
    # validated completely. What it hands back for the good peer is exactly that peer's snapshot, so
    # the bad stream decoded alongside left nothing behind in it.
    weights, masks = random_model(1)
    for name in SHAPES:
        assert torch.equal(result.received["good"].masks[name], masks[name])
        assert torch.equal(result.received["good"].weights[name], torch.where(masks[name], weights[name], 0.0))


def test_oversize_message_is_refused_by_the_receiver() -> None:
    with good_and_bad() as (bad, peers):
        weights, masks = random_model(3)
        density = kept_fraction(masks)
        bad.publish_messages(
            encode_model(SPEC, weights, masks, node_id="bad", fleet_id=FLEET, round=1, density=density),
            round=1,
            density=density,
        )
        result = pull_models(peers, SPEC, FLEET, limits=WireLimits(max_message_bytes=4096), **FAST)
    assert result.failures["bad"].kind == "limit", result.failures
    assert result.failures["bad"].detail.startswith("RESOURCE_EXHAUSTED") and "larger than max" in str(result.failures)
    assert list(result.received) == ["good"]  # small messages from the good peer pass the same limit


def test_pull_models_in_parallel_with_value_types_and_an_unreachable_peer() -> None:
    servers = [
        PeerServer(SPEC, node_id=f"n{i}", fleet_id=FLEET, tier="t2", value_type=vt) for i, vt in enumerate(ValueType)
    ]
    snaps = [snapshot(f"n{i}", 10 + i, round=i) for i in range(len(servers))]
    for server, snap in zip(servers, snaps, strict=True):
        assert server.publish(snap) > 0
    with contextlib.ExitStack() as stack:
        peers = [PeerAddress(s.node_id, "127.0.0.1", stack.enter_context(serving(s))) for s in servers]
        with socket.socket() as probe:  # a port nobody listens on
            probe.bind(("127.0.0.1", 0))
            dead_port = probe.getsockname()[1]
        peers.append(PeerAddress("dead", "127.0.0.1", dead_port))
        result = pull_models(peers, SPEC, FLEET, node_id="me", **FAST)
        info = hello(peers[2], insecure=True)
    assert sorted(result.received) == ["n0", "n1", "n2"]
    dead = result.failures["dead"]
    assert dead.kind == "unreachable" and dead.detail.startswith("UNAVAILABLE") and "after 2 attempts" in dead.detail
    for server, snap in zip(servers, snaps, strict=True):
        model = result.received[server.node_id]
        assert model.header.round == snap.round and model.value_type is server.value_type
        for name in SHAPES:
            expected = torch.where(snap.masks[name], snap.weights[name].to(server.value_type.torch_dtype).float(), 0.0)
            assert torch.equal(model.weights[name], expected)
            assert torch.equal(model.masks[name], snap.masks[name])
    assert (info.identity.node_id, info.identity.fleet_id, info.identity.arch_id, info.identity.protocol_version) == (
        "n2",
        FLEET,
        SPEC.arch_id,
        PROTOCOL_VERSION,
    )
    assert (info.identity.round, info.identity.density, info.identity.tier, info.has_model, info.value_type) == (
        2,
        snaps[2].density,
        "t2",
        True,
        ValueType.BFLOAT16,
    )


def test_peer_without_snapshot_is_not_ready_at_once() -> None:
    with good_and_bad() as (bad, peers):
        assert hello(peers[0], insecure=True).has_model is False
        start = time.monotonic()
        result = pull_models(peers, SPEC, FLEET, **FAST)
        assert time.monotonic() - start < 2.0  # the latest model of a peer that has none: no waiting
        assert bad.refusals() == {"not-ready": 1}
    assert str(result.failures["bad"]) == "not-ready: NOT_FOUND: no model published yet (latest none)"
    assert list(result.received) == ["good"]


def test_deadline_bounds_a_peer_that_never_answers() -> None:
    with socket.socket() as silent:  # accepts TCP connections (kernel backlog) but never speaks HTTP/2
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        peer = PeerAddress("silent", "127.0.0.1", silent.getsockname()[1])
        start = time.monotonic()
        result = pull_models([peer], SPEC, FLEET, deadline_s=0.5, retries=1, backoff_s=0.05, insecure=True)
        elapsed = time.monotonic() - start
    assert result.failures["silent"].kind == "timeout", result.failures
    assert elapsed < 0.5 + 1.0  # one deadline for the pull, retries included


def _raw_get_model(port: int, request: GetModelRequest) -> grpc.RpcError:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_stream(
            GET_MODEL_METHOD, request_serializer=GetModelRequest.SerializeToString, response_deserializer=bytes
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(call(request, timeout=5))
    return caught.value


VERSIONED = [("1.0", "1.1", "sha256"), ("1.1", "1.1", "sha256"), ("1.2", "1.5", "xxh3_128"), ("1.9", "1.5", "xxh3_128")]


@pytest.mark.parametrize(("caller", "served", "digest"), VERSIONED)
def test_server_answers_each_caller_in_its_version(caller: str, served: str, digest: str) -> None:
    """Callers before 1.2 get the SHA-256 header they check; the tensors are the same bytes for all."""
    server = PeerServer(SPEC, node_id="srv", fleet_id=FLEET)
    server.publish(snapshot("srv", 4))
    streams = []
    with serving(server) as port, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_stream(
            GET_MODEL_METHOD, request_serializer=GetModelRequest.SerializeToString, response_deserializer=bytes
        )
        for version in (caller, PROTOCOL_VERSION):
            request = GetModelRequest(protocol_version=version, node_id="me", fleet_id=FLEET, arch_id=SPEC.arch_id)
            streams.append(list(call(request, timeout=5)))
    model = decode_model(streams[0], SPEC, FLEET, expected_node_id="srv")
    assert model.header.identity.protocol_version == served and model.header.payload_digest_text.startswith(
        digest + ":"
    )
    assert streams[0][1:] == streams[1][1:]
    assert model.header.round == 3 and model.nnz == sum(int(m.sum()) for m in snapshot("srv", 4).masks.values())


def test_server_refuses_bad_requests_and_keeps_serving() -> None:
    server = PeerServer(SPEC, node_id="srv", fleet_id=FLEET)
    server.publish(snapshot("srv", 4))
    with serving(server, limits=ServerLimits(max_request_bytes=1024)) as port:
        peer = PeerAddress("srv", "127.0.0.1", port)
        other_fleet = pull_models([peer], SPEC, "fleet-2", **FAST)
        assert (
            str(other_fleet.failures["srv"])
            == "refused: FAILED_PRECONDITION: caller's fleet 'fleet-2' is not this node's fleet 'fleet-1'"
        )
        other_arch = pull_models([peer], ModelSpec("tiny", 100, SHAPES), FLEET, **FAST)
        assert str(other_arch.failures["srv"]).startswith("refused: FAILED_PRECONDITION: caller's architecture 'tiny/1")
        good = {"protocol_version": "1.0", "fleet_id": FLEET, "arch_id": SPEC.arch_id}
        newer = _raw_get_model(port, GetModelRequest(**(good | {"protocol_version": "2.0"})))
        assert newer.code() is grpc.StatusCode.FAILED_PRECONDITION and "'2.0'" in newer.details()
        huge = _raw_get_model(port, GetModelRequest(node_id="x" * 100_000, **good))
        assert huge.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        result = pull_models([peer], SPEC, FLEET, **FAST)  # still serving
        assert list(result.received) == ["srv"] and not result.failures
        # the oversize request: grpc refuses it, and the call it leaves without a request is counted
        assert server.refusals() == {"fleet": 1, "arch": 1, "protocol": 1, "bad-request": 1}


def test_concurrent_pulls_see_whole_snapshots_while_publishing() -> None:
    server = PeerServer(SPEC, node_id="pub", fleet_id=FLEET)
    _, masks = random_model(5)

    def publish(round: int) -> None:
        weights = {name: torch.full(shape, float(round)) for name, shape in SHAPES.items()}
        server.publish(ModelSnapshot(weights, masks, round, kept_fraction(masks), "pub", FLEET, SPEC.arch_id))

    publish(0)
    stop = threading.Event()

    def publisher() -> None:
        for round in range(1, 200):
            if stop.is_set():
                return
            publish(round)

    with serving(server) as port:
        peer = PeerAddress("pub", "127.0.0.1", port)

        def pulls(caller: int) -> list[DecodedModel]:
            return [pull_model(peer, SPEC, FLEET, node_id=f"caller{caller}", **FAST) for _ in range(3)]

        thread = threading.Thread(target=publisher)
        thread.start()
        try:
            with ThreadPoolExecutor(4) as pool:  # 4 callers at once, 3 pulls each
                seen = [model for models in pool.map(pulls, range(4)) for model in models]
        finally:
            stop.set()
            thread.join(10)
    assert len(seen) == 12
    for model in seen:
        values = torch.cat([w[m] for w, m in zip(model.weights.values(), model.masks.values(), strict=True)])
        assert bool((values == model.header.round).all())  # never a mix of two snapshots


def test_plaintext_needs_explicit_insecure_and_warns_once(monkeypatch, caplog) -> None:
    server = PeerServer(SPEC, node_id="p", fleet_id=FLEET)
    with pytest.raises(ConfigError, match="insecure=True"):
        create_server("127.0.0.1:0", server)
    with pytest.raises(ConfigError, match="insecure=True"):
        pull_models([PeerAddress("p", "127.0.0.1", 1)], SPEC, FLEET)
    monkeypatch.setattr(tls_module, "_insecure_warned", set())
    with caplog.at_level(logging.WARNING, logger="edge_node.net.tls"):
        for _ in range(2):
            with serving(server, insecure=True):
                pass
    warnings = [r for r in caplog.records if "INSECURE" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_port_in_use_is_a_listen_error() -> None:
    server = PeerServer(SPEC, node_id="p", fleet_id=FLEET)
    with serving(server) as port, pytest.raises(ListenError, match=f"127.0.0.1:{port}"):
        create_server(f"127.0.0.1:{port}", server, insecure=True)


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1", "127.0.0.1:x", ":7000", "unix:/tmp/sock"])
def test_bad_listen_address_is_a_config_error(address: str) -> None:
    server = PeerServer(SPEC, node_id="p", fleet_id=FLEET)
    with pytest.raises(ConfigError, match="HOST:PORT"):  # not a port gRPC silently wraps (99999 -> 34463)
        create_server(address, server, insecure=True)


def test_peer_server_checks_its_arguments_up_front() -> None:
    with pytest.raises(ValueError, match="max_message_bytes=100"):
        PeerServer(SPEC, node_id="p", fleet_id=FLEET, max_message_bytes=100)
    with pytest.raises(ValueError, match="node_id=''"):
        PeerServer(SPEC, node_id="", fleet_id=FLEET)
    with pytest.raises(ValueError, match="value_type='int8'"):
        PeerServer(SPEC, node_id="p", fleet_id=FLEET, value_type="int8")


class _BrokenCall(grpc.RpcError):
    """A call whose stream breaks after ``good`` messages (the peer vanished mid-transfer)."""

    def __init__(self, messages: list[bytes], good: int) -> None:
        self._messages, self._good = messages, good

    def __iter__(self) -> Iterator[bytes]:
        yield from self._messages[: self._good]
        raise self

    def cancel(self) -> bool:
        return False

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "peer went away"


class _BrokenChannel:
    def __init__(self, call: _BrokenCall) -> None:
        self._call = call

    def unary_stream(self, *_args: object, **_kwargs: object):
        return lambda _request, timeout: self._call


def test_a_call_that_breaks_part_way_abandons_its_decoder() -> None:
    """The chunks of a stream that will never complete are not built (their builds are dropped)."""
    from edge_node.net import client
    from edge_node.wire import ModelDecoder

    weights, masks = random_model(4)
    messages = encode_model(
        SPEC, weights, masks, node_id="good", fleet_id=FLEET, round=3, density=kept_fraction(masks),
        max_message_bytes=4096,
    )  # fmt: skip
    raw = [m.SerializeToString() for m in messages]
    decoder = ModelDecoder(SPEC, FLEET)
    request = GetModelRequest(protocol_version=PROTOCOL_VERSION, fleet_id=FLEET, arch_id=SPEC.arch_id)
    channel = _BrokenChannel(_BrokenCall(raw, good=2))
    with pytest.raises(grpc.RpcError):
        client._stream(channel, request, decoder, 5.0, client._Stop())  # type: ignore[arg-type]
    assert decoder.chunks > 0
    with pytest.raises(WireDecodeError, match="abandoned"):
        decoder.finish()


def test_pulls_leave_no_call_behind_and_keep_one_connection_per_peer_that_served() -> None:
    """Every pull ends its call: complete streams (cancelled once the model is in) and refused ones (cancelled
    part-way); a pull cancelled before it starts opens nothing. The connection of a pull that succeeded is
    kept for the next pull from that peer (one, however many pulls), that of a failed pull is closed, and
    ``CHANNELS.close()`` closes the kept ones. A stream read on the calling thread left each cancelled call,
    and its connection, open when its last events were not taken. Streams cancelled mid-way by the caller or
    the deadline: ``test_hostile``."""
    good = PeerServer(SPEC, node_id="good", fleet_id=FLEET, max_message_bytes=4096)
    good.publish(snapshot("good", 1))
    with serving(good) as port, good_and_bad(crafted(_nan)) as (_bad, peers):
        address = PeerAddress("good", "127.0.0.1", port)
        made = CHANNELS.made
        for _ in range(3):
            assert not pull_models([address], SPEC, FLEET, **FAST).failures
        assert CHANNELS.made == made + 1
        result = pull_models(peers, SPEC, FLEET, **FAST)
        assert set(result.received) == {"good"} and result.failures["bad"].kind == "decode"
        cancel = threading.Event()
        cancel.set()
        assert pull_models([address], SPEC, FLEET, cancel=cancel, **FAST).failures["good"].kind == "cancelled"
        assert no_connections_to([peers[0].port]) == [0]  # the refused stream's connection is closed
        assert [connections_to(p) for p in (port, peers[1].port)] == [1, 1]
        CHANNELS.close()
        assert no_connections_to([port, *(p.port for p in peers)]) == [0, 0, 0]


def test_a_peer_that_restarts_is_pulled_at_once_on_a_new_connection() -> None:
    """A kept channel whose peer went away is discarded by the failed pull: once the peer is back (same
    port), the next pull connects afresh instead of waiting out gRPC's reconnect backoff."""
    peer = PeerServer(SPEC, node_id="good", fleet_id=FLEET, max_message_bytes=4096)
    peer.publish(snapshot("good", 1))
    with serving(peer) as port:
        address = PeerAddress("good", "127.0.0.1", port)
        assert not pull_models([address], SPEC, FLEET, **FAST).failures
    assert pull_models([address], SPEC, FLEET, **{**FAST, "retries": 0}).failures["good"].kind == "unreachable"
    server, _ = create_server(f"127.0.0.1:{port}", peer, insecure=True)
    server.start()
    try:
        made = CHANNELS.made
        start = time.monotonic()
        assert not pull_models([address], SPEC, FLEET, **{**FAST, "retries": 0}).failures
        assert time.monotonic() - start < 2.0 and CHANNELS.made == made + 1
    finally:
        server.stop(None).wait(5)


def test_each_retry_goes_on_a_new_connection_and_reaches_a_restarted_peer_at_once(monkeypatch) -> None:
    """Within one pull, a retry after a refused connection leases a new channel: the old one sits in gRPC's
    reconnect backoff (1 s, growing 1.6x), failing calls at once, so a pull retried on it reached a peer
    restarted 1.5 s in 3.3 s after it was back (measured). Retries every 0.05-0.1 s here: the peer is reached within a
    few of them once back."""
    monkeypatch.setattr("edge_node.net.client.MAX_BACKOFF_S", 0.1)
    peer = PeerServer(SPEC, node_id="good", fleet_id=FLEET, max_message_bytes=4096)
    peer.publish(snapshot("good", 1))
    with serving(peer) as port:
        address = PeerAddress("good", "127.0.0.1", port)
        assert not pull_models([address], SPEC, FLEET, **FAST).failures  # a channel kept, then refused below
    made, reused = CHANNELS.made, CHANNELS.reused
    result = pull_models([address], SPEC, FLEET, **{**FAST, "retries": 3})
    assert result.failures["good"].kind == "unreachable" and result.retries == {"unreachable": 3}
    assert (CHANNELS.made, CHANNELS.reused) == (made + 3, reused + 1)  # the kept one, then one per retry
    back_at: list[float] = []
    servers = []

    def restart() -> None:
        time.sleep(1.5)
        server, _ = create_server(f"127.0.0.1:{port}", peer, insecure=True)
        server.start()
        servers.append(server)
        back_at.append(time.monotonic())

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        result = pull_models([address], SPEC, FLEET, **{**FAST, "deadline_s": 10.0, "retries": 100})
        done_at = time.monotonic()
    finally:
        thread.join()
        for server in servers:
            server.stop(None).wait(5)
    assert not result.failures and result.retries["unreachable"] >= 10
    assert done_at - back_at[0] < 0.5  # gRPC's backoff alone would put the next connection at 1.0-2.6 s


def test_a_peer_that_is_not_ready_is_polled_on_one_connection() -> None:
    """A "not ready" answer proves the connection: the polls for a round, and the pull that ends them, use
    the one channel."""
    peer = PeerServer(SPEC, node_id="good", fleet_id=FLEET, max_message_bytes=4096)
    peer.publish(snapshot("good", 1, round=3))
    with serving(peer) as port:
        address = PeerAddress("good", "127.0.0.1", port)
        CHANNELS.close()
        made = CHANNELS.made
        timer = threading.Timer(0.5, peer.publish, [snapshot("good", 2, round=4)])
        timer.start()
        try:
            result = pull_models([address], SPEC, FLEET, round=4, **FAST)
        finally:
            timer.join()
        assert not result.failures and peer.refusals()["not-ready"] >= 2
        assert CHANNELS.made == made + 1 and connections_to(port) == 1
