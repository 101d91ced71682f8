"""A hostile network cannot hurt a node: real malicious gRPC servers on 127.0.0.1 against the client.

Every test bounds what the attack costs the puller (time, bytes, memory) and checks that the models
of honest peers still arrive exactly as published.
"""

from __future__ import annotations

import contextlib
import threading
import time
import tracemalloc
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch

from edge_node.algorithm import aggregate, screen_peer_models
from edge_node.errors import PeerUnreachable
from edge_node.net import (
    FAILURE_KINDS,
    ModelSnapshot,
    PeerAddress,
    PeerServer,
    PullFailure,
    ServerLimits,
    create_server,
    hello,
    pull_model,
    pull_models,
)
from edge_node.wire import ModelSpec, ValueType, WireLimits, encode_model
from edge_node.wire.messages import (
    GET_MODEL_METHOD,
    GetModelRequest,
    HelloReply,
    ProtoModelChunk,
    ProtoSparseTensor,
    value_type_to_proto,
)
from tests import wire_models
from tests.net.hostile import HostileServer, hold_open, no_connections_to
from tests.wire_models import PEER_FLEET as FLEET
from tests.wire_models import PEER_SHAPES as SHAPES
from tests.wire_models import PEER_SPEC as SPEC
from tests.wire_models import find_tensor, kept_fraction

PLAIN = {"insecure": True}


def model(seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return wire_models.random_model(SHAPES, seed, 0.5)


def messages(node_id: str, seed: int, round: int = 3, **kwargs) -> list[bytes]:
    weights, masks = model(seed)
    args = {"node_id": node_id, "fleet_id": FLEET, "round": round, "density": kept_fraction(masks)}
    args |= {"max_message_bytes": 4096} | kwargs
    return [m.SerializeToString() for m in encode_model(SPEC, weights, masks, **args)]


def assert_is_model(decoded, seed: int) -> None:
    """``decoded`` is exactly the honest model ``seed`` (masked weights and masks)."""
    weights, masks = model(seed)
    for name in SHAPES:
        assert torch.equal(decoded.masks[name], masks[name])
        assert torch.equal(decoded.weights[name], torch.where(masks[name], weights[name], 0.0))


@contextlib.contextmanager
def honest(node_id: str = "honest", seed: int = 1, **server_kwargs) -> Iterator[tuple[PeerServer, PeerAddress]]:
    peer = PeerServer(SPEC, node_id=node_id, fleet_id=FLEET, max_message_bytes=4096)
    weights, masks = model(seed)
    peer.publish(ModelSnapshot(weights, masks, 3, kept_fraction(masks), node_id, FLEET, SPEC.arch_id))
    server, port = create_server("127.0.0.1:0", peer, insecure=True, **server_kwargs)
    server.start()
    try:
        yield peer, PeerAddress(node_id, "127.0.0.1", port)
    finally:
        server.stop(None).wait(5)


def test_failure_kinds_are_listed_and_print_on_one_line() -> None:
    failure = PullFailure("timeout", "the batch deadline of 2 s ran out")
    assert str(failure) == "timeout: the batch deadline of 2 s ran out" and "\n" not in str(failure)
    assert len(set(FAILURE_KINDS)) == len(FAILURE_KINDS) == 12
    with pytest.raises(ValueError, match="kind='slow'"):
        PullFailure("slow", "x")


def test_a_peer_holding_the_stream_open_after_its_model_costs_nothing() -> None:
    def valid_then_hold(request, context):
        yield from messages("holder", 2)
        yield from hold_open(context)

    with HostileServer(get_model=valid_then_hold) as holder, honest() as (_peer, good):
        peer = PeerAddress("holder", "127.0.0.1", holder.port)
        start = time.monotonic()
        decoded = pull_model(peer, SPEC, FLEET, deadline_s=20, **PLAIN)
        assert time.monotonic() - start < 2.0  # was: three full deadlines, then the model discarded
        assert_is_model(decoded, 2)
        assert holder.wait_ended(1.0)  # the client cancelled the call as soon as the model was complete
        start = time.monotonic()
        result = pull_models([peer, good], SPEC, FLEET, deadline_s=20, **PLAIN)
        assert time.monotonic() - start < 2.0 and sorted(result.received) == ["holder", "honest"]
        assert_is_model(result.received["holder"], 2)
        assert_is_model(result.received["honest"], 1)


def _trickle(node_id: str, gap_s: float):
    """Slow-loris: a valid model one message per ``gap_s``, then the stream held open."""

    def behaviour(request, context):
        for message in messages(node_id, 5):
            yield message
            end = time.monotonic() + gap_s
            while context.is_active() and time.monotonic() < end:
                time.sleep(0.02)
        yield from hold_open(context)

    return behaviour


def test_pull_models_returns_at_its_deadline_and_cancels_stragglers() -> None:
    with HostileServer(get_model=_trickle("loris", 1.0)) as loris, honest() as (_peer, good):
        peers = [PeerAddress("loris", "127.0.0.1", loris.port), good]
        start = time.monotonic()
        result = pull_models(peers, SPEC, FLEET, deadline_s=1.5, **PLAIN)
        elapsed = time.monotonic() - start
        assert elapsed < 1.5 + 1.0, elapsed
        assert list(result.received) == ["honest"]
        assert_is_model(result.received["honest"], 1)
        straggler = result.failures["loris"]
        assert straggler.kind == "timeout" and "deadline of 1.5 s" in straggler.detail
        assert loris.wait_ended(1.0)  # its call was cancelled, not left running
    assert result.failure_counts() == {"timeout": 1}


def test_cancel_abandons_every_transfer_within_a_second() -> None:
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(HostileServer(get_model=_trickle(f"l{i}", 5.0))) for i in range(3)]
        peers = [PeerAddress(f"l{i}", "127.0.0.1", s.port) for i, s in enumerate(servers)]
        cancel = threading.Event()
        threading.Timer(0.5, cancel.set).start()
        start = time.monotonic()
        result = pull_models(peers, SPEC, FLEET, deadline_s=60, cancel=cancel, **PLAIN)
        assert time.monotonic() - start < 0.5 + 1.0
        assert {f.kind for f in result.failures.values()} == {"cancelled"} and not result.received
        assert all(s.wait_ended(1.0) for s in servers)
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        start = time.monotonic()
        with pytest.raises(PeerUnreachable) as caught:
            pull_model(peers[0], SPEC, FLEET, deadline_s=60, cancel=cancel, **PLAIN)
        assert caught.value.kind == "cancelled" and time.monotonic() - start < 0.3 + 1.0


