"""A client's connection settings, validated once: where the cluster is, how to authenticate, TLS, timeouts."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kafka2pc.config import keys, values
from kafka2pc.config.oauth import OAuthSettings, TokenSource
from kafka2pc.config.redaction import Secret, reveal
from kafka2pc.config.tls import TlsSettings
from kafka2pc.errors import ConfigError

_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "AWS_MSK_IAM", "GSSAPI")
_OIDC_HANDLERS = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
                  "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler")
_MSK_HANDLER = "software.amazon.msk.auth.iam.IAMClientCallbackHandler"

# kafka2pc key -> (kafka-python keyword, parser), for the settings that pass straight through
_PASSED: Mapping[str, tuple[str, Callable[[str, object], Any]]] = MappingProxyType({
    "client.id": ("client_id", values.text),
    "security.protocol": ("security_protocol", values.one_of(*_SECURITY_PROTOCOLS)),
    "sasl.mechanism": ("sasl_mechanism", values.one_of(*_SASL_MECHANISMS)),
    "sasl.username": ("sasl_plain_username", values.text),
    "sasl.password": ("sasl_plain_password", values.secret_text),
    "sasl.kerberos.service.name": ("sasl_kerberos_service_name", values.text),
    "sasl.kerberos.principal": ("sasl_kerberos_name", values.text),
    "request.timeout.ms": ("request_timeout_ms", values.positive),
    "socket.connection.setup.timeout.ms": ("socket_connection_setup_timeout_ms", values.positive),
    "reconnect.backoff.ms": ("reconnect_backoff_ms", values.positive),
    "reconnect.backoff.max.ms": ("reconnect_backoff_max_ms", values.positive),
    "connections.max.idle.ms": ("connections_max_idle_ms", values.positive),
    "metadata.max.age.ms": ("metadata_max_age_ms", values.positive),
    "client.dns.lookup": ("client_dns_lookup",
                          values.one_of("use_all_dns_ips", "resolve_canonical_bootstrap_servers_only", upper=False)),
})
_TLS_VERSIONS = ("TLSv1.2", "TLSv1.3")


def _read_only(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@attrs.frozen
class ClientConfig:
    """The connection settings of a Kafka client: where the cluster is and how to authenticate.

    Build it with :meth:`from_dict` from the keys users already write: confluent-kafka's (``sasl.mechanisms``,
    ``ssl.ca.location``, ``oauth_cb`` ...) or the Java client's (``sasl.jaas.config``, ``ssl.truststore.*`` ...);
    docs/configuration.md lists them. Keys of a higher layer (a producer's ``linger.ms``) are passed in
    ``consumed_elsewhere`` and ignored here. A key kafka2pc does not honour is a :class:`ConfigError` saying why.
    Secrets are held as :class:`~kafka2pc.config.Secret`: no ``repr`` shows them.
    """

    bootstrap_servers: str
    #: kafka-python keyword arguments (secrets still wrapped)
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=_read_only)
    tls: TlsSettings | None = None
    oauth: OAuthSettings | None = None
    kerberos_keytab: str | None = None

    @classmethod
    def from_dict(cls, config: Mapping[str, object], *, consumed_elsewhere: Collection[str] = ()) -> ClientConfig:
        """Validate ``config`` and return the connection part of it."""
        settings = keys.canonical(config)
        if "bootstrap.servers" not in settings:
            raise ConfigError("bootstrap.servers", "is required")
        ignored = set(consumed_elsewhere)
        options: dict[str, Any] = {}
        for key, (name, parse) in _PASSED.items():
            if key in settings:
                options[name] = parse(key, settings[key])
        protocol = options.get("security_protocol", "PLAINTEXT")
        mechanism = options.get("sasl_mechanism")
        sasl = protocol.startswith("SASL")
        if sasl and mechanism is None:
            raise ConfigError("sasl.mechanism", "is required when security.protocol is SASL_*")
        if not sasl and mechanism is not None:
            raise ConfigError("sasl.mechanism", "is set but security.protocol is not SASL_PLAINTEXT or SASL_SSL")
        if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            for key in ("sasl.username", "sasl.password"):
                if key not in settings:
                    raise ConfigError(key, f"is required with sasl.mechanism={mechanism} (or give sasl.jaas.config)")
        if not sasl:
            stray_sasl = next((key for key in ("sasl.username", "sasl.password") if key in settings), None)
            if stray_sasl is not None:
                raise ConfigError(stray_sasl, f"is a SASL setting but security.protocol is {protocol} (set "
                                              "SASL_SSL or SASL_PLAINTEXT, and sasl.mechanism)")
        _check_mechanism_support(mechanism, protocol, settings)
        tls = _tls(settings) if protocol.endswith("SSL") else None
        if tls is None and any(key.startswith("ssl.") or key.startswith("enable.ssl") for key in settings):
            stray = next(key for key in settings if key.startswith(("ssl.", "enable.ssl")))
            raise ConfigError(stray, f"is a TLS setting but security.protocol is {protocol}")
        oauth = _oauth(settings) if mechanism == "OAUTHBEARER" else None
        leftover = [key for key in settings if key.startswith(("sasl.oauthbearer", "oauth_cb", "_unsecured"))]
        if oauth is None and leftover:
            raise ConfigError(leftover[0], "is an OAUTHBEARER setting but sasl.mechanism is not OAUTHBEARER")
        unused = set(settings) - set(_PASSED) - _CONSUMED_HERE - ignored - {"bootstrap.servers"}
        if unused:
            key = sorted(unused)[0]
            raise ConfigError(key, "is a producer setting: it has no meaning here" if key in keys.PRODUCER_KEYS
                              else "has no meaning for a kafka2pc client")
        keytab = settings.get("sasl.kerberos.keytab")
        return cls(bootstrap_servers=values.servers("bootstrap.servers", settings["bootstrap.servers"]),
                   options=options, tls=tls, oauth=oauth, kerberos_keytab=None if keytab is None else str(keytab))

    @classmethod
    def for_bootstrap(cls, bootstrap_servers: str) -> ClientConfig:
        """A plaintext configuration for ``bootstrap_servers`` alone."""
        return cls.from_dict({"bootstrap.servers": bootstrap_servers})

    def revealed_options(self) -> dict[str, Any]:
        """:attr:`options` with secrets unwrapped, for the code that connects."""
        return {name: reveal(value) for name, value in self.options.items()}


def _check_mechanism_support(mechanism: str | None, protocol: str, settings: Mapping[str, object]) -> None:
    if mechanism == "AWS_MSK_IAM":
        if protocol != "SASL_SSL":
            raise ConfigError("security.protocol", "must be SASL_SSL with AWS_MSK_IAM (MSK's IAM listener is TLS)")
        if importlib.util.find_spec("botocore") is None:
            raise ConfigError("sasl.mechanism", "AWS_MSK_IAM needs botocore: pip install 'kafka2pc[aws]'")
    if mechanism == "GSSAPI" and importlib.util.find_spec("gssapi") is None:
        raise ConfigError("sasl.mechanism", "GSSAPI needs the gssapi package: pip install 'kafka2pc[gssapi]'")
    handler = settings.get("sasl.login.callback.handler.class")
    if handler is not None and str(handler).removeprefix(keys.SHADED_PREFIX) not in _OIDC_HANDLERS:
        raise ConfigError("sasl.login.callback.handler.class", "Java classes cannot run in kafka2pc; only "
                                                               "OAuthBearerLoginCallbackHandler (OIDC) is understood")
    client_handler = settings.get("sasl.client.callback.handler.class")
    if client_handler is not None and (str(client_handler).removeprefix(keys.SHADED_PREFIX) != _MSK_HANDLER
                                       or mechanism != "AWS_MSK_IAM"):
        raise ConfigError("sasl.client.callback.handler.class", "only MSK's IAMClientCallbackHandler, with "
                                                                "sasl.mechanism=AWS_MSK_IAM, is understood")


_CONSUMED_HERE = frozenset({
    "ssl.ca.location", "ssl.ca.pem", "ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type",
    "ssl.certificate.location", "ssl.certificate.pem", "ssl.key.location", "ssl.key.pem", "ssl.key.password",
    "ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.type", "ssl.crl.location",
    "enable.ssl.certificate.verification", "ssl.endpoint.identification.algorithm", "ssl.enabled.protocols",
    "ssl.protocol", "sasl.oauthbearer.method", "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.config", "oauth_cb", "sasl.login.refresh.window.factor", "sasl.login.callback.handler.class",
    "sasl.client.callback.handler.class", "sasl.kerberos.keytab", "_unsecured.sub", "_unsecured.lifetime.s",
})


def _optional_text(settings: Mapping[str, object], key: str) -> str | None:
    return None if key not in settings else values.text(key, settings[key])


def _secret(settings: Mapping[str, object], key: str) -> Secret | None:
    value = settings.get(key)
    return value if isinstance(value, Secret) or value is None else Secret(str(value))


def _store_type(settings: Mapping[str, object], key: str) -> str | None:
    return None if key not in settings else values.one_of("PKCS12", "JKS", "PEM")(key, settings[key])


def _tls(settings: Mapping[str, object]) -> TlsSettings:
    algorithm = str(settings.get("ssl.endpoint.identification.algorithm", "https")).strip().lower()
    if algorithm not in ("https", "none", ""):
        raise ConfigError("ssl.endpoint.identification.algorithm", f"expected https or none, got {algorithm!r}")
    low, high = _tls_versions(settings)
    for password, needs in (("ssl.truststore.password", ("ssl.truststore.location",)),
                            ("ssl.keystore.password", ("ssl.keystore.location",)),
                            ("ssl.key.password", ("ssl.key.location", "ssl.key.pem", "ssl.keystore.location"))):
        if password in settings and not any(key in settings for key in needs):
            raise ConfigError(password, f"is given without {' or '.join(needs)}: nothing would use it")
    key_pem = _secret(settings, "ssl.key.pem")
    return TlsSettings(
        verify=values.boolean("enable.ssl.certificate.verification",
                              settings.get("enable.ssl.certificate.verification", True)),
        check_hostname=algorithm == "https",
        ca_location=_optional_text(settings, "ssl.ca.location"),
        ca_pem=_optional_text(settings, "ssl.ca.pem"),
        truststore_location=_optional_text(settings, "ssl.truststore.location"),
        truststore_password=_secret(settings, "ssl.truststore.password"),
        truststore_type=_store_type(settings, "ssl.truststore.type"),
        certificate_location=_optional_text(settings, "ssl.certificate.location"),
        certificate_pem=_optional_text(settings, "ssl.certificate.pem"),
        key_location=_optional_text(settings, "ssl.key.location"),
        key_pem=key_pem,
        key_password=_secret(settings, "ssl.key.password"),
        keystore_location=_optional_text(settings, "ssl.keystore.location"),
        keystore_password=_secret(settings, "ssl.keystore.password"),
        keystore_type=_store_type(settings, "ssl.keystore.type"),
        crl_location=_optional_text(settings, "ssl.crl.location"),
        min_version=low, max_version=high,
    )


def _tls_versions(settings: Mapping[str, object]) -> tuple[str, str]:
    enabled = list(_TLS_VERSIONS)
    if "ssl.enabled.protocols" in settings:
        enabled = [p.strip() for p in str(settings["ssl.enabled.protocols"]).split(",") if p.strip()]
        bad = [p for p in enabled if p not in _TLS_VERSIONS]
        if bad or not enabled:
            raise ConfigError("ssl.enabled.protocols", f"expected TLSv1.2 and/or TLSv1.3, got {bad or enabled}")
    low = min(enabled)
    if "ssl.protocol" in settings:
        protocol = str(settings["ssl.protocol"]).strip()
        if protocol not in ("TLS", *_TLS_VERSIONS):
            raise ConfigError("ssl.protocol", f"expected TLS, TLSv1.2 or TLSv1.3, got {protocol!r}")
        low = max(low, "TLSv1.2" if protocol == "TLS" else protocol)
    return low, max(enabled)


def _oauth(settings: Mapping[str, object]) -> OAuthSettings:
    method = str(settings.get("sasl.oauthbearer.method", "")).strip().lower()
    if settings.get("sasl.login.callback.handler.class") is not None or "sasl.oauthbearer.client.id" in settings:
        method = method or "oidc"
    window = values.fraction(0.5, 1.0)("sasl.login.refresh.window.factor",
                                       settings.get("sasl.login.refresh.window.factor", 0.8))
    if method == "oidc":
        if settings.get("oauth_cb") is not None:
            raise ConfigError("oauth_cb", "and sasl.oauthbearer.method=oidc are two token sources: give one")
        for key in ("sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.client.id",
                    "sasl.oauthbearer.client.secret"):
            if key not in settings:
                raise ConfigError(key, "is required with sasl.oauthbearer.method=oidc")
        url = values.text("sasl.oauthbearer.token.endpoint.url", settings["sasl.oauthbearer.token.endpoint.url"])
        if not url.startswith(("https://", "http://")):
            raise ConfigError("sasl.oauthbearer.token.endpoint.url", "expected an http(s):// URL")
        client_id = values.text("sasl.oauthbearer.client.id", settings["sasl.oauthbearer.client.id"])
        return OAuthSettings(source=TokenSource.OIDC, token_endpoint_url=url, client_id=client_id,
                             client_secret=_secret(settings, "sasl.oauthbearer.client.secret"),
                             scope=_optional_text(settings, "sasl.oauthbearer.scope"),
                             extensions=_extensions(settings), refresh_window=window)
    if method not in ("", "default"):
        raise ConfigError("sasl.oauthbearer.method", f"expected default or oidc, got {method!r}")
    callback = settings.get("oauth_cb")
    if callback is not None:
        if not callable(callback):
            raise ConfigError("oauth_cb", "expected a callable: oauth_cb(config) -> (token, expiry_epoch_seconds)")
        return OAuthSettings(source=TokenSource.CALLBACK, callback=callback,
                             callback_config=_optional_text(settings, "sasl.oauthbearer.config"),
                             extensions=_extensions(settings), refresh_window=window)
    if "_unsecured.sub" in settings:
        lifetime = values.positive("unsecuredLoginLifetimeSeconds", settings.get("_unsecured.lifetime.s", 3600))
        return OAuthSettings(source=TokenSource.UNSECURED, unsecured_subject=str(settings["_unsecured.sub"]),
                             unsecured_lifetime_s=lifetime, extensions=_extensions(settings), refresh_window=window)
    raise ConfigError("sasl.mechanism", "OAUTHBEARER needs a token source: oauth_cb (a callable), "
                                        "sasl.oauthbearer.method=oidc with its token endpoint and client "
                                        "credentials, or sasl.jaas.config with OAuthBearerLoginModule")


def _extensions(settings: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    text = str(settings.get("sasl.oauthbearer.extensions", "")).strip()
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError("sasl.oauthbearer.extensions", "expected key=value[,key=value...]")
        pairs.append((name.strip(), value.strip()))
    return tuple(pairs)
