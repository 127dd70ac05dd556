"""A private CA and its certificates, made at test time: a broker certificate for 127.0.0.1, one that names another
host (for hostname-mismatch tests), a client certificate for mTLS, an unrelated CA, and the stores users hand to
clients (PEM files, PKCS12 and JKS made with the JDK's ``keytool``, as users make them)."""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import subprocess
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kafka2pc.testing.errors import HarnessSetupError
from kafka2pc.testing.jars import require_tool

_Key = ec.EllipticCurvePrivateKey


@attrs.frozen
class Pki:
    """Files of a test PKI. Every store is protected by :attr:`store_password`; the client's PEM key by
    :attr:`key_password`."""

    directory: Path
    ca_pem: Path
    other_ca_pem: Path
    client_cert_pem: Path
    client_key_pem: Path
    client_p12: Path
    client_jks: Path
    truststore_p12: Path
    truststore_jks: Path
    server_p12: Path
    wrong_host_p12: Path
    store_password: str = attrs.field(repr=False)
    key_password: str = attrs.field(repr=False)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kafka2pc tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, key: _Key, issuer: tuple[x509.Certificate, _Key] | None, *,
                 names: list[x509.GeneralName] | None = None, usage: x509.ObjectIdentifier | None = None
                 ) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signing_key = (issuer[0].subject, issuer[1]) if issuer else (_name(subject), key)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    if issuer is None:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _p12(path: Path, name: str, key: _Key, chain: list[x509.Certificate], password: str) -> Path:
    path.write_bytes(pkcs12.serialize_key_and_certificates(
        name.encode(), key, chain[0], chain[1:], serialization.BestAvailableEncryption(password.encode())))
    return path


def _keytool(*args: str) -> None:
    keytool = require_tool("keytool", "to make the JKS and PKCS12 trust stores that users make with it")
    done = subprocess.run([keytool, *args, "-noprompt"], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise HarnessSetupError(f"keytool {args[0]} failed: {done.stdout}{done.stderr}")


def make_pki(directory: Path) -> Pki:
    """Make a private CA and every certificate and store tests need in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    store_password, key_password = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("kafka2pc test CA", ca_key, None)
    other_ca = _certificate("an unrelated CA", other_key, None)
    local = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server_key, wrong_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    server = _certificate("127.0.0.1", server_key, (ca, ca_key), names=local,
                          usage=ExtendedKeyUsageOID.SERVER_AUTH)
    wrong_host = _certificate("kafka.invalid", wrong_key, (ca, ca_key), names=[x509.DNSName("kafka.invalid")],
                              usage=ExtendedKeyUsageOID.SERVER_AUTH)
    client = _certificate("alice", client_key, (ca, ca_key), usage=ExtendedKeyUsageOID.CLIENT_AUTH)

    ca_pem, other_ca_pem = directory / "ca.pem", directory / "other-ca.pem"
    ca_pem.write_bytes(_pem(ca))
    other_ca_pem.write_bytes(_pem(other_ca))
    client_cert_pem, client_key_pem = directory / "client.pem", directory / "client-key.pem"
    client_cert_pem.write_bytes(_pem(client) + _pem(ca))
    client_key_pem.write_bytes(client_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(key_password.encode())))
    client_key_pem.chmod(0o600)
    client_p12 = _p12(directory / "client.p12", "alice", client_key, [client, ca], store_password)
    client_jks = directory / "client.jks"
    _keytool("-importkeystore", "-srckeystore", str(client_p12), "-srcstoretype", "PKCS12",
             "-srcstorepass", store_password, "-destkeystore", str(client_jks), "-deststoretype", "JKS",
             "-deststorepass", store_password)
    stores = {}
    for store_type in ("PKCS12", "JKS"):
        stores[store_type] = directory / f"truststore.{store_type.lower().replace('pkcs12', 'p12')}"
        _keytool("-importcert", "-alias", "kafka2pc-test-ca", "-file", str(ca_pem), "-keystore",
                 str(stores[store_type]), "-storetype", store_type, "-storepass", store_password)
    return Pki(directory=directory, ca_pem=ca_pem, other_ca_pem=other_ca_pem, client_cert_pem=client_cert_pem,
               client_key_pem=client_key_pem, client_p12=client_p12, client_jks=client_jks,
               truststore_p12=stores["PKCS12"], truststore_jks=stores["JKS"],
               server_p12=_p12(directory / "server.p12", "broker", server_key, [server, ca], store_password),
               wrong_host_p12=_p12(directory / "wrong-host.p12", "broker", wrong_key, [wrong_host, ca],
                                   store_password),
               store_password=store_password, key_password=key_password)
