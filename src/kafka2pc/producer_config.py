"""TwoPhaseProducer configuration: Kafka's dotted key names, validated once, contradictions named."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kafka2pc.config import ClientConfig
from kafka2pc.errors import ConfigError
from kafka2pc.records import compression_codec

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
    compression: int = 0
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
            compression=compression_codec(name),
            compression_name=name,
            transaction_timeout_ms=None if timeout is None else _int("transaction.timeout.ms", timeout, minimum=1),
            delivery_timeout_ms=_int("delivery.timeout.ms", config.get("delivery.timeout.ms", 120_000), minimum=1),
            max_block_ms=_int("max.block.ms", config.get("max.block.ms", 60_000), minimum=1),
            retry_backoff_ms=_int("retry.backoff.ms", config.get("retry.backoff.ms", 100), minimum=0),
            max_request_size=max_request_size,
        )
