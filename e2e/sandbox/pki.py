"""Certificates and keys for the sandbox control plane.

One self-signed CA signs the API server's serving certificate and a client certificate for an
admin user in ``system:masters``; a separate RSA key pair signs service-account tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=30)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files the control plane components are started with."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _cert(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    signing_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    usages: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    """Generate a fresh CA, serving and admin certificates and service-account keys."""
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tidal-sandbox-ca")])
    ca_cert = _cert(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
        # The real node's bridge address, where the API server listens for pods (realnode.py).
        x509.IPAddress(ipaddress.ip_address("10.245.0.1")),
    ]
    serving_cert = _cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        ca_name,
        serving_key.public_key(),
        ca_key,
        ca=False,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )

    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin_cert = _cert(
        x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, "tidal-admin"),
            ]
        ),
        ca_name,
        admin_key.public_key(),
        ca_key,
        ca=False,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_pub = sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)

    return Pki(
        ca_cert=_write(directory / "ca.crt", ca_cert.public_bytes(pem)),
        ca_key=_write(directory / "ca.key", _key_pem(ca_key)),
        serving_cert=_write(directory / "apiserver.crt", serving_cert.public_bytes(pem)),
        serving_key=_write(directory / "apiserver.key", _key_pem(serving_key)),
        admin_cert=_write(directory / "admin.crt", admin_cert.public_bytes(pem)),
        admin_key=_write(directory / "admin.key", _key_pem(admin_key)),
        sa_key=_write(directory / "sa.key", _key_pem(sa_key)),
        sa_pub=_write(directory / "sa.pub", sa_pub),
    )


def issue_client_cert(pki: Pki, directory: Path, common_name: str, group: str) -> tuple[Path, Path]:
    """A client certificate for ``common_name`` in ``group``, signed by the sandbox CA: a node's
    identity (``system:node:<name>`` in ``system:nodes``), kube-proxy's (``system:kube-proxy``)."""
    pem = serialization.Encoding.PEM
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if group:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, group))
    cert = _cert(
        x509.Name(attrs),
        ca_cert.subject,
        key.public_key(),
        ca_key,
        ca=False,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    directory.mkdir(parents=True, exist_ok=True)
    stem = common_name.replace(":", "-")
    return (
        _write(directory / f"{stem}.crt", cert.public_bytes(pem)),
        _write(directory / f"{stem}.key", _key_pem(key)),
    )
