"""``edge-node certs``: a fleet CA, node certificates for mutual TLS, and certificate fingerprints."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from edge_node.cli._app import app, fail

DEFAULT_DIR = Path("tls")


def _write(path: Path, data: bytes, *, private: bool, force: bool) -> None:
    """Write atomically (temp file, fsync, rename); keys are readable by the owner only."""
    if path.exists() and not force:
        raise fail(f"{path} exists; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise fail(f"cannot read the {what} {str(path)!r}: {exc.strerror}") from exc


@app.group()
def certs() -> None:
    """Mutual TLS material: a fleet CA signs one certificate per node (SAN = node id)."""


@certs.command("init-ca")
@click.option(
    "--dir",
    "out_dir",
    type=click.Path(path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help="Directory for ca.pem and ca.key.",
)
@click.option("--fleet", default="edge-node", show_default=True, help="Fleet id, written into the CA's name.")
@click.option("--days", default=3650, show_default=True, type=click.IntRange(min=1), help="Validity of the CA.")
@click.option("--force", is_flag=True, help="Replace an existing CA (every node certificate must be reissued).")
def init_ca(out_dir: Path, fleet: str, days: int, force: bool) -> None:
    """Create the fleet CA: DIR/ca.pem (give to every node) and DIR/ca.key (keep it off the fleet)."""
    from edge_node.net.tls import certificate_fingerprint, create_ca

    cert, key = create_ca(fleet, days)
    for name in ("ca.pem", "ca.key"):
        if (out_dir / name).exists() and not force:
            raise fail(f"{out_dir / name} exists; pass --force to replace it")
    _write(out_dir / "ca.key", key, private=True, force=force)
    _write(out_dir / "ca.pem", cert, private=False, force=force)
    print(f"CA certificate: {out_dir / 'ca.pem'}")
    print(f"CA key:         {out_dir / 'ca.key'} (mode 0600)")
    print(f"fingerprint:    {certificate_fingerprint(cert)}")


@certs.command("issue")
@click.argument("node")
@click.option(
    "--dir",
    "ca_dir",
    type=click.Path(path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help="Directory holding ca.pem and ca.key.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Directory for NODE.pem and NODE.key [default: --dir].",
)
@click.option(
    "--days", default=825, show_default=True, type=click.IntRange(min=1), help="Validity (capped by the CA's)."
)
@click.option("--dns", "extra_dns", multiple=True, help="Another DNS name for the certificate (repeatable).")
@click.option("--force", is_flag=True, help="Replace an existing certificate and key.")
def issue(node: str, ca_dir: Path, out_dir: Path | None, days: int, extra_dns: tuple[str, ...], force: bool) -> None:
    """Issue NODE's certificate and key, signed by the fleet CA (NODE is the node id peers verify)."""
    from edge_node.net.tls import certificate_fingerprint, issue_certificate

    out_dir = out_dir or ca_dir
    ca_cert = _read(ca_dir / "ca.pem", "CA certificate")
    ca_key = _read(ca_dir / "ca.key", "CA key")
    cert, key = issue_certificate(ca_cert, ca_key, node, days, tuple(extra_dns))
    for name in (f"{node}.pem", f"{node}.key"):
        if (out_dir / name).exists() and not force:
            raise fail(f"{out_dir / name} exists; pass --force to replace it")
    _write(out_dir / f"{node}.key", key, private=True, force=force)
    _write(out_dir / f"{node}.pem", cert, private=False, force=force)
    print(f"certificate: {out_dir / f'{node}.pem'}")
    print(f"key:         {out_dir / f'{node}.key'} (mode 0600)")
    print(f"fingerprint: {certificate_fingerprint(cert)}")


@certs.command("fingerprint")
@click.argument("cert", type=click.Path(path_type=Path))
def fingerprint(cert: Path) -> None:
    """Print CERT's fingerprint as discovery advertises it (TXT fp): sha256:<hex of the DER>."""
    from edge_node.net.tls import certificate_fingerprint

    print(certificate_fingerprint(_read(cert, "certificate")))
