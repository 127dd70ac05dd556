"""Client configuration with Kafka's dotted key names, validated once at construction."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kafka2pc.errors import ConfigError

_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")


def _servers(key: str, value: object) -> str:
    text = value if isinstance(value, str) else ",".join(value) if isinstance(value, list | tuple) else None
    if not text:
        raise ConfigError(key, "expected a non-empty 'host:port[,host:port...]' string")
    for server in text.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(key, f"{server.strip()!r} is not host:port")
    return text


def _text(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "expected a non-empty string")
    return value


def _positive_int(key: str, value: object) -> int:
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    if number is None or number <= 0:
        raise ConfigError(key, f"expected a positive integer, got {value!r}")
    return number


def _one_of(*choices: str) -> Callable[[str, object], str]:
    def parse(key: str, value: object) -> str:
        text = str(value).upper()
        if text not in choices:
            raise ConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return parse


def _hostname_check(key: str, value: object) -> bool:
    text = str(value).lower()
    if text not in ("https", "none", ""):
        raise ConfigError(key, f"expected 'https' or 'none', got {value!r}")
    return text == "https"


# dotted key -> (kafka-python keyword, parser)
CONNECTION_KEYS: Mapping[str, tuple[str, Callable[[str, object], Any]]] = MappingProxyType({
    "bootstrap.servers": ("bootstrap_servers", _servers),
    "client.id": ("client_id", _text),
    "security.protocol": ("security_protocol", _one_of(*_SECURITY_PROTOCOLS)),
    "sasl.mechanism": ("sasl_mechanism", _one_of(*_SASL_MECHANISMS)),
    "sasl.username": ("sasl_plain_username", _text),
    "sasl.password": ("sasl_plain_password", _text),
    "ssl.ca.location": ("ssl_cafile", _text),
    "ssl.certificate.location": ("ssl_certfile", _text),
    "ssl.key.location": ("ssl_keyfile", _text),
    "ssl.key.password": ("ssl_password", _text),
    "ssl.endpoint.identification.algorithm": ("ssl_check_hostname", _hostname_check),
    "request.timeout.ms": ("request_timeout_ms", _positive_int),
    "socket.connection.setup.timeout.ms": ("socket_connection_setup_timeout_ms", _positive_int),
})


def _read_only(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@attrs.frozen
class ClientConfig:
    """The connection settings of a Kafka client: where the cluster is and how to authenticate.

    Build it with :meth:`from_dict` from Kafka's dotted names (``bootstrap.servers``, ``security.protocol``, ``sasl.*``,
    ``ssl.*``, ``request.timeout.ms`` ...). Keys that belong to a higher layer (a producer's ``linger.ms``) are passed
    in ``consumed_elsewhere`` and ignored here; any other unknown key is a :class:`ConfigError` that names it.
    """

    bootstrap_servers: str
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=_read_only)

    @classmethod
    def from_dict(cls, config: Mapping[str, object], *, consumed_elsewhere: Collection[str] = ()) -> ClientConfig:
        """Validate ``config`` and return the connection part of it."""
        if "bootstrap.servers" not in config:
            raise ConfigError("bootstrap.servers", "is required")
        options: dict[str, Any] = {}
        for key, value in config.items():
            if key in consumed_elsewhere:
                continue
            spec = CONNECTION_KEYS.get(key)
            if spec is None:
                raise ConfigError(key, "unknown configuration key")
            name, parse = spec
            options[name] = parse(key, value)
        sasl = options.get("security_protocol", "PLAINTEXT").startswith("SASL")
        if sasl and "sasl_mechanism" not in options:
            raise ConfigError("sasl.mechanism", "is required when security.protocol is SASL_*")
        if not sasl and "sasl_mechanism" in options:
            raise ConfigError("sasl.mechanism", "is set but security.protocol is not SASL_PLAINTEXT or SASL_SSL")
        bootstrap = options.pop("bootstrap_servers")
        return cls(bootstrap_servers=bootstrap, options=options)

    @classmethod
    def for_bootstrap(cls, bootstrap_servers: str) -> ClientConfig:
        """A plaintext configuration for ``bootstrap_servers`` alone."""
        return cls.from_dict({"bootstrap.servers": bootstrap_servers})

    def kafka_python_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's clients."""
        return {"bootstrap_servers": self.bootstrap_servers.split(","), **self.options}