def test_a_stream_cancelled_mid_way_leaves_no_call_and_no_connection_behind() -> None:
    """A pull whose stream is cut part-way, by the caller's cancel or by the deadline, ends its call and its
    connection: a stream read on the pulling thread keeps both until its cancelled call's events are taken."""
    with HostileServer(get_model=_trickle("loris", 5.0)) as loris:
        peer = PeerAddress("loris", "127.0.0.1", loris.port)
        for attempt in range(3):
            cancel = threading.Event()
            threading.Timer(0.3, cancel.set).start()
            result = pull_models([peer], SPEC, FLEET, deadline_s=60, cancel=cancel, **PLAIN)
            assert result.failures["loris"].kind == "cancelled", attempt
            result = pull_models([peer], SPEC, FLEET, deadline_s=0.3, **PLAIN)
            assert result.failures["loris"].kind == "timeout", attempt
        assert loris.calls == 6 and loris.wait_ended(1.0)
        assert no_connections_to([loris.port]) == [0]


def test_one_deadline_covers_every_retry_and_backoff() -> None:
    def unavailable(request, context):
        context.abort(grpc.StatusCode.UNAVAILABLE, "try later")
        yield b""

    with HostileServer(get_model=unavailable) as server:
        peer = PeerAddress("flaky", "127.0.0.1", server.port)
        start = time.monotonic()
        with pytest.raises(PeerUnreachable) as caught:
            pull_model(peer, SPEC, FLEET, deadline_s=1.5, retries=1000, backoff_s=0.2, **PLAIN)
        assert time.monotonic() - start < 1.5 + 1.0
        assert caught.value.kind == "unreachable" and "UNAVAILABLE: try later" in str(caught.value)
        assert server.calls >= 2  # it was retried, within the one deadline


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.OUT_OF_RANGE,
    ],
)
def test_refusals_are_final_not_retried(code: grpc.StatusCode) -> None:
    def refuse(request, context):
        context.abort(code, "no")
        yield b""

    with HostileServer(get_model=refuse) as server:
        peer = PeerAddress("refuser", "127.0.0.1", server.port)
        start = time.monotonic()
        result = pull_models([peer], SPEC, FLEET, deadline_s=10, retries=5, backoff_s=1.0, **PLAIN)
        assert time.monotonic() - start < 1.0 and server.calls == 1
    expected = "gone" if code is grpc.StatusCode.OUT_OF_RANGE else "refused"
    assert str(result.failures["refuser"]) == f"{expected}: {code.name}: no"


