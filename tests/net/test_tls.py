"""Mutual TLS: certificates from `edge-node certs`, fleet-CA-only peers, fingerprints, refusals."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import NameOID

from edge_node.cli import app
from edge_node.errors import PeerUnreachable, TlsError
from edge_node.net import (
    ModelSnapshot,
    PeerAddress,
    PeerServer,
    TlsConfig,
    certificate_fingerprint,
    create_ca,
    create_server,
    hello,
    issue_certificate,
    pull_model,
    pull_models,
)
from edge_node.net import tls as tls_module
from edge_node.wire import ModelSpec
from edge_node.wire.messages import GET_MODEL_METHOD, GetModelRequest

SHAPES = {"fc.weight": (16, 32), "fc.bias": (16,)}
SPEC = ModelSpec("tls", 2, SHAPES)
FLEET = "fleet-1"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet CA and certificates for node-a and node-b, made with the CLI."""
    out = tmp_path_factory.mktemp("tls")
    runner = CliRunner()
    for args in (["init-ca", "--fleet", FLEET], ["issue", "node-a"], ["issue", "node-b"]):
        result = runner.invoke(app, ["certs", *args, "--dir", str(out)])
        assert result.exit_code == 0, result.output
    return out


def node_tls(fleet: Path, node: str) -> TlsConfig:
    return TlsConfig.from_files(fleet / "ca.pem", fleet / f"{node}.pem", fleet / f"{node}.key")


@contextlib.contextmanager
def tls_server(tls: TlsConfig) -> Iterator[int]:
    peer = PeerServer(SPEC, node_id="node-a", fleet_id=FLEET)
    gen = torch.Generator().manual_seed(0)
    weights = {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}
    masks = {n: torch.rand(s, generator=gen) < 0.5 for n, s in SHAPES.items()}
    density = sum(int(m.sum()) for m in masks.values()) / sum(m.numel() for m in masks.values())
    peer.publish(ModelSnapshot(weights, masks, 1, density, "node-a", FLEET, SPEC.arch_id))
    server, port = create_server("127.0.0.1:0", peer, tls=tls)
    server.start()
    try:
        yield port
    finally:
        server.stop(None).wait(5)


def raw_pull(port: int, credentials: grpc.ChannelCredentials | None, node_id: str = "node-b") -> grpc.StatusCode | None:
    """GetModel as ``node_id`` with hand-made credentials (None: plaintext); the status code, None on success."""
    options = [("grpc.ssl_target_name_override", "node-a")]
    target = f"127.0.0.1:{port}"
    channel = (
        grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials, options)
    )
    with channel:
        call = channel.unary_stream(
            GET_MODEL_METHOD, request_serializer=GetModelRequest.SerializeToString, response_deserializer=bytes
        )
        request = GetModelRequest(protocol_version="1.0", node_id=node_id, fleet_id=FLEET, arch_id=SPEC.arch_id)
        try:
            list(call(request, timeout=5))
        except grpc.RpcError as exc:
            return exc.code()
    return None


