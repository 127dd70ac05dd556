"""Trust stores as users hand them over: PEM, PKCS12 and JKS read alike; a wrong password or a wrong declared type
is a ConfigError naming the key, never the password."""

import datetime

import jks
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from kafka2pc.config import ClientConfig
from kafka2pc.errors import ConfigError

PASSWORD = "store-pw-77"


@pytest.fixture(scope="module")
def ca() -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "unit CA")])
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))


@pytest.fixture(scope="module")
def stores(ca, tmp_path_factory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("stores")
    der = ca.public_bytes(serialization.Encoding.DER)
    files = {"PEM": directory / "ca.pem", "PKCS12": directory / "trust.p12", "JKS": directory / "trust.jks"}
    files["PEM"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["PKCS12"].write_bytes(pkcs12.serialize_key_and_certificates(
        None, None, None, [ca], serialization.BestAvailableEncryption(PASSWORD.encode())))
    files["JKS"].write_bytes(jks.KeyStore.new("jks", [jks.TrustedCertEntry.new("ca", der)]).saves(PASSWORD))
    return {kind: str(path) for kind, path in files.items()}


def _tls(**keys: object):
    return ClientConfig.from_dict({"bootstrap.servers": "h:1", "security.protocol": "SSL", **keys}).tls


@pytest.mark.parametrize("kind", ["PEM", "PKCS12", "JKS"])
def test_every_store_kind_gives_the_same_trusted_certificate(ca, stores, kind):
    tls = _tls(**{"ssl.truststore.location": stores[kind], "ssl.truststore.password": PASSWORD})
    assert tls.trusted_pem().strip() == ca.public_bytes(serialization.Encoding.PEM).decode().strip()


@pytest.mark.parametrize("kind", ["PKCS12", "JKS"])
def test_a_wrong_store_password_names_the_key_not_the_password(stores, kind):
    tls = _tls(**{"ssl.truststore.location": stores[kind], "ssl.truststore.password": "not-it-99"})
    with pytest.raises(ConfigError) as info:
        tls.trusted_pem()
    assert info.value.key == "ssl.truststore.password" and "not-it-99" not in str(info.value)
    if kind == "JKS":
        assert "the password is wrong" in str(info.value)


def test_a_declared_type_that_is_not_the_files_is_named(stores):
    tls = _tls(**{"ssl.truststore.location": stores["PKCS12"], "ssl.truststore.password": PASSWORD,
                  "ssl.truststore.type": "JKS"})
    with pytest.raises(ConfigError) as info:
        tls.trusted_pem()
    assert info.value.key.startswith("ssl.truststore") and "PKCS12" in str(info.value)
