"""A producer's settings: its connection plus batching, timeouts and the transaction's own keys."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kafka2pc.config import keys, values
from kafka2pc.config.client import ClientConfig
from kafka2pc.errors import ConfigError

#: compression.type values (whether the codec's package is installed is checked when a producer is made)
COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")
PRODUCER_KEYS = keys.PRODUCER_KEYS


def max_block_ms(config: Mapping[str, object]) -> int:
    """The ``max.block.ms`` of ``config`` (under any of its names), 60 s by default: how long a client made for it
    may wait for a broker."""
    return _max_block_ms(keys.canonical(config))


def _max_block_ms(settings: Mapping[str, object]) -> int:
    """:func:`max_block_ms` of settings already in kafka2pc's spelling (read again, sasl.jaas.config's expansion
    would be refused: it is not a user's key)."""
    return values.positive("max.block.ms", settings.get("max.block.ms", 60_000))


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
        settings = keys.canonical(config)
        txn_id = settings.get("transactional.id")
        if not isinstance(txn_id, str) or not txn_id.strip():
            raise ConfigError("transactional.id", "is required and must be a non-empty string")
        if "enable.idempotence" in settings and not values.boolean("enable.idempotence",
                                                                   settings["enable.idempotence"]):
            raise ConfigError("enable.idempotence", "must be true: transactions need the idempotent producer")
        if "acks" in settings and str(settings["acks"]).strip().lower() not in ("all", "-1"):
            raise ConfigError("acks", f"must be all (or -1) for transactions, got {settings['acks']!r}")
        if "max.in.flight.requests.per.connection" in settings:
            in_flight = values.positive("max.in.flight.requests.per.connection",
                                        settings["max.in.flight.requests.per.connection"])
            if in_flight > 5:
                raise ConfigError("max.in.flight.requests.per.connection", "must be at most 5 with idempotence")
        if "transaction.two.phase.commit.enable" in settings:
            configured = values.boolean("transaction.two.phase.commit.enable",
                                        settings["transaction.two.phase.commit.enable"])
            if configured != two_phase_commit:
                raise ConfigError("transaction.two.phase.commit.enable",
                                  f"is {configured} but two_phase_commit={two_phase_commit} was passed")
        timeout = settings.get("transaction.timeout.ms")
        batch_size = values.positive("batch.size", settings.get("batch.size", 1_000_000))
        if batch_size > 64 * 1024 * 1024:
            raise ConfigError("batch.size", "must be at most 64 MiB")
        return cls(
            client=client,
            transactional_id=txn_id,
            two_phase_commit=two_phase_commit,
            linger_ms=values.non_negative("linger.ms", settings.get("linger.ms", 5)),
            batch_size=batch_size,
            compression_name=values.one_of(*COMPRESSION_TYPES, upper=False)(
                "compression.type", settings.get("compression.type", "none")),
            transaction_timeout_ms=None if timeout is None else values.positive("transaction.timeout.ms", timeout),
            delivery_timeout_ms=values.positive("delivery.timeout.ms", settings.get("delivery.timeout.ms", 120_000)),
            max_block_ms=_max_block_ms(settings),
            retry_backoff_ms=values.non_negative("retry.backoff.ms", settings.get("retry.backoff.ms", 100)),
            max_request_size=values.positive("max.request.size", settings.get("max.request.size", 1_048_576)),
        )
