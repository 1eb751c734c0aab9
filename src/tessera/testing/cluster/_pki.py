"""Certificates for a throw-away cluster, made fresh at every start.

One CA signs everything: the API server's serving certificate (so every kubeconfig can trust
it before the server has started), and a client certificate per identity. Kubernetes maps a
client certificate's CN to the user and each O to a group, which is how the admin gets
``system:masters``, the controller manager and scheduler get the users that RBAC's bootstrap
roles are bound to, and a kubelet gets ``system:node:NAME`` in ``system:nodes`` (what the Node
authorizer and NodeRestriction admission require). Keys are ECDSA P-256: every component
accepts them and they cost microseconds, not the tens of milliseconds an RSA key does.

``cryptography`` is a dev dependency, so it is imported here only, when a cluster starts.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import warnings
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)
_BACKDATE = datetime.timedelta(minutes=5)  # tolerate small clock skew between components


@dataclasses.dataclass(frozen=True)
class CertFiles:
    """PEM files of one certificate and its private key."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    # "EC PRIVATE KEY" (SEC 1), not PKCS#8: the API server's --service-account-key-file reads
    # public keys out of RSA/EC private-key PEM blocks, but not out of "PRIVATE KEY" ones.
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    # X.509 bounds a common name to 64 characters and cryptography checks it; a kubelet's is
    # system:node:<node>, and an autoscaler's node names can pass that (Go, which signs and
    # reads the cluster's certificates, has no such bound).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name,
                                             _validate=len(common_name) <= 64))
    return x509.Name(attributes)


class CertificateAuthority:
    """A CA whose key lives in memory; :meth:`issue` writes leaf certificates beside it."""

    def __init__(self, directory: Path, common_name: str = "tessera-test-ca") -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.files = CertFiles(self._dir / "ca.crt", self._dir / "ca.key")
        self.files.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, self.files.key)

    @property
    def pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, stem: str, common_name: str, *, organizations: tuple[str, ...] = (),
              server_hosts: tuple[str, ...] = ()) -> CertFiles:
        """Write ``STEM.crt``/``STEM.key``: a client certificate, or a serving one if
        ``server_hosts`` (DNS names or IP addresses) is given."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server_hosts else [
            ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if server_hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(h) for h in server_hosts]),
                critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        files = CertFiles(self._dir / f"{stem}.crt", self._dir / f"{stem}.key")
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, files.key)
        return files


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def write_signing_key(path: Path) -> Path:
    """The service-account token signing key (the API server reads its public half from the
    same PEM, so one file serves both flags)."""
    _write_key(_key(), path)
    return path
