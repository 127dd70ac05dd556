"""kafka2pc: Apache Kafka as a correct two-phase-commit participant (KIP-939).

The public API is what this module exports, and the subpackages :mod:`kafka2pc.sink`, :mod:`kafka2pc.spark`,
:mod:`kafka2pc.dualwrite`, :mod:`kafka2pc.audit` and :mod:`kafka2pc.testing`. Modules and packages whose names start
with ``_`` are private. docs/design.md shows the layers.
"""

from __future__ import annotations

from kafka2pc.capabilities import BrokerCapabilities, probe_capabilities
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig, ProducerConfig
from kafka2pc.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerUnavailableError,
    ConfigError,
    DecidedNotCompletedError,
    FatalError,
    IncompleteListingError,
    InvalidPreparedStateError,
    Kafka2pcError,
    KafkaProtocolError,
    OutcomeUnknownError,
    ProducerFencedError,
    RecordTooLargeError,
    RetriableError,
    TokenEndpointError,
    TransactionAbortableError,
    TransactionLostError,
    TransactionOutcomeUnknownError,
    TransactionStateError,
    UnsupportedByBrokerError,
    UsageError,
)
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.producer import State, TransactionOutcome, TwoPhaseProducer
from kafka2pc.sink import TransactionNamingStrategy, abort_lingering
from kafka2pc.transaction_control import TransactionControl

__version__ = "0.1.0.dev0"

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BrokerCapabilities",
    "BrokerUnavailableError",
    "ClientConfig",
    "ClusterClient",
    "ConfigError",
    "DecidedNotCompletedError",
    "FatalError",
    "IncompleteListingError",
    "InvalidPreparedStateError",
    "Kafka2pcError",
    "KafkaProtocolError",
    "OutcomeUnknownError",
    "PreparedTxnState",
    "ProducerConfig",
    "ProducerFencedError",
    "RecordTooLargeError",
    "RetriableError",
    "State",
    "TokenEndpointError",
    "TransactionAbortableError",
    "TransactionControl",
    "TransactionLostError",
    "TransactionNamingStrategy",
    "TransactionOutcome",
    "TransactionOutcomeUnknownError",
    "TransactionStateError",
    "TwoPhaseProducer",
    "UnsupportedByBrokerError",
    "UsageError",
    "__version__",
    "abort_lingering",
    "probe_capabilities",
]
