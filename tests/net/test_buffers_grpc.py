"""Running statistics over real gRPC (protocol 1.3, ``norm_stats average``): sent only to callers that ask,
a 1.2 or ``local`` caller gets the stream it always got, bad statistics are a counted refusal."""

from __future__ import annotations

import grpc
import torch

from edge_node.net import ModelSnapshot, PeerAddress, PeerServer, pull_models
from edge_node.wire import decode_model
from edge_node.wire.messages import GET_MODEL_METHOD, GetModelRequest
from tests.net.test_grpc_peer import FAST, serving
from tests.wire.test_buffers import BUFFERS, DENSITY, FLEET, MASKS, PLAIN, SPEC, WEIGHTS, encode


def _server(spec, buffers=BUFFERS) -> PeerServer:
    server = PeerServer(spec, node_id="srv", fleet_id=FLEET)
    server.publish(ModelSnapshot(WEIGHTS, MASKS, 2, DENSITY, "srv", FLEET, spec.arch_id, buffers=buffers))
    return server


def test_an_average_node_sends_its_statistics_to_callers_that_ask():
    with serving(_server(SPEC)) as port:
        peer = [PeerAddress("srv", "127.0.0.1", port)]
        averaging = pull_models(peer, SPEC, FLEET, **FAST).received["srv"]
        local = pull_models(peer, PLAIN, FLEET, **FAST).received["srv"]  # never asks: the plain stream
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream(
                GET_MODEL_METHOD, request_serializer=GetModelRequest.SerializeToString, response_deserializer=bytes
            )
            request = GetModelRequest(protocol_version="1.2", node_id="old", fleet_id=FLEET, arch_id=SPEC.arch_id,
                                      buffers=True)  # fmt: skip
            old = decode_model(list(call(request, timeout=5)), PLAIN, FLEET)  # a 1.2 caller: no field 11
    assert all(torch.equal(averaging.buffers[n], BUFFERS[n]) for n in BUFFERS)
    assert local.buffers == {} and old.buffers == {}
    assert local.wire_bytes == old.wire_bytes < averaging.wire_bytes


def test_an_average_node_pulls_a_local_node_without_statistics():
    with serving(_server(PLAIN, buffers={})) as port:
        result = pull_models([PeerAddress("srv", "127.0.0.1", port)], SPEC, FLEET, **FAST)
    assert not result.failures and result.received["srv"].buffers == {}


def test_bad_statistics_are_a_counted_refusal():
    bad = PeerServer(SPEC, node_id="a", fleet_id=FLEET)  # the node encode() names
    bad.publish_messages(encode(BUFFERS | {"norm.running_var": -BUFFERS["norm.running_var"]}), round=2, density=0.5)
    with serving(bad) as port:
        result = pull_models([PeerAddress("a", "127.0.0.1", port)], SPEC, FLEET, **FAST)
    assert not result.received and result.failure_counts() == {"decode": 1}
    assert "variances are negative" in str(result.failures["a"])
