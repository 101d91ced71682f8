"""Finding peers: mDNS/DNS-SD (python-zeroconf) on a LAN, or a static list where multicast does not pass.

Both implement :class:`Discovery`: ``start()``, ``stop()``, ``peers()``, ``update(round=, density=,
tier=)``, ``record_pull(node_id, ok)`` (the node calls it after every pull), ``refusals()`` (what a
hostile or misconfigured network sent that was refused, by reason), listeners and ``with`` support,
over one live :class:`PeerTable` of :class:`PeerInfo`. mDNS discovery is bounded (``max_peers``,
``max_pending``, a global query budget, an address policy): see :mod:`edge_node.net.discovery.peer_book`.
Peer exchange (:mod:`edge_node.net.discovery.exchange`, protocol 1.4) is a third discovery: it learns, over the
other two, the peers their peers reached, and lists those it verified itself.
"""

from edge_node.net.discovery.bounds import REFUSAL_REASONS, AddressPolicy, RefusalCounter, TokenBucket
from edge_node.net.discovery.mdns import (
    DEFAULT_MIN_UPDATE_INTERVAL_S,
    DEFAULT_TTL_S,
    SERVICE_TYPE,
    MdnsDiscovery,
    default_route_interfaces,
    resolve_interfaces,
)
from edge_node.net.discovery.peer_book import (
    DEFAULT_MAX_PEERS,
    DEFAULT_MAX_PENDING,
    DEFAULT_QUERY_BURST,
    DEFAULT_QUERY_RATE,
    BookLimits,
    PeerBook,
)
from edge_node.net.discovery.peer_table import Discovery, PeerEvent, PeerInfo, PeerListener, PeerTable
from edge_node.net.discovery.static import StaticDiscovery, StaticPeer, parse_peer, parse_peers, read_peers_file
from edge_node.net.discovery.txt import TXT_KEYS, TxtFields, encode_txt, parse_txt

__all__ = [
    "DEFAULT_MAX_PEERS",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_MIN_UPDATE_INTERVAL_S",
    "DEFAULT_QUERY_BURST",
    "DEFAULT_QUERY_RATE",
    "DEFAULT_TTL_S",
    "REFUSAL_REASONS",
    "SERVICE_TYPE",
    "TXT_KEYS",
    "AddressPolicy",
    "BookLimits",
    "Discovery",
    "MdnsDiscovery",
    "PeerBook",
    "PeerEvent",
    "PeerInfo",
    "PeerListener",
    "PeerTable",
    "RefusalCounter",
    "StaticDiscovery",
    "StaticPeer",
    "TokenBucket",
    "TxtFields",
    "default_route_interfaces",
    "encode_txt",
    "parse_peer",
    "parse_peers",
    "parse_txt",
    "read_peers_file",
    "resolve_interfaces",
]
