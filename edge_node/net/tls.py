"""Mutual TLS for the peer service: a fleet CA, node certificates, fingerprints, gRPC credentials.

Every node holds the fleet CA certificate and its own certificate (subjectAltName DNS = its node id)
and key. Servers require a client certificate signed by the fleet CA; clients check that the server
presents a certificate of the same CA issued for the node id they meant to reach. Keys are ECDSA
P-256 (small and fast on a Raspberry Pi). Plaintext happens only when a caller passes
``insecure=True``, and is logged loudly.
"""

from __future__ import annotations

import datetime as dt
import errno
import functools
import hashlib
import logging
import os
import select
import socket
import ssl
import stat
import tempfile
import threading
import time
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edge_node.errors import ConfigError, TlsError
from edge_node.protocol import is_valid_fingerprint, is_valid_fleet_id, is_valid_node_id

_LOGGER = logging.getLogger(__name__)

DEFAULT_CA_DAYS = 3650
DEFAULT_CERT_DAYS = 825
_CLOCK_SKEW = dt.timedelta(minutes=5)  # certificates are valid from a little before "now"

# CA key types that sign node certificates with SHA-256 (Ed25519/Ed448 sign without a hash; X25519/X448/DH cannot
# sign; DSA is deprecated by cryptography, which warns on any use of its module, and TLS 1.3 has no DSA signatures).
_CA_KEY_TYPES = (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)

FINGERPRINT_CACHE_S = 300.0  # a fingerprint seen at (host, port, node) is trusted this long without a new handshake
_FINGERPRINT_CACHE_MAX = 1024  # entries; the oldest go first
_POLL_S = 0.1  # the pre-flight handshake checks for cancellation this often

_insecure_warned: set[str] = set()
_insecure_lock = threading.Lock()

Pem = bytes | str | os.PathLike


def check_node_name(node_id: str) -> str:
    """A node id usable as a certificate's DNS name (and thus as the TLS target name)."""
    if not is_valid_node_id(node_id):
        raise ConfigError(f"node id {node_id!r} must be 1-63 characters of [A-Za-z0-9_-], starting alphanumeric")
    return node_id


class CertificateMismatch(TlsError):
    """A peer presents another certificate than the fingerprint it advertised."""


def _load(kind: str, source: Pem) -> bytes:
    """PEM bytes as given, or read from a path (str / PathLike); a key file must be private to its owner."""
    if isinstance(source, bytes):
        return source
    if isinstance(source, str) and source.lstrip().startswith("-----BEGIN"):
        return source.encode()
    try:
        with open(source, "rb") as handle:
            if kind == "key":
                _check_private(os.fspath(source), os.fstat(handle.fileno()).st_mode)
            return handle.read()
    except OSError as exc:
        raise TlsError(f"cannot read the {kind} file {os.fspath(source)!r}: {exc.strerror}") from exc


def _check_private(path: str, mode: int) -> None:
    """Like ssh: a private key that group or others may read (or write) is refused, not used."""
    if stat.S_IMODE(mode) & 0o077:
        raise TlsError(
            f"the key file {path!r} has permissions {stat.S_IMODE(mode):04o}: group and others must have no"
            f" access to a private key; run chmod 600 {path!r}"
        )