def test_certs_cli_writes_private_keys_and_prints_fingerprints(fleet: Path) -> None:
    assert stat.S_IMODE((fleet / "node-a.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((fleet / "ca.key").stat().st_mode) == 0o600
    pem = (fleet / "node-a.pem").read_bytes()
    result = CliRunner().invoke(app, ["certs", "fingerprint", str(fleet / "node-a.pem")])
    der = x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)
    assert result.exit_code == 0 and result.output.strip() == "sha256:" + hashlib.sha256(der).hexdigest()
    assert certificate_fingerprint(pem) == node_tls(fleet, "node-a").fingerprint == result.output.strip()
    assert node_tls(fleet, "node-a").node_names == ["node-a"]
    again = CliRunner().invoke(app, ["certs", "issue", "node-a", "--dir", str(fleet)])
    assert again.exit_code == 2 and "exists" in again.output


def test_mutual_tls_pull_between_fleet_nodes(fleet: Path) -> None:
    with tls_server(node_tls(fleet, "node-a")) as port:
        result = pull_models(
            [PeerAddress("node-a", "127.0.0.1", port)],
            SPEC,
            FLEET,
            tls=node_tls(fleet, "node-b"),
            deadline_s=5,
            retries=0,
        )
    assert list(result.received) == ["node-a"] and not result.failures


def test_clients_without_a_fleet_certificate_are_refused(fleet: Path) -> None:
    ca = (fleet / "ca.pem").read_bytes()
    other_ca, other_ca_key = create_ca("intruders")
    intruder_cert, intruder_key = issue_certificate(other_ca, other_ca_key, "node-b")
    with tls_server(node_tls(fleet, "node-a")) as port:
        no_cert = grpc.ssl_channel_credentials(root_certificates=ca)
        other_ca_cert = grpc.ssl_channel_credentials(ca, intruder_key, intruder_cert)
        assert raw_pull(port, no_cert) is grpc.StatusCode.UNAVAILABLE
        assert raw_pull(port, other_ca_cert) is grpc.StatusCode.UNAVAILABLE
        assert raw_pull(port, None) is grpc.StatusCode.UNAVAILABLE  # plaintext to a TLS port
        fleet_cert = grpc.ssl_channel_credentials(
            ca, (fleet / "node-b.key").read_bytes(), (fleet / "node-b.pem").read_bytes()
        )
        assert raw_pull(port, fleet_cert) is None  # and the server still serves its fleet
        # ... when the node id in the request is its certificate's: node-b cannot pull as node-c
        assert raw_pull(port, fleet_cert, node_id="node-c") is grpc.StatusCode.PERMISSION_DENIED
        assert raw_pull(port, fleet_cert, node_id="") is grpc.StatusCode.PERMISSION_DENIED


def test_client_refuses_server_of_another_node_or_ca(fleet: Path) -> None:
    other_ca, other_ca_key = create_ca("elsewhere")
    elsewhere = TlsConfig(other_ca, *issue_certificate(other_ca, other_ca_key, "node-a"))
    for server_tls, expected_name in ((node_tls(fleet, "node-b"), "node-a"), (elsewhere, "node-a")):
        with tls_server(server_tls) as port:
            result = pull_models(
                [PeerAddress(expected_name, "127.0.0.1", port)],
                SPEC,
                FLEET,
                tls=node_tls(fleet, "node-a"),
                deadline_s=10,
                retries=3,
                backoff_s=2.0,
            )
        failure = result.failures[expected_name]
        assert failure.detail.count("UNAVAILABLE") == 1 and "attempts" not in failure.detail  # not retried
        assert not result.received and failure.kind == "tls" and failure.detail.startswith("UNAVAILABLE"), failure


def test_tls_config_checks_material_up_front(fleet: Path, tmp_path: Path) -> None:
    other_ca, other_ca_key = create_ca("elsewhere")
    foreign_cert, foreign_key = issue_certificate(other_ca, other_ca_key, "node-a")
    ca = (fleet / "ca.pem").read_bytes()
    with pytest.raises(TlsError, match="not signed by the fleet CA"):
        TlsConfig(ca, foreign_cert, foreign_key)
    with pytest.raises(TlsError, match="key does not belong"):
        TlsConfig(ca, (fleet / "node-a.pem").read_bytes(), (fleet / "node-b.key").read_bytes())
    with pytest.raises(TlsError, match="cannot read the CA certificate file"):
        TlsConfig.from_files(tmp_path / "missing.pem", fleet / "node-a.pem", fleet / "node-a.key")
    with pytest.raises(TlsError, match="not a PEM certificate"):
        TlsConfig(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", foreign_cert, foreign_key)


def _self_signed_ca(key, algorithm) -> tuple[bytes, bytes]:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "other CA")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, algorithm)
    )  # fmt: skip
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return cert.public_bytes(Encoding.PEM), key_pem


