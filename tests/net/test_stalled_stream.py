"""A connection that stops delivering mid-stream: given up by the pull's pings, the pull completes on a new one.

Under heavy loss TCP doubles its retransmission timeout after each lost retransmission, so a connection can sit
silent for tens of seconds while a new one would deliver at once (a 10 %-loss fleet's pull sat until its 30 s
deadline). ``StallingProxy`` makes that silence on purpose: the connection stays up, the client's bytes still
reach the server, and nothing comes back.
"""

from __future__ import annotations

import re
import time

import pytest

from edge_node.errors import PeerUnreachable
from edge_node.net import PeerAddress, PeerServer, pull_model, pull_models
from edge_node.net.client import KEEPALIVE_TIME_MS, PING_TIMEOUT_MS
from edge_node.net.server import ServerLimits, server_options
from tests.net.hostile import HostileServer, StallingProxy, hold_open
from tests.net.test_grpc_peer import serving, snapshot
from tests.wire_models import PEER_FLEET as FLEET
from tests.wire_models import PEER_SPEC as SPEC

STALL_AFTER_BYTES = 3000  # the HTTP/2 set-up, the stream's header message and part of its first chunk
# A silent connection is given up PING_TIMEOUT_MS after the ping then in flight, or after KEEPALIVE_TIME_MS
# and then PING_TIMEOUT_MS when none was; then a new connection and the whole stream again.
GIVEN_UP_WITHIN_S = (KEEPALIVE_TIME_MS + PING_TIMEOUT_MS) / 1000 + 3.0


@pytest.fixture
def many_messages() -> PeerServer:
    """A peer whose model is a stream of many small messages, so that a stall falls mid-stream."""
    peer = PeerServer(SPEC, node_id="good", fleet_id=FLEET, max_message_bytes=4096)
    peer.publish(snapshot("good", 1))
    return peer


def test_a_connection_that_goes_silent_mid_stream_is_given_up_and_the_pull_completes_on_a_new_one(many_messages):
    with serving(many_messages) as port, StallingProxy(port, STALL_AFTER_BYTES, stall_connections={1}) as proxy:
        start = time.monotonic()
        result = pull_models([PeerAddress("good", "127.0.0.1", proxy.port)], SPEC, FLEET, deadline_s=40.0, retries=2,
                             backoff_s=0.05, insecure=True)  # fmt: skip
        took = time.monotonic() - start
    assert not result.failures, result.failures
    model = result.received["good"]
    assert (model.header.identity.node_id, model.header.round) == ("good", 3)  # whole and checked (the stream digest)
    assert proxy.connections == 2  # the silent one, then one that delivered
    assert result.retries == {"unreachable": 1}  # the cut connection shows in the round's record
    # Before the pings had a timeout the pull sat on the silent connection until its 40 s deadline.
    assert took <= GIVEN_UP_WITHIN_S, took


@pytest.mark.parametrize("batch", [False, True], ids=["pull_model", "pull_models"])
def test_a_pull_that_runs_out_of_time_mid_stream_says_how_far_its_stream_got(many_messages, batch):
    with serving(many_messages) as port, StallingProxy(port, STALL_AFTER_BYTES) as proxy:
        peer = PeerAddress("good", "127.0.0.1", proxy.port)
        if batch:  # the batch's deadline cancels the call: the reason was "CANCELLED: Locally cancelled"
            result = pull_models([peer], SPEC, FLEET, deadline_s=2.0, retries=0, insecure=True)
            failure = result.failures["good"]
            kind, detail = failure.kind, failure.detail
            assert result.retries == {}
            assert failure.wire_bytes > 0
        else:
            with pytest.raises(PeerUnreachable) as raised:
                pull_model(peer, SPEC, FLEET, deadline_s=2.0, retries=0, insecure=True)
            kind, detail = raised.value.kind, str(raised.value)
    assert kind == "timeout", detail
    got = re.search(r"(\d+) of (\d+) messages in \(([\d,]+) bytes\)", detail)
    assert got is not None, detail
    arrived, announced, bytes_in = int(got[1]), int(got[2]), int(got[3].replace(",", ""))
    assert 1 <= arrived < announced and 0 < bytes_in < STALL_AFTER_BYTES, detail


def test_our_server_lets_a_quiet_call_ping_every_few_seconds():
    """The client pings a call that receives nothing for KEEPALIVE_TIME_MS; our server must not count those as
    abuse (its ping policy option was once misspelt, and gRPC ignores an unknown option: the default, one ping
    in 5 minutes, then sent a GOAWAY after the fourth ping)."""
    with HostileServer(get_model=lambda _request, context: hold_open(context),
                       options=server_options(ServerLimits())) as server:  # fmt: skip
        peer = PeerAddress("quiet", "127.0.0.1", server.port)
        with pytest.raises(PeerUnreachable) as raised:
            pull_model(peer, SPEC, FLEET, deadline_s=KEEPALIVE_TIME_MS / 1000 * 4.5, retries=2, insecure=True)
    assert raised.value.kind == "timeout", raised.value
    assert server.calls == 1, str(raised.value)  # one call, never cut by the server and retried
