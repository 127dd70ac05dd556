"""The exceptions kafka2pc raises: one hierarchy under :class:`Kafka2pcError`."""

from __future__ import annotations


class Kafka2pcError(Exception):
    """Base class of every error kafka2pc raises on purpose."""


class ConfigError(Kafka2pcError, ValueError):
    """A configuration key is unknown, malformed or contradicts another; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config {key!r}: {problem}")
        self.key = key


class BrokerUnavailableError(Kafka2pcError):
    """No broker of the cluster could be reached, or a needed one did not answer in time."""


class KafkaProtocolError(Kafka2pcError):
    """A broker answered a request with an error code that kafka2pc does not turn into something more specific."""

    def __init__(self, api: str, error_name: str, error_code: int, detail: str = "") -> None:
        message = f"{api} failed: {error_name} (error code {error_code})"
        super().__init__(f"{message}: {detail}" if detail else message)
        self.api = api
        self.error_name = error_name
        self.error_code = error_code


class UnsupportedByBrokerError(Kafka2pcError):
    """The broker does not support a protocol version or feature that the operation needs."""


class InvalidPreparedStateError(Kafka2pcError, ValueError):
    """A prepared-transaction state string is not ``"<producerId>:<epoch>"`` (or the empty string)."""


class TransactionStateError(Kafka2pcError):
    """The operation is not allowed in the producer's current transaction state (e.g. produce after prepare)."""

    def __init__(self, operation: str, state: str, hint: str = "") -> None:
        message = f"{operation}() is not allowed in state {state}"
        super().__init__(f"{message}: {hint}" if hint else message)
        self.operation = operation
        self.state = state


class ProducerFencedError(Kafka2pcError):
    """Another producer with the same transactional id has started (or the broker bumped the epoch): this producer
    can no longer write or end transactions and must be closed."""


class TransactionAbortableError(Kafka2pcError):
    """The current transaction cannot commit (a record could not be written); abort it, then continue."""


class TransactionLostError(Kafka2pcError):
    """A commit was decided for a transaction the broker has already aborted (for example by timeout in fallback
    mode). Its records are not visible and never will be."""

    def __init__(self, transactional_id: str, producer_id: int, epoch: int, detail: str) -> None:
        super().__init__(f"transaction {producer_id}:{epoch} of transactional id {transactional_id!r} "
                         f"cannot commit: {detail}")
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.epoch = epoch


class AuthorizationError(Kafka2pcError):
    """The principal lacks an ACL the operation needs; the message names it."""


class TransactionOutcomeUnknownError(Kafka2pcError):
    """What became of a transaction cannot be known: it is not ongoing, and the coordinator's state no longer says
    whether it committed (a later transaction of the id has ended since, or the id expired). Nothing was guessed;
    the attributes say what is known."""

    def __init__(self, transactional_id: str, requested: str, reason: str, *, observed: str | None = None,
                 other_pending: str | None = None, still_pending: bool = False) -> None:
        super().__init__(f"the outcome of transaction {requested} of transactional id {transactional_id!r} cannot be "
                         f"known: {reason}")
        self.transactional_id = transactional_id
        self.requested = requested
        self.reason = reason
        #: DescribeTransactions' last answer, e.g. "CompleteCommit at 7:12"
        self.observed = observed
        #: the producer id and epoch of another transaction ongoing on the id, if any
        self.other_pending = other_pending
        #: the transaction may still be pending (the coordinator kept it ongoing or in flux): retrying may settle it
        self.still_pending = still_pending


class RecordTooLargeError(Kafka2pcError, ValueError):
    """A record is larger than ``max.request.size`` or its topic's ``max.message.bytes``. It was not added to the
    transaction, which is unaffected."""