def test_garbage_and_bad_streams_are_final_not_retried() -> None:
    def garbage(request, context):
        yield b"\xff\xfe\xfd" * 10

    with HostileServer(get_model=garbage) as server:
        result = pull_models(
            [PeerAddress("g", "127.0.0.1", server.port)], SPEC, FLEET, retries=5, backoff_s=1.0, **PLAIN
        )
        assert server.calls == 1
    failure = result.failures["g"]
    assert failure.kind == "decode" and "not a valid ModelChunk" in failure.detail and failure.wire_bytes == 30


def _padded(kind: str, size: int):
    """A valid model whose messages carry ``size`` bytes of padding each, then padding forever."""
    pad = b"\x00" * size

    def behaviour(request, context):
        valid = messages("padder", 3)
        padding = b"\x7a" + _varint(len(pad)) + pad  # field 15, length-delimited: protobuf keeps it, unread
        if kind == "repeated field":  # the header's protocol_version twice: the padding, then the real one
            header = ProtoModelChunk.FromString(valid[0]).header.SerializeToString()
            inner = b"\x0a" + _varint(size) + b"x" * size + header
            yield b"\x0a" + _varint(len(inner)) + inner
        else:
            yield valid[0]
        for message in valid[1:]:
            yield message + padding
        while context.is_active():
            yield padding

    return behaviour


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@pytest.mark.parametrize(
    ("padding", "size", "kind", "words"),
    [
        ("unknown field", 30_000, "decode", "unknown field number(s) [15]"),
        ("repeated field", 30_000, "decode", "non-canonically encoded"),
        ("unknown field", 3_900_000, "limit", "larger than max"),  # more than the whole model: gRPC refuses it
    ],
)
def test_padded_streams_are_refused_at_the_first_padded_message(padding: str, size: int, kind: str, words: str) -> None:
    with HostileServer(get_model=_padded(padding, size)) as server:
        peer = PeerAddress("padder", "127.0.0.1", server.port)
        tracemalloc.start()
        start = time.monotonic()
        try:
            result = pull_models([peer], SPEC, FLEET, deadline_s=10, **PLAIN)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        elapsed = time.monotonic() - start
        assert server.wait_ended(2.0)
        sent = server.bytes_sent
    failure = result.failures["padder"]
    assert failure.kind == kind and words in failure.detail, failure
    assert failure.wire_bytes <= 2 * (size + 2_000)  # at most the header and one padded message
    assert elapsed < 2.0 and peak < 16 << 20  # was: 1 GiB of padding read and accepted
    assert sent < 64 << 20  # the transfer stopped (the server got a few messages out before the cancel)


def test_default_limits_bound_a_stream_by_the_receivers_model() -> None:
    limits = WireLimits.for_spec(SPEC)
    dense_bytes = SPEC.total_numel * 4
    assert dense_bytes < limits.max_total_bytes < dense_bytes * 1.1 + (64 << 10) + 4096
    assert limits.max_message_bytes <= limits.max_total_bytes

    def fine_chunks(request, context):  # a "valid" stream chunked 8 elements at a time
        yield from _finely_chunked("fine")

    with HostileServer(get_model=fine_chunks) as server:
        peer = PeerAddress("fine", "127.0.0.1", server.port)
        result = pull_models([peer], SPEC, FLEET, **PLAIN)
        assert server.calls == 1
        # the same stream passes when the receiver allows that many chunks: the limit, nothing else, refused it
        generous = pull_models([peer], SPEC, FLEET, limits=WireLimits(), **PLAIN)
    failure = result.failures["fine"]
    assert failure.kind == "limit" and "over the limit of" in failure.detail, failure
    assert list(generous.received) == ["fine"]


