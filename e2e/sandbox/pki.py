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


def _new_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return key, _cert(name, name, key.public_key(), key, ca=True)


def make_pki(directory: Path) -> Pki:
    """Generate a fresh CA, serving and admin certificates and service-account keys."""
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM

    ca_key, ca_cert = _new_ca("tidal-sandbox-ca")
    ca_name = ca_cert.subject

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


def _issue(
    ca: tuple[Path, Path],
    directory: Path,
    stem: str,
    subject: x509.Name,
    usages: list[x509.ObjectIdentifier],
    sans: list[x509.GeneralName] | None = None,
) -> tuple[Path, Path]:
    """A certificate and key signed by the CA ``ca`` (its certificate and key files), written as
    ``<stem>.crt/.key``."""
    pem = serialization.Encoding.PEM
    ca_cert = x509.load_pem_x509_certificate(ca[0].read_bytes())
    ca_key = serialization.load_pem_private_key(ca[1].read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert(
        subject,
        ca_cert.subject,
        key.public_key(),
        ca_key,
        ca=False,
        usages=usages,
        sans=sans,
    )
    directory.mkdir(parents=True, exist_ok=True)
    return (
        _write(directory / f"{stem}.crt", cert.public_bytes(pem)),
        _write(directory / f"{stem}.key", _key_pem(key)),
    )


def issue_client_cert(pki: Pki, directory: Path, common_name: str, group: str) -> tuple[Path, Path]:
    """A client certificate for ``common_name`` in ``group``, signed by the sandbox CA: a node's
    identity (``system:node:<name>`` in ``system:nodes``), kube-proxy's (``system:kube-proxy``)."""
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if group:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, group))
    stem = common_name.replace(":", "-")
    return _issue(
        (pki.ca_cert, pki.ca_key),
        directory,
        stem,
        x509.Name(attrs),
        [ExtendedKeyUsageOID.CLIENT_AUTH],
    )


@dataclass(frozen=True)
class FrontProxy:
    """The aggregation layer's own CA and the API server's client certificate signed by it: the
    API server proxies requests for an APIService (metrics.k8s.io, external.metrics.k8s.io) to its
    extension server with this certificate, and the extension server trusts the user named in its
    headers because the CA is in ``kube-system/extension-apiserver-authentication``."""

    ca_cert: Path
    client_cert: Path
    client_key: Path
    client_name: str = "front-proxy-client"


def make_front_proxy(directory: Path) -> FrontProxy:
    """A separate CA (as kubeadm makes one) and the ``front-proxy-client`` certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_key, ca_cert = _new_ca("tidal-front-proxy-ca")
    ca = (
        _write(directory / "front-proxy-ca.crt", ca_cert.public_bytes(pem)),
        _write(directory / "front-proxy-ca.key", _key_pem(ca_key)),
    )
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "front-proxy-client")])
    cert, key = _issue(ca, directory, "front-proxy-client", name, [ExtendedKeyUsageOID.CLIENT_AUTH])
    return FrontProxy(ca_cert=ca[0], client_cert=cert, client_key=key)


def issue_serving_cert(pki: Pki, directory: Path, stem: str, hosts: list[str]) -> tuple[Path, Path]:
    """A certificate for server and client use (mutual TLS between two host processes, as KEDA's
    operator and its metrics adapter speak gRPC), for DNS names and IP addresses ``hosts``,
    signed by the sandbox CA."""
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, stem)]
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    return _issue((pki.ca_cert, pki.ca_key), directory, stem, x509.Name(attrs), usages, sans)
