"""Finding peers: mDNS/DNS-SD (python-zeroconf) on a LAN, or a static list where multicast does not pass.

Both implement :class:`Discovery`: ``start()``, ``stop()``, ``peers()``, ``update(round=, density=,
tier=)``, listeners and ``with`` support, over one live :class:`PeerTable` of :class:`PeerInfo`.
"""

from edge_node.net.discovery.mdns import (
    DEFAULT_MIN_UPDATE_INTERVAL_S,
    DEFAULT_TTL_S,
    SERVICE_TYPE,
    MdnsDiscovery,
    default_route_interfaces,
    resolve_interfaces,
)
from edge_node.net.discovery.peer_table import Discovery, PeerEvent, PeerInfo, PeerListener, PeerTable
from edge_node.net.discovery.static import StaticDiscovery, parse_peer, parse_peers, read_peers_file
from edge_node.net.discovery.txt import TXT_KEYS, TxtFields, encode_txt, parse_txt

__all__ = [
    "DEFAULT_MIN_UPDATE_INTERVAL_S",
    "DEFAULT_TTL_S",
    "SERVICE_TYPE",
    "TXT_KEYS",
    "Discovery",
    "MdnsDiscovery",
    "PeerEvent",
    "PeerInfo",
    "PeerListener",
    "PeerTable",
    "StaticDiscovery",
    "TxtFields",
    "default_route_interfaces",
    "encode_txt",
    "parse_peer",
    "parse_peers",
    "parse_txt",
    "read_peers_file",
    "resolve_interfaces",
]
