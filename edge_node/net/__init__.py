"""Peer networking: the gRPC server and client of the model exchange, and its mutual TLS.

Discovery (mDNS / static peers) lives in ``edge_node.net.discovery``. Names here are imported on
first use (PEP 562), so importing discovery alone does not load torch and grpc.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_node.net.client import (
        FAILURE_KINDS,
        PeerAddress,
        PeerHello,
        PullFailure,
        PullResult,
        hello,
        list_peers,
        open_channel,
        pull_model,
        pull_models,
    )
    from edge_node.net.server import REFUSAL_KINDS, ModelSnapshot, PeerServer, ServerLimits, create_server
    from edge_node.net.tls import TlsConfig, certificate_fingerprint, create_ca, issue_certificate

_EXPORTS = {
    "FAILURE_KINDS": "edge_node.net.client",
    "PullFailure": "edge_node.net.client",
    "REFUSAL_KINDS": "edge_node.net.server",
    "PeerHello": "edge_node.net.client",
    "PeerAddress": "edge_node.net.client",
    "PullResult": "edge_node.net.client",
    "hello": "edge_node.net.client",
    "list_peers": "edge_node.net.client",
    "open_channel": "edge_node.net.client",
    "pull_model": "edge_node.net.client",
    "pull_models": "edge_node.net.client",
    "ModelSnapshot": "edge_node.net.server",
    "PeerServer": "edge_node.net.server",
    "ServerLimits": "edge_node.net.server",
    "create_server": "edge_node.net.server",
    "TlsConfig": "edge_node.net.tls",
    "certificate_fingerprint": "edge_node.net.tls",
    "create_ca": "edge_node.net.tls",
    "issue_certificate": "edge_node.net.tls",
}

__all__ = [
    "FAILURE_KINDS",
    "REFUSAL_KINDS",
    "PeerHello",
    "PullFailure",
    "ModelSnapshot",
    "PeerAddress",
    "PeerServer",
    "PullResult",
    "ServerLimits",
    "TlsConfig",
    "certificate_fingerprint",
    "create_ca",
    "create_server",
    "hello",
    "issue_certificate",
    "list_peers",
    "open_channel",
    "pull_model",
    "pull_models",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edge_node.net' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