def _finely_chunked(node_id: str) -> Iterator[bytes]:
    import hashlib

    weights, _masks = model(4)
    digest = hashlib.sha256()
    bodies = []
    for name, shape in SHAPES.items():
        flat = weights[name].reshape(-1).numpy().astype("<f4")
        for start in range(0, flat.size, 8):
            values = flat[start : start + 8].tobytes()
            chunk = ProtoSparseTensor(
                name=name, shape=shape, value_type=value_type_to_proto(ValueType.FLOAT32), dense=True,
                start=start, count=len(values) // 4, value_start=start, nnz=len(values) // 4, values=values,
            )  # fmt: skip
            digest.update(values)
            bodies.append(ProtoModelChunk(tensors=[chunk]).SerializeToString())
    header = ProtoModelChunk()
    header.header.protocol_version, header.header.node_id, header.header.fleet_id = "1.1", node_id, FLEET
    header.header.arch_id, header.header.round, header.header.density = SPEC.arch_id, 3, 1.0
    header.header.payload_digest, header.header.message_count = digest.digest(), len(bodies)  # 1.1: SHA-256
    header.header.chunk_count = len(bodies)
    yield header.SerializeToString()
    yield from bodies


def test_absurd_but_finite_values_pass_the_wire_and_not_the_screen() -> None:
    with contextlib.ExitStack() as stack:
        peers = [stack.enter_context(honest(f"h{i}", seed=10 + i))[1] for i in range(3)]
        attacker = PeerServer(SPEC, node_id="huge", fleet_id=FLEET)
        weights, masks = model(20)
        attacker.publish(
            ModelSnapshot(
                {n: torch.full_like(w, 3e38) for n, w in weights.items()}, masks, 3, kept_fraction(masks), "huge",
                FLEET, SPEC.arch_id,
            )
        )  # fmt: skip
        server, port = create_server("127.0.0.1:0", attacker, insecure=True)
        server.start()
        stack.callback(lambda: server.stop(None).wait(5))
        result = pull_models([*peers, PeerAddress("huge", "127.0.0.1", port)], SPEC, FLEET, **PLAIN)
    assert sorted(result.received) == ["h0", "h1", "h2", "huge"]  # finite: the decoder has no reason to refuse
    own_w, own_m = model(30)
    own_w = {n: w * own_m[n] for n, w in own_w.items()}
    before = {n: w.clone() for n, w in own_w.items()}
    received = [(peer_id, m.weights, m.masks) for peer_id, m in sorted(result.received.items())]
    screen = screen_peer_models(own_w, own_m, received)
    assert screen.accepted == ["h0", "h1", "h2"] and list(screen.refused) == ["huge"]
    kept = [result.received[p] for p in screen.accepted]
    out = aggregate(own_w, own_m, own_m, [m.weights for m in kept], [m.masks for m in kept])
    assert all(bool(torch.isfinite(t).all()) for t in out.values())
    everyone = aggregate(own_w, own_m, own_m, [m.weights for _, m in sorted(result.received.items())],
                         [m.masks for _, m in sorted(result.received.items())])  # fmt: skip
    assert all(bool(torch.isfinite(t).all()) for t in everyone.values())  # even unscreened: finite, if far off
    assert all(torch.equal(before[n], own_w[n]) for n in own_w)


def _lie(mutate, *, node_id: str = "liar", round: int = 3) -> list[bytes]:
    weights, masks = model(6)
    msgs = encode_model(
        SPEC, weights, masks, node_id=node_id, fleet_id=FLEET, round=round, density=kept_fraction(masks),
        max_message_bytes=4096,
    )  # fmt: skip
    msgs = [ProtoModelChunk.FromString(m.SerializeToString()) for m in msgs]
    mutate(msgs)
    return [m.SerializeToString() for m in msgs]


def _swap_tensors(ms):
    a, b = find_tensor(ms, "conv1.weight"), find_tensor(ms, "conv1.bias")
    tmp = ProtoSparseTensor()
    tmp.CopyFrom(a)
    a.CopyFrom(b)
    b.CopyFrom(tmp)


def _half_precision(ms):
    tensor = find_tensor(ms, "fc2.bias")
    tensor.value_type = value_type_to_proto(ValueType.FLOAT16)
    tensor.values = np.frombuffer(tensor.values, "<f4").astype("<f2").tobytes()


