"""Kafka's error codes, and their one classification: what each kind of code says about the request that got it.

What to *do* about a kind is the deciding machine's business (a fenced Produce is fatal; a fenced EndTxn is looked
into, since it may be a retry of an end that succeeded), so this module only names the kinds. Every answer's code is
read through :func:`kind`, never compared raw: a code missing from the table is :attr:`Kind.OTHER`, which every
caller treats as "failed, for a reason kafka2pc does not know".

How to add a code (e.g. a new retriable one a broker version starts answering):

1. Give it a constant here only if the code base must *send* or *build* it (a test, the coordinator model), or if
   kafka-python's ``kafka.errors`` does not know the code yet (then its number, with the KIP that added it);
   otherwise classifying needs none.
2. Add it to ``_KINDS`` under the kind that says what it means for the request. A coordinator that moved, loads or
   is busy is :attr:`Kind.COORDINATOR_BUSY`: every coordinator command that may be repeated is then sent again
   with backoff (:mod:`kafka2pc._core.resend`, under :data:`~kafka2pc._core.retry.COORDINATOR_RETRY`); a
   partition that cannot take a write yet is :attr:`Kind.PARTITION_BUSY`: the data plane sends the batch again
   (:mod:`kafka2pc._data.sender`, under its :class:`~kafka2pc._core.retry.Retry`); a broker that gave up waiting
   before the request completed is :attr:`Kind.TIMED_OUT`: both do as for their own busy kind (a resend-safe
   coordinator command is sent again, a batch is sent again). A new kind needs a decision in every machine that
   matches on kinds (grep ``Kind.``).
3. Add a row to ``tests/unit/core/test_codes.py::test_kinds`` (the code and its kind), and a test of the machine
   whose decision it changes (``docs/decisions.md`` names each one).
"""

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
REQUEST_TIMED_OUT = kafka_errors.RequestTimedOutError.errno


class Kind(enum.Enum):
    """What an error code says about the request that got it."""

    DONE = "no error: the request took effect"
    DUPLICATE = "a Produce whose batch the broker already has (it was sent again after it landed): done"
    COORDINATOR_BUSY = ("the transaction coordinator moved, is loading, or is busy with an earlier request of the "
                        "id: ask again, at the coordinator looked up afresh (it may have acted first)")
    PARTITION_BUSY = "the partition's leader moved or could not write yet: send the same batch again"
    TIMED_OUT = ("the broker gave up waiting before the request completed (on replicas, or on the controller for a "
                 "block of producer ids): it may or may not have taken effect; ask again where asking again is safe")
    UNKNOWN_TOPIC = ("the broker does not know the topic or partition (yet): a Produce sends the batch again; a "
                     "metadata read reports the topic absent")
    UNKNOWN_ID = "the coordinator does not know the transactional id (never used on this cluster, or expired)"
    FENCED = "a newer producer owns the transactional id, or the epoch moved on"
    STALE = "the transaction is not in the state the request assumed (it may have ended, or never started)"
    UNAUTHORIZED = "the principal lacks an ACL on the transactional id"
    TIMEOUT_REFUSED = "the transaction timeout asked for is above the broker's transaction.max.timeout.ms"
    TOO_LARGE = "a batch or record is larger than the broker or topic takes"
    UNSUPPORTED = "the broker does not implement what was asked"
    OTHER = "anything else: the request failed, for a reason kafka2pc does not classify"


_KINDS: dict[int, Kind] = {
    NONE: Kind.DONE,
    DUPLICATE_SEQUENCE_NUMBER: Kind.DUPLICATE,
    COORDINATOR_LOAD_IN_PROGRESS: Kind.COORDINATOR_BUSY,
    COORDINATOR_NOT_AVAILABLE: Kind.COORDINATOR_BUSY,
    NOT_COORDINATOR: Kind.COORDINATOR_BUSY,
    CONCURRENT_TRANSACTIONS: Kind.COORDINATOR_BUSY,
    **dict.fromkeys((kafka_errors.NotLeaderForPartitionError.errno, kafka_errors.LeaderNotAvailableError.errno,
                     kafka_errors.NotEnoughReplicasError.errno, kafka_errors.NotEnoughReplicasAfterAppendError.errno,
                     kafka_errors.NetworkExceptionError.errno, kafka_errors.KafkaStorageError.errno,
                     kafka_errors.FencedLeaderEpochError.errno, kafka_errors.UnknownLeaderEpochError.errno),
                    Kind.PARTITION_BUSY),
    # a Produce whose replicas were slow, or (Kafka 3.x's RPCProducerIdManager) an InitProducerId that waited too long
    # for a block of producer ids; later brokers answer the latter COORDINATOR_LOAD_IN_PROGRESS instead, since it
    # "should be retriable like COORDINATOR_LOAD_IN_PROGRESS"
    REQUEST_TIMED_OUT: Kind.TIMED_OUT,
    UNKNOWN_TOPIC_OR_PARTITION: Kind.UNKNOWN_TOPIC,
    TRANSACTIONAL_ID_NOT_FOUND: Kind.UNKNOWN_ID,
    PRODUCER_FENCED: Kind.FENCED,
    INVALID_PRODUCER_EPOCH: Kind.FENCED,
    INVALID_TXN_STATE: Kind.STALE,
    INVALID_PRODUCER_ID_MAPPING: Kind.STALE,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Kind.UNAUTHORIZED,
    INVALID_TRANSACTION_TIMEOUT: Kind.TIMEOUT_REFUSED,
    MESSAGE_TOO_LARGE: Kind.TOO_LARGE,
    RECORD_LIST_TOO_LARGE: Kind.TOO_LARGE,
    UNSUPPORTED_VERSION: Kind.UNSUPPORTED,
}


def kind(code: int) -> Kind:
    """The kind of ``code``."""
    return _KINDS.get(code, Kind.OTHER)


def error_name(code: int) -> str:
    """Kafka's name for an error code, e.g. ``UNSUPPORTED_VERSION``."""
    return str(getattr(kafka_errors.for_code(code), "message", f"ERROR_{code}"))
