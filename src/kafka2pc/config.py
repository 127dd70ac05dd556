"""Configuration with Kafka's dotted key names, validated once at construction: a client's connection settings
(:class:`ClientConfig`) and a producer's (:class:`ProducerConfig`), contradictions named."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kafka2pc.errors import ConfigError

_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
#: compression.type values (whether the codec's package is installed is checked when a producer is made)
COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")


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


def _one_of_lower(key: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


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
    "reconnect.backoff.ms": ("reconnect_backoff_ms", _positive_int),
    "reconnect.backoff.max.ms": ("reconnect_backoff_max_ms", _positive_int),
})
#: Kafka's Java client defaults where kafka-python's differ: its reconnect backoff grows to 30 s, so a client could
#: sit out a broker's restart for longer than max.block.ms
_JAVA_DEFAULTS = {"reconnect_backoff_ms": 50, "reconnect_backoff_max_ms": 1000}


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
        return {"bootstrap_servers": self.bootstrap_servers.split(","), **_JAVA_DEFAULTS, **self.options}


# -- the producer ---------------------------------------------------------------------------------------------------

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def _bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(key, f"expected true or false, got {value!r}")


def _int(key: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, f"expected an integer >= {minimum}, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value)
    else:
        raise ConfigError(key, f"expected an integer >= {minimum}, got {value!r}")
    if number < minimum:
        raise ConfigError(key, f"expected an integer >= {minimum}, got {value!r}")
    return number


PRODUCER_KEYS = frozenset({
    "transactional.id", "linger.ms", "batch.size", "compression.type", "transaction.timeout.ms",
    "delivery.timeout.ms", "max.block.ms", "retry.backoff.ms", "enable.idempotence", "acks",
    "max.in.flight.requests.per.connection", "transaction.two.phase.commit.enable", "max.request.size",
})


@attrs.frozen
class ProducerConfig:
    """Everything a :class:`~kafka2pc.TwoPhaseProducer` is configured with."""

    client: ClientConfig
    transactional_id: str
    two_phase_commit: bool
    linger_ms: int = 5
    #: below the broker's default message.max.bytes (1 048 588) with room for the 61-byte batch header
    batch_size: int = 1_000_000
    compression_name: str = "none"
    #: None: in fallback mode, use the broker's transaction.max.timeout.ms.
    transaction_timeout_ms: int | None = None
    delivery_timeout_ms: int = 120_000
    max_block_ms: int = 60_000
    retry_backoff_ms: int = 100
    #: the largest record (in a batch of its own) produce() accepts; Kafka's default
    max_request_size: int = 1_048_576

    @classmethod
    def from_dict(cls, config: Mapping[str, object], *, two_phase_commit: bool) -> ProducerConfig:
        """Validate ``config``; a ConfigError names the first bad, unknown or contradictory key."""
        client = ClientConfig.from_dict(config, consumed_elsewhere=PRODUCER_KEYS)
        txn_id = config.get("transactional.id")
        if not isinstance(txn_id, str) or not txn_id.strip():
            raise ConfigError("transactional.id", "is required and must be a non-empty string")
        if "enable.idempotence" in config and not _bool("enable.idempotence", config["enable.idempotence"]):
            raise ConfigError("enable.idempotence", "must be true: transactions need the idempotent producer")
        if "acks" in config and str(config["acks"]).strip().lower() not in ("all", "-1"):
            raise ConfigError("acks", f"must be all (or -1) for transactions, got {config['acks']!r}")
        if "max.in.flight.requests.per.connection" in config:
            _in_flight = _int("max.in.flight.requests.per.connection",
                              config["max.in.flight.requests.per.connection"], minimum=1)
            if _in_flight > 5:
                raise ConfigError("max.in.flight.requests.per.connection", "must be at most 5 with idempotence")
        if "transaction.two.phase.commit.enable" in config:
            configured = _bool("transaction.two.phase.commit.enable", config["transaction.two.phase.commit.enable"])
            if configured != two_phase_commit:
                raise ConfigError("transaction.two.phase.commit.enable",
                                  f"is {configured} but two_phase_commit={two_phase_commit} was passed")
        name = str(config.get("compression.type", "none")).lower()
        timeout = config.get("transaction.timeout.ms")
        batch_size = _int("batch.size", config.get("batch.size", 1_000_000), minimum=1)
        if batch_size > 64 * 1024 * 1024:
            raise ConfigError("batch.size", "must be at most 64 MiB")
        max_request_size = _int("max.request.size", config.get("max.request.size", 1_048_576), minimum=1)
        return cls(
            client=client,
            transactional_id=txn_id,
            two_phase_commit=two_phase_commit,
            linger_ms=_int("linger.ms", config.get("linger.ms", 5), minimum=0),
            batch_size=batch_size,
            compression_name=_one_of_lower("compression.type", name, COMPRESSION_TYPES),
            transaction_timeout_ms=None if timeout is None else _int("transaction.timeout.ms", timeout, minimum=1),
            delivery_timeout_ms=_int("delivery.timeout.ms", config.get("delivery.timeout.ms", 120_000), minimum=1),
            max_block_ms=_int("max.block.ms", config.get("max.block.ms", 60_000), minimum=1),
            retry_backoff_ms=_int("retry.backoff.ms", config.get("retry.backoff.ms", 100), minimum=0),
            max_request_size=max_request_size,
        )
