"""Certificates and keys for the test control plane, made the way envtest makes them.

One CA signs the apiserver's serving certificate and every client certificate; the apiserver
trusts it for client authentication, so a user is just a certificate whose CN is the user name
and whose O entries are the groups (system:masters for the admin).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=7)
SERVING_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
SERVING_IPS = ("127.0.0.1", "10.0.0.1")


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organizations: list[str] | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations or []]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


class CertificateAuthority:
    """A throw-away CA living only as long as one control plane's run folder."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def create(cls) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name("dispatch-kubeflow-test-ca")
        cert = (
            _builder(name, name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
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
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> CertificateAuthority:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: expected an EC private key")
        return cls(cert, key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def _issue(self, builder: x509.CertificateBuilder, key: ec.EllipticCurvePrivateKey) -> KeyPair:
        cert = builder.add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        ).sign(self.key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def serving_pair(self) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVING_DNS_NAMES]
        alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVING_IPS]
        builder = (
            _builder(_name("kube-apiserver"), self.cert.subject, key.public_key())
            .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        )
        return self._issue(builder, key)

    def client_pair(self, user: str, groups: list[str]) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(_name(user, groups), self.cert.subject, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        return self._issue(builder, key)


def service_account_key_pem() -> bytes:
    """The key kube-apiserver signs service-account tokens with (and verifies them against)."""
    return _key_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
