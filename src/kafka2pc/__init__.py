"""kafka2pc: Apache Kafka as a correct two-phase-commit participant (KIP-939).

The public API is what this module exports (the producer, the transaction control and the errors they raise), and
what the public packages and modules export: :mod:`kafka2pc.errors` (every error), :mod:`kafka2pc.config`,
:mod:`kafka2pc.transaction_control` (the values :class:`TransactionControl` returns), :mod:`kafka2pc.sink`,
:mod:`kafka2pc.spark`, :mod:`kafka2pc.dualwrite`, :mod:`kafka2pc.audit` and :mod:`kafka2pc.testing`; for someone
adding an engine, :mod:`kafka2pc.sink.integration`. ``tests/unit/public_api.txt`` pins it; docs/integration-api.md
describes it. Modules and packages whose names start with ``_`` are private. docs/design.md shows the layers.
"""

from __future__ import annotations

from kafka2pc.cluster import ClusterClient
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
    TransactionNotSettledError,
    TransactionOutcomeUnknownError,
    TransactionStateError,
    UnsupportedByBrokerError,
    UsageError,
)
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.producer import State, TransactionOutcome, TwoPhaseProducer
from kafka2pc.sink import abort_lingering
from kafka2pc.transaction_control import TransactionControl

__version__ = "0.1.0.dev0"

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BrokerUnavailableError",
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
    "ProducerFencedError",
    "RecordTooLargeError",
    "RetriableError",
    "State",
    "TokenEndpointError",
    "TransactionAbortableError",
    "TransactionControl",
    "TransactionLostError",
    "TransactionNotSettledError",
    "TransactionOutcome",
    "TransactionOutcomeUnknownError",
    "TransactionStateError",
    "TwoPhaseProducer",
    "UnsupportedByBrokerError",
    "UsageError",
    "__version__",
    "abort_lingering",
]