LIES = {
    "header names another node": (
        lambda ms: setattr(ms[0].header, "node_id", "honest"),
        "identity",
        "from node 'honest'",
    ),
    "header round is not the one asked": (lambda ms: setattr(ms[0].header, "round", 4), "header", "round 4, round 3"),
    "header density is not the masks'": (lambda ms: setattr(ms[0].header, "density", 0.9), "header", "density 0.9"),
    "round beyond any plausible": (lambda ms: setattr(ms[0].header, "round", 10**18), "header", "round=10000000000"),
    "node id with a newline": (lambda ms: setattr(ms[0].header, "node_id", "liar\n"), "header", "node_id='liar\\n'"),
    "tensors out of order": (_swap_tensors, "decode", "out of order, expected tensor 'conv1.weight'"),
    "two value types": (_half_precision, "decode", "FLOAT16 in a stream of FLOAT32"),
    "lying counts": (lambda ms: setattr(ms[0].header, "message_count", 10**6), "header", "only"),
}


@pytest.mark.parametrize("case", list(LIES))
def test_header_and_order_lies_are_refused(case: str) -> None:
    mutate, kind, words = LIES[case]
    liar = PeerServer(SPEC, node_id="liar", fleet_id=FLEET)
    liar.publish_messages(_lie(mutate), round=3, density=0.5)
    server, port = create_server("127.0.0.1:0", liar, insecure=True)
    server.start()
    try:
        with honest() as (_peer, good):
            peers = [PeerAddress("liar", "127.0.0.1", port), good]
            result = pull_models(peers, SPEC, FLEET, round=3, retries=3, **PLAIN)
    finally:
        server.stop(None).wait(5)
    assert list(result.received) == ["honest"]
    assert_is_model(result.received["honest"], 1)
    failure = result.failures["liar"]
    assert failure.kind == kind and words in failure.detail, failure


def _hello_reply(**fields) -> bytes:
    reply = {
        "protocol_version": "1.1", "node_id": "peer", "fleet_id": FLEET, "arch_id": SPEC.arch_id, "round": 3,
        "density": 0.5, "capacity_tier": "t3", "has_model": True, "value_type": 1,
    } | fields  # fmt: skip
    return HelloReply(**reply).SerializeToString()


HELLO_LIES = {
    "NaN density": (_hello_reply(density=float("nan")), "header", "density=nan"),
    "100 kB tier": (_hello_reply(capacity_tier="x" * 100_000), "limit", "larger than max"),
    "unknown tier": (_hello_reply(capacity_tier="fast"), "header", "tier='fast'"),
    "value type 99": (_hello_reply(value_type=99), "header", "unknown value type 99"),
    "another node": (_hello_reply(node_id="other"), "identity", "answers as node 'other'"),
    "version with newline": (_hello_reply(protocol_version="1.1\n"), "header", "MAJOR.MINOR"),
    "non-ASCII digits": (_hello_reply(protocol_version="\u0661.\u0661"), "header", "MAJOR.MINOR"),
    "other major": (_hello_reply(protocol_version="2.0"), "header", "not compatible"),
    "padding field": (_hello_reply() + b"\x7a\x03abc", "header", "unknown field number(s) [15]"),
    "huge round": (_hello_reply(round=2**63), "header", f"round={2**63} must be"),
    "bad arch id": (_hello_reply(arch_id="x" * 300), "header", "architecture id"),
}


@pytest.mark.parametrize("case", list(HELLO_LIES))
def test_hello_replies_are_validated(case: str) -> None:
    raw, kind, words = HELLO_LIES[case]
    with HostileServer(hello=lambda request, context: raw) as server, pytest.raises(PeerUnreachable) as caught:
        hello(PeerAddress("peer", "127.0.0.1", server.port), **PLAIN)
    assert caught.value.kind == kind and words in str(caught.value), str(caught.value)


def test_a_valid_hello_reply_passes() -> None:
    with HostileServer(hello=lambda request, context: _hello_reply()) as server:
        info = hello(PeerAddress("peer", "127.0.0.1", server.port), **PLAIN)
        listed = hello(PeerAddress("127.0.0.1:1", "127.0.0.1", server.port), **PLAIN)  # a static host:port entry
    assert (info.identity.node_id, info.identity.tier, info.value_type, info.identity.round) == (
        "peer",
        "t3",
        ValueType.FLOAT32,
        3,
    )
    assert listed.identity.node_id == "peer"  # learned, not checked: the entry had no node id yet


