"""kafka2pc: Apache Kafka as a correct two-phase-commit participant (KIP-939)."""

from __future__ import annotations

from kafka2pc.capabilities import BrokerCapabilities, probe_capabilities
from kafka2pc.config import ClientConfig
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    ConfigError,
    InvalidPreparedStateError,
    Kafka2pcError,
    KafkaProtocolError,
    ProducerFencedError,
    RecordTooLargeError,
    TransactionAbortableError,
    TransactionLostError,
    TransactionOutcomeUnknownError,
    TransactionStateError,
    UnsupportedByBrokerError,
)
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.producer import TransactionOutcome, TwoPhaseProducer
from kafka2pc.sink import TransactionNamingStrategy, abort_lingering

__version__ = "0.1.0.dev0"

__all__ = [
    "AuthorizationError",
    "BrokerCapabilities",
    "BrokerUnavailableError",
    "ClientConfig",
    "ConfigError",
    "InvalidPreparedStateError",
    "Kafka2pcError",
    "KafkaProtocolError",
    "PreparedTxnState",
    "ProducerFencedError",
    "RecordTooLargeError",
    "TransactionAbortableError",
    "TransactionLostError",
    "TransactionNamingStrategy",
    "TransactionOutcome",
    "TransactionOutcomeUnknownError",
    "TransactionStateError",
    "TwoPhaseProducer",
    "UnsupportedByBrokerError",
    "__version__",
    "abort_lingering",
    "probe_capabilities",
]
