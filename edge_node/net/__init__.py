"""Peer networking: the gRPC server and client of the model exchange, and its mutual TLS.

Discovery (mDNS / static peers) lives in ``edge_node.net.discovery``.
"""

from edge_node.net.client import PeerAddress, PeerInfo, PullResult, hello, open_channel, pull_model, pull_models
from edge_node.net.server import ModelSnapshot, PeerServer, ServerLimits, create_server
from edge_node.net.tls import TlsConfig, certificate_fingerprint, create_ca, issue_certificate

__all__ = [
    "ModelSnapshot",
    "PeerAddress",
    "PeerInfo",
    "PeerServer",
    "PullResult",
    "ServerLimits",
    "TlsConfig",
    "certificate_fingerprint",
    "create_ca",
    "create_server",
    "hello",
    "issue_certificate",
    "open_channel",
    "pull_model",
    "pull_models",
]
