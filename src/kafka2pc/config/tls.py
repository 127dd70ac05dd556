"""TLS settings from either client's keys, and the one SSL context (or librdkafka settings) they make.

The Java client's stores (``ssl.truststore.*``, ``ssl.keystore.*``) are read in PKCS12, JKS (the ``jks`` extra) or
PEM; the type is told by the file's first bytes, and a ``*.type`` that contradicts them is an error. Files are read
when a client is made, not when the configuration is validated: a Spark driver validates options whose files exist
only on the executors.
"""

from __future__ import annotations

import os
import re
import secrets
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from kafka2pc.config.redaction import Secret, reveal
from kafka2pc.errors import ConfigError

_JKS_MAGIC = b"\xfe\xed\xfe\xed"
_CERTIFICATE_BLOCK = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\s*", re.DOTALL)
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_contexts: dict[TlsSettings, ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


@attrs.frozen
class Identity:
    """A client certificate chain and its private key, both PEM."""

    chain_pem: str
    key_pem: Secret
    key_password: Secret | None = None


@attrs.frozen
class TlsSettings:
    """How a client checks the broker's certificate and proves its own."""

    verify: bool = True
    check_hostname: bool = True
    ca_location: str | None = None
    ca_pem: str | None = None
    truststore_location: str | None = None
    truststore_password: Secret | None = None
    truststore_type: str | None = None
    certificate_location: str | None = None
    certificate_pem: str | None = None
    key_location: str | None = None
    key_pem: Secret | None = None
    key_password: Secret | None = None
    keystore_location: str | None = None
    keystore_password: Secret | None = None
    keystore_type: str | None = None
    crl_location: str | None = None
    min_version: str = "TLSv1.2"
    max_version: str = "TLSv1.3"

    def __attrs_post_init__(self) -> None:
        trust = [k for k, v in (("ssl.ca.location", self.ca_location), ("ssl.ca.pem", self.ca_pem),
                                ("ssl.truststore.location", self.truststore_location)) if v is not None]
        if len(trust) > 1:
            raise ConfigError(trust[1], f"and {trust[0]} both name the trusted certificates: give one")
        if self.keystore_location is not None and (self.certificate_location or self.certificate_pem):
            raise ConfigError("ssl.keystore.location", "and ssl.certificate.* both name the client certificate")
        cert = self.certificate_location or self.certificate_pem
        key = self.key_location or self.key_pem
        if bool(cert) != bool(key):
            raise ConfigError("ssl.key.location" if cert else "ssl.certificate.location",
                              "is needed too: a client certificate goes with its private key")

    # -- reading the material -------------------------------------------------------------------------------------

    def trusted_pem(self) -> str | None:
        """The trusted CA certificates as PEM text, None for the system's defaults."""
        if self.ca_pem is not None:
            return self.ca_pem
        if self.ca_location is not None:
            return _read(self.ca_location, "ssl.ca.location").decode()
        if self.truststore_location is None:
            return None
        data = _read(self.truststore_location, "ssl.truststore.location")
        kind = _store_kind(data, self.truststore_type, "ssl.truststore")
        if kind == "PEM":
            return data.decode()
        password = _password_bytes(self.truststore_password)
        if kind == "JKS":
            return "".join(_pem_of_der(entry.cert) for entry in _jks(data, password, "ssl.truststore").certs.values())
        try:
            loaded = pkcs12.load_pkcs12(data, password)
        except ValueError as exc:
            raise ConfigError("ssl.truststore.password", f"cannot open the PKCS12 truststore ({exc})") from None
        certs = [c.certificate for c in loaded.additional_certs] + ([loaded.cert.certificate] if loaded.cert else [])
        return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)

    def identity(self) -> Identity | None:
        """The client certificate and key, None without one."""
        if self.keystore_location is not None:
            return self._keystore_identity()
        if not (self.certificate_location or self.certificate_pem):
            return None
        chain = self.certificate_pem or _read(str(self.certificate_location), "ssl.certificate.location").decode()
        key = self.key_pem or Secret(_read(str(self.key_location), "ssl.key.location").decode())
        return Identity(chain_pem=chain, key_pem=key, key_password=self.key_password)

    def _keystore_identity(self) -> Identity:
        data = _read(str(self.keystore_location), "ssl.keystore.location")
        kind = _store_kind(data, self.keystore_type, "ssl.keystore")
        if kind == "PEM":  # Java's PEM keystore: the key and the chain in one file
            text = data.decode()
            return Identity(chain_pem=_certificates_only(text), key_pem=Secret(text), key_password=self.key_password)
        store_password = _password_bytes(self.keystore_password)
        if kind == "JKS":
            keystore = _jks(data, store_password, "ssl.keystore")
            if len(keystore.private_keys) != 1:
                raise ConfigError("ssl.keystore.location", f"holds {len(keystore.private_keys)} private keys; "
                                                           "a client keystore holds one")
            entry = next(iter(keystore.private_keys.values()))
            if not entry.is_decrypted():
                entry.decrypt(reveal(self.key_password) if self.key_password else "")
            key = serialization.load_der_private_key(entry.pkey_pkcs8, None)
            chain = "".join(_pem_of_der(der) for _, der in entry.cert_chain)
        else:
            try:
                private_key, cert, extra = pkcs12.load_key_and_certificates(data, store_password)
            except ValueError as exc:
                raise ConfigError("ssl.keystore.password", f"cannot open the PKCS12 keystore ({exc})") from None
            if private_key is None or cert is None:
                raise ConfigError("ssl.keystore.location", "holds no private key with its certificate")
            key = private_key
            chain = "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in [cert, *extra])
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        return Identity(chain_pem=chain, key_pem=Secret(key_pem))

    # -- what clients take ------------------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """The SSL context for kafka-python (one per settings in a process)."""
        with _contexts_lock:
            context = _contexts.get(self)
        if context is None:
            context = self._new_context()
            with _contexts_lock:
                _contexts.setdefault(self, context)
        return context

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = _VERSIONS[self.min_version]
        context.maximum_version = _VERSIONS[self.max_version]
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context.check_hostname = self.check_hostname
            trusted = self.trusted_pem()
            try:
                context.load_verify_locations(cadata=trusted) if trusted else context.load_default_certs()
            except ssl.SSLError as exc:
                raise ConfigError("ssl.ca.location", f"holds no readable CA certificate ({exc.reason})") from None
            if self.crl_location is not None:
                context.load_verify_locations(cafile=self.crl_location)
                context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
        identity = self.identity()
        if identity is not None:
            _load_identity(context, identity)
        return context

    def librdkafka_config(self) -> dict[str, object]:
        """The same settings as librdkafka (confluent-kafka) keys, stores turned into PEM."""
        out: dict[str, object] = {
            "enable.ssl.certificate.verification": "true" if self.verify else "false",
            "ssl.endpoint.identification.algorithm": "https" if self.check_hostname else "none",
        }
        if self.ca_location is not None:
            out["ssl.ca.location"] = self.ca_location
        elif (trusted := self.trusted_pem()) is not None:
            out["ssl.ca.pem"] = trusted
        identity = self.identity()
        if identity is not None:
            out["ssl.certificate.pem"] = identity.chain_pem
            out["ssl.key.pem"] = identity.key_pem.reveal()
            if identity.key_password is not None:
                out["ssl.key.password"] = identity.key_password.reveal()
        if self.crl_location is not None:
            out["ssl.crl.location"] = self.crl_location
        return out


