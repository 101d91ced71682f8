"""The contract values' one rule each (``edge_node.protocol``), and where two old rules disagreed, the stricter."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edge_node.algorithm.masks import check_density as masks_check_density
from edge_node.errors import ConfigError, HeaderMismatch, PeerUnreachable
from edge_node.net.client import PeerAddress, _parse_hello
from edge_node.net.server import hello_reply
from edge_node.node.config import NodeConfig
from edge_node.protocol import MAX_ROUND, PROTOCOL_VERSION, NodeIdentity
from edge_node.wire import ModelSpec, ValueType, decode_model, encode_model
from edge_node.wire.messages import HelloReply

SPEC = ModelSpec("tiny", 2, {"w": (4, 4), "b": (4,)})
OWN = NodeIdentity(PROTOCOL_VERSION, "pi-1", "lab", SPEC.arch_id, round=3, density=0.5, tier="t3")


def test_a_known_identity_passes_and_density_becomes_a_float() -> None:
    checked = dataclasses.replace(OWN, density=1).check()
    assert checked == dataclasses.replace(OWN, density=1.0) and isinstance(checked.density, float)
    assert NodeIdentity().check() == NodeIdentity()  # nothing known yet: nothing to refuse


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("protocol_version", "1", "protocol version '1'"),
        ("node_id", "a.b", "node_id='a.b'"),
        ("fleet_id", "lab.1", "fleet_id='lab.1'"),
        ("arch_id", "cnn:10:3f2a", "arch_id='cnn:10:3f2a'"),
        ("round", MAX_ROUND + 1, f"round={MAX_ROUND + 1}"),
        ("round", True, "round=True"),
        ("density", 0.0, "density=0.0"),
        ("density", float("nan"), "density=nan"),
        ("tier", "fast", "tier='fast'"),
        ("tier", "", "tier=''"),
    ],
)
def test_check_names_the_field_and_the_value(field: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(".", r"\.")):
        dataclasses.replace(OWN, **{field: value}).check()


def test_compatible_is_the_same_major() -> None:
    assert OWN.compatible() and OWN.compatible("1.0") and not OWN.compatible("2.0")
    assert not dataclasses.replace(OWN, protocol_version="2.1").compatible()
    assert NodeIdentity().compatible("9.9")  # a version not known yet: nothing against it
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        dataclasses.replace(OWN, protocol_version="1.x").compatible()


# -- where the old rules disagreed, the stricter one holds now --------------------------------------
def _hello(**fields: object) -> bytes:
    return hello_reply(dataclasses.replace(OWN, **fields), ValueType.FLOAT32).SerializeToString()  # type: ignore[arg-type]


def test_a_hello_maps_no_model_and_no_tier_to_none_both_ways() -> None:
    peer = PeerAddress("pi-1", "127.0.0.1", 1)
    assert _parse_hello(_hello(), peer).identity == OWN
    empty = _parse_hello(_hello(round=None, density=None, tier=None), peer)
    assert empty.identity == dataclasses.replace(OWN, round=None, density=None, tier=None) and not empty.has_model
    reply = HelloReply.FromString(_hello(round=None, density=None, tier=None))
    assert (reply.round, reply.density, reply.capacity_tier, reply.has_model) == (0, 0.0, "", False)  # the wire's


def test_a_hello_with_a_model_at_density_0_is_refused() -> None:
    """net/client.py took [0, 1] for a Hello's density; a model keeps a weight: (0, 1] wins."""
    raw = HelloReply.FromString(_hello())
    raw.density = 0.0
    with pytest.raises(PeerUnreachable, match="density=0.0"):
        _parse_hello(raw.SerializeToString(), PeerAddress("pi-1", "127.0.0.1", 1))


def test_a_hello_arch_id_of_the_old_txt_form_is_refused() -> None:
    with pytest.raises(PeerUnreachable, match="arch_id='cnn:10:3f2a'"):
        _parse_hello(_hello(arch_id="cnn:10:3f2a"), PeerAddress("pi-1", "127.0.0.1", 1))


def test_a_stream_at_density_0_is_refused_both_ways() -> None:
    """wire/codec.py took [0, 1] for a header's density: (0, 1] wins, on encoding and on decoding."""
    weights = {"w": torch.ones(4, 4), "b": torch.ones(4)}
    empty = {"w": torch.zeros(4, 4, dtype=torch.bool), "b": torch.zeros(4, dtype=torch.bool)}
    with pytest.raises(ValueError, match="density=0.0"):
        encode_model(SPEC, weights, empty, node_id="pi-1", fleet_id="lab", round=1, density=0.0)
    one = {"w": empty["w"].clone(), "b": empty["b"].clone()}
    one["w"][0, 0] = True
    messages = encode_model(SPEC, weights, one, node_id="pi-1", fleet_id="lab", round=1, density=1 / 20)
    messages[0].header.density = 0.0
    with pytest.raises(HeaderMismatch, match="header: density=0.0"):
        decode_model(messages, SPEC, "lab")


def test_a_boolean_density_is_refused_by_the_algorithm_too() -> None:
    """algorithm/masks.py took ``True`` as 1.0: the protocol's rule (no booleans) wins."""
    with pytest.raises(ConfigError, match="density=True"):
        masks_check_density(True)  # type: ignore[arg-type]
    assert masks_check_density(0.5) == 0.5


def test_capacity_takes_the_density_rule() -> None:
    assert NodeConfig(capacity="0.5").fixed_density == 0.5
    for bad in ("0", "nan", "inf", "1.5"):
        with pytest.raises(ConfigError, match=f"capacity='{bad}'"):
            NodeConfig(capacity=bad).fixed_density  # noqa: B018
