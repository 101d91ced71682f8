"""One exception root for the whole package, so callers catch a single name."""

from __future__ import annotations


class EdgeNodeError(Exception):
    """Base class of every error edge-node raises on purpose."""


class ConfigError(EdgeNodeError, ValueError):
    """A setting or command-line value is invalid."""


class DataError(EdgeNodeError):
    """A data set is missing, corrupt or of the wrong layout."""


class ModelError(EdgeNodeError, ValueError):
    """An unknown model name or a model/weights mismatch."""


class WireDecodeError(EdgeNodeError, ValueError):
    """Bytes from a peer do not form a valid model stream."""


class WireLimitError(WireDecodeError):
    """A peer's stream exceeds a size, count or byte limit."""


class HeaderMismatch(WireDecodeError):
    """A peer's stream header is invalid or not what was asked for (fleet, architecture, version, round, density)."""


class TierMismatch(HeaderMismatch):
    """A peer's stream is of another tier mode than this node's (width tiers, protocol 1.5), or of a tier whose
    shapes it does not carry."""


class PeerIdentityMismatch(HeaderMismatch):
    """A peer's header or certificate names another node than the one pulled from."""


class PeerUnreachable(EdgeNodeError):
    """A peer did not deliver: no answer in time, a refusal or a TLS failure (``kind``: one of ``FAILURE_KINDS``).

    ``transient``: worth asking again later (a peer too busy for the call: RESOURCE_EXHAUSTED, such as
    its per-host rate), though its kind is a refusal.
    """

    def __init__(self, message: str, kind: str = "unreachable", *, transient: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.transient = transient


class DiscoveryError(EdgeNodeError):
    """mDNS or static discovery could not start or parse its input."""


class MeterUnavailable(EdgeNodeError):
    """The requested energy meter does not exist or cannot be read here."""


class CheckpointError(EdgeNodeError):
    """A checkpoint or run directory is missing, corrupt or incompatible."""


class TlsError(EdgeNodeError):
    """Certificates or keys are missing, invalid or not signed by the fleet CA."""


class TrainingDiverged(EdgeNodeError):
    """Local training produced a non-finite loss or weights (usually a learning rate too high)."""


class StorageError(EdgeNodeError):
    """State or results could not be written (disk full, read-only, no permission); what was saved before is intact."""


class ListenError(EdgeNodeError):
    """A server cannot listen on its address (in use, or not an address of this host)."""


class HandoverError(EdgeNodeError):
    """The model a node handed over (``STATE_DIR/handover/``) is absent, unreadable, or refuses an input."""