def _read(location: str, key: str) -> bytes:
    try:
        return Path(location).read_bytes()
    except OSError as exc:
        raise ConfigError(key, f"cannot read {location!r}: {exc.strerror}") from None


def _store_kind(data: bytes, declared: str | None, prefix: str) -> str:
    kind = "PEM" if b"-----BEGIN" in data[:4096] else "JKS" if data.startswith(_JKS_MAGIC) else "PKCS12"
    if declared is not None and declared.upper() != kind:
        raise ConfigError(f"{prefix}.type", f"says {declared} but {prefix}.location holds {kind}")
    return kind


def _password_bytes(password: Secret | None) -> bytes | None:
    return password.reveal().encode() if password is not None and password.reveal() else None


def _jks(data: bytes, password: bytes | None, prefix: str) -> Any:
    try:
        import jks  # type: ignore[import-untyped]  # noqa: PLC0415 - the optional "jks" extra
    except ImportError:
        raise ConfigError(f"{prefix}.location", "is a JKS store: install kafka2pc[jks] (pyjks), or convert it with "
                                                "keytool -importkeystore -deststoretype PKCS12") from None
    try:
        return jks.KeyStore.loads(data, (password or b"").decode())
    except jks.KeystoreSignatureException:
        raise ConfigError(f"{prefix}.password", "does not open the JKS store: the password is wrong, or the store "
                                                "is damaged") from None
    except Exception as exc:  # pyjks's other errors: a store it cannot read
        raise ConfigError(f"{prefix}.password", f"cannot open the JKS store ({type(exc).__name__})") from None


def _certificates_only(pem: str) -> str:
    return "".join(_CERTIFICATE_BLOCK.findall(pem))


def _pem_of_der(der: bytes) -> str:
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM).decode()


def _load_identity(context: ssl.SSLContext, identity: Identity) -> None:
    """Python's ssl loads a certificate chain only from files: the key goes to a private temporary file, encrypted
    with a one-time password, and both files are removed at once."""
    one_time = secrets.token_urlsafe(24)
    password = identity.key_password.reveal().encode() if identity.key_password else None
    try:
        key = serialization.load_pem_private_key(identity.key_pem.reveal().encode(), password)
    except (ValueError, TypeError) as exc:
        raise ConfigError("ssl.key.password", f"cannot open the client's private key ({exc})") from None
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(one_time.encode()))
    with tempfile.TemporaryDirectory(prefix="kafka2pc-tls-") as directory:
        chain_file, key_file = Path(directory) / "chain.pem", Path(directory) / "key.pem"
        for path, content in ((chain_file, identity.chain_pem.encode()), (key_file, encrypted)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(content)
        try:
            context.load_cert_chain(chain_file, key_file, password=one_time)
        except ssl.SSLError as exc:
            raise ConfigError("ssl.certificate.location", f"the client certificate does not match its key or "
                                                          f"cannot be read ({exc.reason})") from None