def test_a_round_wait_that_runs_out_mid_call_still_says_what_the_peer_last_answered() -> None:
    """The last poll of a round may end in the transport's DEADLINE_EXCEEDED (a loaded machine answers
    the final short call too late): the failure still says which round the peer had."""

    def get_model(request: GetModelRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        if server.calls == 1:
            context.abort(grpc.StatusCode.NOT_FOUND, "round 9 not published yet (latest 4)")
        yield from hold_open(context)  # every later poll: no answer before the deadline

    with HostileServer(get_model=get_model) as server:
        address = PeerAddress("peer", "127.0.0.1", server.port)
        start = time.monotonic()
        with pytest.raises(PeerUnreachable) as never:
            pull_model(address, SPEC, FLEET, round=9, deadline_s=1.0, **PLAIN)
        assert time.monotonic() - start < 1.0 + 1.0 and server.calls >= 2
    assert never.value.kind == "not-ready"
    assert "round 9 not published yet (latest 4)" in str(never.value), str(never.value)


def test_lock_step_pull_waits_for_the_round_and_refuses_old_ones() -> None:
    with honest("slow") as (peer, address):
        weights, masks = model(7)

        def publish(round: int) -> None:
            peer.publish(ModelSnapshot(weights, masks, round, kept_fraction(masks), "slow", FLEET, SPEC.arch_id))

        timer = threading.Timer(0.7, publish, args=(4,))
        timer.start()
        start = time.monotonic()
        decoded = pull_model(address, SPEC, FLEET, round=4, deadline_s=10, **PLAIN)
        assert 0.6 < time.monotonic() - start < 3.0 and decoded.header.round == 4
        assert_is_model(decoded, 7)
        timer.join()
        start = time.monotonic()
        with pytest.raises(PeerUnreachable) as never:
            pull_model(address, SPEC, FLEET, round=9, deadline_s=1.0, **PLAIN)
        assert time.monotonic() - start < 1.0 + 1.0
        assert never.value.kind == "not-ready" and "round 9 not published yet (latest 4)" in str(never.value)
        publish(5)  # kept: rounds 4 and 5; round 3 is gone
        assert peer.published_rounds == (4, 5)
        start = time.monotonic()
        result = pull_models([address], SPEC, FLEET, round=3, deadline_s=10, **PLAIN)
        assert time.monotonic() - start < 1.0
        assert str(result.failures["slow"]) == "gone: OUT_OF_RANGE: round 3 is no longer kept (kept rounds: 4, 5)"
        assert pull_model(address, SPEC, FLEET, round=4, **PLAIN).header.round == 4
        refusals = peer.refusals()
    assert refusals["gone"] == 1 and refusals["not-ready"] >= 3


def test_one_caller_cannot_take_every_stream() -> None:
    shapes = {"big.weight": (1024, 2048), "big.bias": (1024,)}  # 8 MiB dense: more than transport buffers
    spec = ModelSpec("big", 2, shapes)
    weights = {n: torch.randn(s, generator=torch.Generator().manual_seed(0)) for n, s in shapes.items()}
    masks = {n: torch.ones(s, dtype=torch.bool) for n, s in shapes.items()}
    peer = PeerServer(spec, node_id="big", fleet_id=FLEET)
    peer.publish(ModelSnapshot(weights, masks, 1, 1.0, "big", FLEET, spec.arch_id))
    server, port = create_server("127.0.0.1:0", peer, insecure=True, limits=ServerLimits(max_streams_per_caller=2))
    server.start()
    try:
        # a greedy client: no flow-control window growth, so a stream it does not read stays open
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.http2.bdp_probe", 0)]) as channel:
            call = channel.unary_stream(
                GET_MODEL_METHOD, request_serializer=GetModelRequest.SerializeToString, response_deserializer=bytes
            )

            def request(claimed: str) -> GetModelRequest:
                return GetModelRequest(protocol_version="1.1", node_id=claimed, fleet_id=FLEET, arch_id=spec.arch_id)

            held = [call(request("greedy"), timeout=30) for _ in range(2)]  # opened, never read: a worker each
            for stream in held:
                next(stream)
            # In plaintext the caller is its host: claiming other node ids opens no more streams.
            for claimed in ("greedy", "greedy-2", "someone-else"):
                with pytest.raises(grpc.RpcError) as caught:
                    next(call(request(claimed), timeout=30))
                assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "'ipv4:127.0.0.1' already has 2 model streams open" in caught.value.details()
            assert peer.refusals() == {"busy": 3}
            for stream in held:
                stream.cancel()
            other = pull_model(PeerAddress("big", "127.0.0.1", port), spec, FLEET, node_id="other", **PLAIN)
            assert torch.equal(other.weights["big.weight"], weights["big.weight"])  # the streams were given back
    finally:
        server.stop(None).wait(5)