def test_issue_needs_a_ca_key_that_signs_with_sha256() -> None:
    rsa_ca, rsa_key = _self_signed_ca(rsa.generate_private_key(public_exponent=65537, key_size=2048), hashes.SHA256())
    cert_pem, _key = issue_certificate(rsa_ca, rsa_key, "node-a")
    x509.load_pem_x509_certificate(cert_pem).verify_directly_issued_by(x509.load_pem_x509_certificate(rsa_ca))
    ed_ca, ed_key = _self_signed_ca(ed25519.Ed25519PrivateKey.generate(), None)
    with pytest.raises(TlsError, match="Ed25519PrivateKey, which cannot sign certificates with SHA-256"):
        issue_certificate(ed_ca, ed_key, "node-a")


def test_a_peer_reached_by_ip_address_is_verified_by_its_node_id(fleet: Path) -> None:
    # Static peers are configured by address (ID@HOST:PORT): the TLS name checked is the node id, never the host.
    with tls_server(node_tls(fleet, "node-a")) as port:
        model = pull_model(PeerAddress("node-a", "127.0.0.1", port), SPEC, FLEET, tls=node_tls(fleet, "node-b"))
        assert model.header.identity.node_id == "node-a"
        with pytest.raises(PeerUnreachable) as caught:  # a host:port entry has no node id to verify
            pull_model(PeerAddress(f"127.0.0.1:{port}", "127.0.0.1", port), SPEC, FLEET, tls=node_tls(fleet, "node-b"))
        assert caught.value.kind == "identity" and "Hello it first" in str(caught.value)


def test_advertised_fingerprint_is_checked_against_the_presented_certificate(fleet: Path, monkeypatch) -> None:
    handshakes = []
    real = tls_module.presented_fingerprint

    def counting(*args, **kwargs):
        handshakes.append(args[1:4])
        return real(*args, **kwargs)

    monkeypatch.setattr(tls_module, "presented_fingerprint", counting)
    tls_module.forget_fingerprints()
    client = node_tls(fleet, "node-b")
    right = certificate_fingerprint((fleet / "node-a.pem").read_bytes())
    wrong = certificate_fingerprint((fleet / "node-b.pem").read_bytes())
    with tls_server(node_tls(fleet, "node-a")) as port:
        good = PeerAddress("node-a", "127.0.0.1", port, expected_fingerprint=right)
        for _ in range(2):
            result = pull_models([good], SPEC, FLEET, tls=client, deadline_s=5)
            assert list(result.received) == ["node-a"], result.failures
        assert hello(good, tls=client).identity.node_id == "node-a"
        assert len(handshakes) == 1  # checked once, then remembered
        for advertised, words in ((wrong, "presents certificate " + right), ("sha256:zz", "not sha256:<64 hex")):
            peer = PeerAddress("node-a", "127.0.0.1", port, expected_fingerprint=advertised)
            start = time.monotonic()
            result = pull_models([peer], SPEC, FLEET, tls=client, deadline_s=5, retries=3)
            assert time.monotonic() - start < 2.0
            failure = result.failures["node-a"]
            assert failure.kind == "identity" and words in failure.detail, failure
            with pytest.raises(PeerUnreachable) as caught:
                hello(peer, tls=client)
            assert caught.value.kind == "identity"
    tls_module.forget_fingerprints()


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_private_key_readable_by_others_is_refused_like_ssh(fleet: Path, tmp_path: Path, mode: int) -> None:
    key = tmp_path / "node-a.key"
    shutil.copyfile(fleet / "node-a.key", key)
    key.chmod(mode)
    with pytest.raises(TlsError, match=f"permissions {mode:04o}.*chmod 600"):
        TlsConfig.from_files(fleet / "ca.pem", fleet / "node-a.pem", key)
    with pytest.raises(TlsError, match="chmod 600"):
        TlsConfig(fleet / "ca.pem", fleet / "node-a.pem", key)  # type: ignore[arg-type]
    key.chmod(0o600)
    assert TlsConfig.from_files(fleet / "ca.pem", fleet / "node-a.pem", key).node_names == ["node-a"]
