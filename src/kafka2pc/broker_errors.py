"""Kafka error codes that kafka2pc's producer treats specially, and how each is classified."""

from __future__ import annotations

import enum

import kafka.errors as kafka_errors

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = kafka_errors.UnknownTopicOrPartitionError.errno
UNSUPPORTED_VERSION = kafka_errors.UnsupportedVersionError.errno
INVALID_PRODUCER_EPOCH = kafka_errors.InvalidProducerEpochError.errno
INVALID_TXN_STATE = kafka_errors.InvalidTxnStateError.errno
INVALID_TRANSACTION_TIMEOUT = kafka_errors.InvalidTransactionTimeoutError.errno
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = kafka_errors.TransactionalIdAuthorizationFailedError.errno
TOPIC_AUTHORIZATION_FAILED = kafka_errors.TopicAuthorizationFailedError.errno
DUPLICATE_SEQUENCE_NUMBER = kafka_errors.DuplicateSequenceNumberError.errno
PRODUCER_FENCED = kafka_errors.ProducerFencedError.errno
TRANSACTIONAL_ID_NOT_FOUND = kafka_errors.TransactionalIdNotFoundError.errno
INVALID_PRODUCER_ID_MAPPING = kafka_errors.InvalidProducerIdMappingError.errno
CONCURRENT_TRANSACTIONS = kafka_errors.ConcurrentTransactionsError.errno
COORDINATOR_LOAD_IN_PROGRESS = kafka_errors.CoordinatorLoadInProgressError.errno
COORDINATOR_NOT_AVAILABLE = kafka_errors.CoordinatorNotAvailableError.errno
NOT_COORDINATOR = kafka_errors.NotCoordinatorError.errno
MESSAGE_TOO_LARGE = kafka_errors.MessageSizeTooLargeError.errno
RECORD_LIST_TOO_LARGE = kafka_errors.RecordListTooLargeError.errno

#: Error codes after which a request to a transaction coordinator is sent again, to a freshly looked-up coordinator.
COORDINATOR_RETRIABLE = frozenset({COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
                                   CONCURRENT_TRANSACTIONS})


def error_name(code: int) -> str:
    """Kafka's name for an error code, e.g. ``UNSUPPORTED_VERSION``."""
    return str(getattr(kafka_errors.for_code(code), "message", f"ERROR_{code}"))


class ProduceErrorKind(enum.Enum):
    """What a partition-level Produce error means for the batch and the transaction."""

    DONE = "written"
    RETRY = "send the same batch again (same sequence) after a metadata refresh"
    FENCED = "another producer owns the transactional id"
    UNAUTHORIZED = "an ACL is missing"
    ABORTABLE = "the transaction cannot commit"


_RETRIABLE_PRODUCE = frozenset({
    kafka_errors.NotLeaderForPartitionError.errno,
    kafka_errors.LeaderNotAvailableError.errno,
    kafka_errors.NotEnoughReplicasError.errno,
    kafka_errors.NotEnoughReplicasAfterAppendError.errno,
    kafka_errors.RequestTimedOutError.errno,
    kafka_errors.UnknownTopicOrPartitionError.errno,
    kafka_errors.ConcurrentTransactionsError.errno,
    kafka_errors.NetworkExceptionError.errno,
    kafka_errors.KafkaStorageError.errno,
    kafka_errors.FencedLeaderEpochError.errno,
    kafka_errors.UnknownLeaderEpochError.errno,
    kafka_errors.CoordinatorLoadInProgressError.errno,
    kafka_errors.CoordinatorNotAvailableError.errno,
    kafka_errors.NotCoordinatorError.errno,
})


def classify_produce_error(code: int) -> ProduceErrorKind:
    """How to treat a partition-level error code from a Produce response."""
    if code in (NONE, DUPLICATE_SEQUENCE_NUMBER):
        return ProduceErrorKind.DONE
    if code in _RETRIABLE_PRODUCE:
        return ProduceErrorKind.RETRY
    if code in (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH):
        return ProduceErrorKind.FENCED
    if code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return ProduceErrorKind.UNAUTHORIZED
    return ProduceErrorKind.ABORTABLE