def _parse_cert(kind: str, pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise TlsError(f"the {kind} is not a PEM certificate: {exc}") from exc


def certificate_fingerprint(cert_pem: bytes | str) -> str:
    """``"sha256:<hex>"`` of the certificate's DER bytes (advertised as TXT ``fp`` by discovery)."""
    pem = cert_pem.encode() if isinstance(cert_pem, str) else cert_pem
    cert = _parse_cert("certificate", pem)
    return "sha256:" + cert.fingerprint(hashes.SHA256()).hex()


def _check_validity(kind: str, cert: x509.Certificate, now: dt.datetime) -> None:
    if now < cert.not_valid_before_utc:
        raise TlsError(f"the {kind} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    if now > cert.not_valid_after_utc:
        raise TlsError(f"the {kind} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")


def _spki(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def dns_names(cert: x509.Certificate) -> list[str]:
    try:
        return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    except x509.ExtensionNotFound:
        return []


@dataclass(frozen=True)
class TlsConfig:
    """Fleet CA certificate, this node's certificate and its key (PEM bytes, or paths to read).

    Checked once when built: all three parse, the key belongs to the certificate, the certificate is
    signed by the CA and is valid now. Raises ``TlsError`` saying which of these failed.
    """

    ca_cert: bytes
    cert: bytes
    key: bytes

    def __post_init__(self) -> None:
        for kind, attr in (("CA certificate", "ca_cert"), ("certificate", "cert"), ("key", "key")):
            object.__setattr__(self, attr, _load(kind, getattr(self, attr)))
        ca = _parse_cert("CA certificate", self.ca_cert)
        cert = _parse_cert("certificate", self.cert)
        try:
            key = serialization.load_pem_private_key(self.key, password=None)
        except (ValueError, TypeError) as exc:
            raise TlsError(f"the key is not an unencrypted PEM private key: {exc}") from exc
        if _spki(key.public_key()) != _spki(cert.public_key()):
            raise TlsError("the key does not belong to the certificate")
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise TlsError(f"the certificate is not signed by the fleet CA ({ca.subject.rfc4514_string()})") from exc
        now = dt.datetime.now(dt.timezone.utc)
        _check_validity("CA certificate", ca, now)
        _check_validity("certificate", cert, now)

    @classmethod
    def from_files(cls, ca_cert: str | os.PathLike, cert: str | os.PathLike, key: str | os.PathLike) -> TlsConfig:
        return cls(_load("CA certificate", ca_cert), _load("certificate", cert), _load("key", key))

    @property
    def fingerprint(self) -> str:
        """This node's certificate fingerprint, ``"sha256:<hex>"``."""
        return certificate_fingerprint(self.cert)

    @property
    def node_names(self) -> list[str]:
        """The DNS names this node's certificate is issued for (its node id first)."""
        return dns_names(_parse_cert("certificate", self.cert))

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server side: present our certificate, require a client certificate of the fleet CA."""
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca_cert, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: trust only the fleet CA, present our certificate."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_cert, private_key=self.key, certificate_chain=self.cert
        )


def warn_insecure(role: str) -> None:
    """Log, once per process and role, that peer traffic is plaintext and unauthenticated."""
    with _insecure_lock:
        if role in _insecure_warned:
            return
        _insecure_warned.add(role)
    _LOGGER.warning(
        "INSECURE: the peer %s runs WITHOUT TLS (--insecure): models travel in plaintext and any host"
        " that can reach this port can pull or serve models. Use --tls-ca/--tls-cert/--tls-key on real networks.",
        role,
    )


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _subject_name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edge-node"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def create_ca(fleet_id: str, days: int = DEFAULT_CA_DAYS) -> tuple[bytes, bytes]:
    """A new fleet CA: ``(certificate PEM, private key PEM)``."""
    if not is_valid_fleet_id(fleet_id):
        raise ConfigError(f"fleet id {fleet_id!r} must be 1-63 characters of [A-Za-z0-9_-], starting alphanumeric")
    if not isinstance(days, int) or days < 1:
        raise ConfigError(f"days={days!r} must be a positive integer")
    key = _new_key()
    name = _subject_name(f"{fleet_id} fleet CA")
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def issue_certificate(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    node_id: str,
    days: int = DEFAULT_CERT_DAYS,
    extra_dns: tuple[str, ...] = (),
) -> tuple[bytes, bytes]:
    """A node certificate signed by the fleet CA, for server and client use: ``(cert PEM, key PEM)``.

    Its subjectAltName holds ``node_id`` (the name clients verify) and any ``extra_dns`` names.
    """
    check_node_name(node_id)
    for extra in extra_dns:
        check_node_name(extra)
    if not isinstance(days, int) or days < 1:
        raise ConfigError(f"days={days!r} must be a positive integer")
    ca = _parse_cert("CA certificate", ca_cert_pem)
    try:
        ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsError(f"the CA key is not an unencrypted PEM private key: {exc}") from exc
    if _spki(ca_key.public_key()) != _spki(ca.public_key()):
        raise TlsError("the CA key does not belong to the CA certificate")
    if not isinstance(ca_key, _CA_KEY_TYPES):
        name = type(ca_key).__name__
        raise TlsError(f"the CA key is a {name}, which cannot sign certificates with SHA-256 here (use EC or RSA)")
    key = _new_key()
    now = dt.datetime.now(dt.timezone.utc)
    names = [node_id, *[n for n in extra_dns if n != node_id]]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_subject_name(node_id))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(min(now + dt.timedelta(days=days), ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


@functools.lru_cache(maxsize=8)
def _client_context(tls: TlsConfig) -> ssl.SSLContext:
    """A client ``ssl`` context with this node's certificate that trusts only the fleet CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=tls.ca_cert.decode("ascii", "replace"))
    context.set_alpn_protocols(["h2"])  # what gRPC speaks; its servers may require it
    with tempfile.TemporaryDirectory(prefix="edge-node-tls-") as folder:  # ssl loads keys from files only
        cert_path, key_path = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        with open(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            handle.write(tls.key)
        with open(cert_path, "wb") as handle:
            handle.write(tls.cert)
        context.load_cert_chain(cert_path, key_path)
    return context


_fingerprint_cache: dict[tuple[str, int, str, str], float] = {}  # -> monotonic time it was verified
_fingerprint_lock = threading.Lock()


def _wait_socket(sock: socket.socket, *, read: bool, deadline: float, stop: threading.Event | None) -> None:
    while True:
        if stop is not None and stop.is_set():
            raise TlsError("cancelled")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TlsError("timed out")
        ready = select.select([sock] if read else [], [] if read else [sock], [], min(remaining, _POLL_S))
        if ready[0] or ready[1]:
            return


def presented_fingerprint(
    tls: TlsConfig, host: str, port: int, node_id: str, *, timeout_s: float, stop: threading.Event | None = None
) -> str:
    """Handshake with ``host:port`` as this fleet's client; the fingerprint of the certificate it presents.

    The certificate must be of the fleet CA and name ``node_id`` (as the gRPC channel checks). Bounded
    by ``timeout_s``, and ends within 0.1 s of ``stop`` being set.

    Raises:
        TlsError: no connection, the handshake failed or the certificate is not valid for ``node_id``.
    """
    deadline = time.monotonic() + timeout_s
    context = _client_context(tls)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise TlsError(f"cannot resolve {host!r}: {exc}") from exc
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as raw:
        raw.setblocking(False)
        code = raw.connect_ex(address)
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            raise TlsError(f"cannot connect to {host}:{port}: {os.strerror(code)}")
        _wait_socket(raw, read=False, deadline=deadline, stop=stop)
        code = raw.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise TlsError(f"cannot connect to {host}:{port}: {os.strerror(code)}")
        with context.wrap_socket(raw, server_hostname=node_id, do_handshake_on_connect=False) as wrapped:
            while True:
                try:
                    wrapped.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    _wait_socket(wrapped, read=True, deadline=deadline, stop=stop)
                except ssl.SSLWantWriteError:
                    _wait_socket(wrapped, read=False, deadline=deadline, stop=stop)
                except (ssl.SSLError, OSError) as exc:
                    raise TlsError(f"TLS handshake with {host}:{port} as {node_id!r} failed: {exc}") from exc
            der = wrapped.getpeercert(binary_form=True)
    if not der:
        raise TlsError(f"{host}:{port} presented no certificate")
    return "sha256:" + hashlib.sha256(der).hexdigest()


def verify_fingerprint(
    tls: TlsConfig,
    host: str,
    port: int,
    node_id: str,
    expected: str,
    *,
    timeout_s: float,
    stop: threading.Event | None = None,
) -> None:
    """Check that ``node_id`` at ``host:port`` presents the certificate whose fingerprint it advertised.

    gRPC gives a Python client no view of the server's certificate, so this makes its own bounded
    handshake (``presented_fingerprint``). A match is remembered for ``FINGERPRINT_CACHE_S`` per
    (host, port, node id, fingerprint). The gRPC connection that follows is a second handshake: it
    checks the CA and the name again, but a different certificate of the same CA for the same name
    in between (a fleet CA that issued two) would not be noticed.

    Raises:
        CertificateMismatch: another certificate, or ``expected`` is no ``sha256:<64 hex>`` fingerprint.
        TlsError: the handshake itself failed (see ``presented_fingerprint``).
    """
    wanted = expected.strip().lower() if isinstance(expected, str) else ""
    if not is_valid_fingerprint(wanted):
        raise CertificateMismatch(f"the advertised fingerprint {str(expected)[:80]!r} is not sha256:<64 hex digits>")
    key = (host, port, node_id, wanted)
    now = time.monotonic()
    with _fingerprint_lock:
        seen = _fingerprint_cache.get(key)
        if seen is not None and now - seen < FINGERPRINT_CACHE_S:
            return
    presented = presented_fingerprint(tls, host, port, node_id, timeout_s=timeout_s, stop=stop)
    if presented != wanted:
        raise CertificateMismatch(
            f"{node_id!r} at {host}:{port} presents certificate {presented}, but advertised {wanted}"
        )
    with _fingerprint_lock:
        _fingerprint_cache[key] = time.monotonic()
        while len(_fingerprint_cache) > _FINGERPRINT_CACHE_MAX:
            _fingerprint_cache.pop(next(iter(_fingerprint_cache)))


def forget_fingerprints() -> None:
    """Drop every remembered fingerprint check (tests; a node that rotated its certificates)."""
    with _fingerprint_lock:
        _fingerprint_cache.clear()
