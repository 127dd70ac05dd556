"""Every exception kafka2pc raises, grouped by what the caller should do about it.

=================================  ===========================================================================
group (base class)                 what the caller does
=================================  ===========================================================================
:class:`RetriableError`            call again, after a pause: nothing was decided that a retry would repeat
:class:`TransactionAbortableError` abort the transaction, then run it again
:class:`FatalError`                stop using this producer or writer and close it; the message says what an
                                   operator must change (fencing, ACLs, a lost transaction, a broker too old)
:class:`OutcomeUnknownError`       do not guess and do not redo: what happened cannot be known now; recovery
                                   settles it from durable state
:class:`DecidedNotCompletedError`  the outcome is decided (it will be visible, or it is lost); completing it
                                   failed: never run the work again; the next call, recovery or an operator
                                   completes or resolves it
:class:`UsageError`                fix the program: a bad argument, configuration or call order
=================================  ===========================================================================

The anchors are confluent-kafka's ``KafkaError.retriable()``, ``fatal()`` and ``txn_requires_abort()`` (the same
three methods are on :class:`Kafka2pcError`) and Flink's committer outcomes (retry later; failed with a known
reason; failed with an unknown reason). Every class pickles with its attributes (Spark and multiprocessing ship
exceptions between processes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "AuditError",
    "AuthenticationError",
    "AuthorizationError",
    "BatchOverError",
    "BrokerUnavailableError",
    "CommandRefusedError",
    "ConfigError",
    "DatabaseConnectionLostError",
    "DecidedNotCompletedError",
    "DecisionConflictError",
    "DecisionLogCorruptError",
    "DualWriteIncompleteError",
    "DualWriteOutcomeUnknownError",
    "DualWriteRecoveryError",
    "DualWriteUsageError",
    "FatalError",
    "IdInUseError",
    "IdPoolExhaustedError",
    "IncompleteListingError",
    "InvalidPreparedStateError",
    "Kafka2pcError",
    "KafkaProtocolError",
    "LeaseLostError",
    "OutcomeUnknownError",
    "PoolTimeoutError",
    "ProducerFencedError",
    "RecordTooLargeError",
    "RecoveryIncompleteError",
    "RetriableError",
    "SinkStateMissingError",
    "StaleWriteVersionError",
    "StorageUnavailableError",
    "TokenEndpointError",
    "TransactionAbortableError",
    "TransactionLostError",
    "TransactionNotSettledError",
    "TransactionOutcomeUnknownError",
    "TransactionStateError",
    "UnsupportedByBrokerError",
    "UsageError",
    "WriteConflictError",
    "WriteDecidedError",
    "WriteKeyInUseError",
    "WriteOutcomeUnknownError",
]


def _rebuild(cls: type[Kafka2pcError], args: tuple[Any, ...], state: dict[str, Any]) -> Kafka2pcError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class Kafka2pcError(Exception):
    """Base class of every error kafka2pc raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException pickles as cls(*args), which a subclass with its own __init__ cannot take back: rebuild
        # without calling __init__, from the message and the attributes
        return _rebuild, (type(self), self.args, dict(self.__dict__))

    def retriable(self) -> bool:
        """Whether calling again may succeed (confluent-kafka's ``retriable()``)."""
        return isinstance(self, RetriableError)

    def fatal(self) -> bool:
        """Whether the producer or writer is unusable now (confluent-kafka's ``fatal()``)."""
        return isinstance(self, FatalError)

    def txn_requires_abort(self) -> bool:
        """Whether the transaction must be aborted (confluent-kafka's ``txn_requires_abort()``)."""
        return isinstance(self, TransactionAbortableError)


# -- the groups ------------------------------------------------------------------------------------------------------

class RetriableError(Kafka2pcError):
    """Call again after a pause: nothing was decided that a retry would repeat."""


class TransactionAbortableError(Kafka2pcError):
    """The current transaction cannot commit (a record could not be written); abort it, then continue."""


class FatalError(Kafka2pcError):
    """This producer or writer cannot go on: close it. The message names the cause an operator has to fix."""


class OutcomeUnknownError(Kafka2pcError):
    """What happened cannot be known now. Nothing was guessed: recovery settles it from durable state."""


class DecidedNotCompletedError(Kafka2pcError):
    """The outcome is decided, but completing it failed: never redo the work; the next call, recovery or an
    operator completes (or resolves) it."""


class UsageError(Kafka2pcError):
    """A bad argument, configuration or call order: fix the program."""


# -- retriable -------------------------------------------------------------------------------------------------------

class BrokerUnavailableError(RetriableError):
    """No broker of the cluster could be reached, or a needed one did not answer in time."""


class TransactionNotSettledError(BrokerUnavailableError):
    """A commit or abort (or a look at what became of a transaction) got no answer that settles it: the coordinator
    did not answer in time, answered an error that says nothing about the transaction, or kept it ongoing or still
    writing its markers. It may or may not have ended; nothing was concluded. Call the same end again: it is exact
    (conditional on the producer id and epoch) and idempotent, and a producer stays COMMITTING or ABORTING for it.
    ``error_code`` is the broker's error code when one was answered."""

    def __init__(self, transactional_id: str, requested: str, reason: str, *, error_code: int | None = None) -> None:
        super().__init__(f"transaction {requested} of transactional id {transactional_id!r}: {reason}; whether it "
                         "ended is not known yet: retry")
        self.transactional_id = transactional_id
        self.requested = requested
        self.reason = reason
        self.error_code = error_code


class IncompleteListingError(BrokerUnavailableError):
    """ListTransactions could not be answered by every transaction coordinator, so a listing would miss
    transactions. Nothing was decided on it."""


class PoolTimeoutError(RetriableError):
    """No pooled dual writer became free in time: every one was busy. Retry, or give the pool more writers."""


class LeaseLostError(RetriableError):
    """A DualWriterPool's writer lost its lease while the request's block ran: the block (waiting for Kafka on a
    broker that was away, or a process frozen) kept its database transaction open longer than ``lease_s``, so
    PostgreSQL ended its session, or another process took the id over. Both sides were rolled back and the pool
    serves the next request with another writer: retry. The cause is chained (``__cause__``)."""


class DatabaseConnectionLostError(RetriableError):
    """A pooled writer's database connection was lost while the request's block ran, before the commit (a server
    restart or failover, a cut network; on MariaDB and asyncpg also a session the server ended for the lease's idle
    limit, which they do not tell apart): the writer committed nothing and Kafka's transaction was aborted. The pool
    has replaced the connection: retry (a block that committed by itself, which it must not, is the one case where
    its rows stay). The driver's error is chained (``__cause__``)."""


class StorageUnavailableError(RetriableError):
    """The store holding decisions or sink state (a checkpoint location: local, HDFS, S3, GCS, Azure) did not answer
    in a way that says anything about the file: unreachable, timed out, busy, an error status. Nothing was concluded
    from it (an outage is never read as "absent"); call again once the store is back."""


class IdInUseError(RetriableError):
    """The transactional id this Spark task attempt would write with has an open transaction of another attempt:
    this attempt stops without touching it, and Spark retries the task under the next attempt number (another id)."""


class TokenEndpointError(RetriableError):
    """The OAuth token endpoint could not be reached or did not answer; a later attempt may get a token."""


# -- abortable -------------------------------------------------------------------------------------------------------

class BatchOverError(TransactionAbortableError):
    """The Spark batch this task attempt writes for is over (decided, aborted, or planned again by a restarted
    driver): the attempt stops, aborting what it opened."""


# -- fatal -----------------------------------------------------------------------------------------------------------

class ProducerFencedError(FatalError):
    """Another producer with the same transactional id has started (or the broker bumped the epoch): this producer
    can no longer write or end transactions and must be closed."""


class AuthorizationError(FatalError):
    """The principal lacks an ACL the operation needs; the message names it."""


class AuthenticationError(FatalError):
    """The cluster refused this client's credentials, token or certificate, or the client refused the broker's
    certificate (not trusted, or not naming the host). The message names the cause; no secret is in it."""


class TransactionLostError(FatalError):
    """A commit was decided for a transaction the broker has already aborted (for example by timeout in fallback
    mode). Its records are not visible and never will be."""

    def __init__(self, transactional_id: str, producer_id: int, epoch: int, detail: str) -> None:
        super().__init__(f"transaction {producer_id}:{epoch} of transactional id {transactional_id!r} "
                         f"cannot commit: {detail}")
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.epoch = epoch


class UnsupportedByBrokerError(FatalError):
    """The broker does not support a protocol version or feature that the operation needs."""


class KafkaProtocolError(FatalError):
    """A broker answered a request with an error code that kafka2pc does not turn into something more specific. A
    producer that gets it is FATAL_ERROR, except in a commit or abort, which it leaves in progress (raising
    :class:`TransactionNotSettledError` from it: the same end may be called again)."""

    def __init__(self, api: str, error_name: str, error_code: int, detail: str = "") -> None:
        message = f"{api} failed: {error_name} (error code {error_code})"
        super().__init__(f"{message}: {detail}" if detail else message)
        self.api = api
        self.error_name = error_name
        self.error_code = error_code


class DecisionLogCorruptError(FatalError):
    """A decision record cannot be read, or belongs to another prefix; recovery stops before touching anything."""


class SinkStateMissingError(FatalError):
    """A Spark checkpoint holds Spark's progress but not the kafka2pc sink's state (deleted, or the driver runs where
    the path is another directory): nothing is written until the state is back (the message says how)."""


class IdPoolExhaustedError(FatalError):
    """A subtask would need more live transactional ids than its cap: transactions are not being completed (the
    committer is stuck or checkpoints are piling up)."""


class AuditError(FatalError):
    """The audit could not be carried out (topic unknown, cluster unreachable, end offsets not reached)."""


# -- outcome unknown -------------------------------------------------------------------------------------------------

class TransactionOutcomeUnknownError(OutcomeUnknownError):
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
        #: the transaction may still be pending. kafka2pc itself raises :class:`TransactionNotSettledError` then (a
        #: retriable error: the same end may be called again); kept for code that builds this error
        self.still_pending = still_pending


class DualWriteOutcomeUnknownError(OutcomeUnknownError):
    """The database commit failed in a way that leaves its outcome unknown (a lost connection; a read-back on another
    session, which cannot prove it failed): the Kafka transaction stays prepared; the writer's next ``transaction()``
    or :meth:`~kafka2pc.dualwrite.DualWriter.recover`, on a working connection and under the row lock, commits or
    aborts it by what the database holds."""


class WriteOutcomeUnknownError(OutcomeUnknownError):
    """A Spark batch write failed at its commit point, and whether its decision was recorded cannot be read now (the
    store is unreachable): its rows may or may not become visible. Do not run it again blindly: the next write with
    the same checkpoint location, or ``kafka2pc recover --checkpoint-location``, settles it and says which."""


# -- decided, not completed ------------------------------------------------------------------------------------------

class DualWriteIncompleteError(DecidedNotCompletedError):
    """The database committed, completing the Kafka transaction failed: it is decided and stays prepared; the
    writer's next ``transaction()`` (or :meth:`~kafka2pc.dualwrite.DualWriter.recover`, or a successor's) commits it
    first. Do not write it again."""


class DualWriteRecoveryError(DecidedNotCompletedError):
    """Recovery cannot tell what to do with the transaction the database committed; nothing was changed. After
    checking, an operator may call :meth:`~kafka2pc.dualwrite.DualWriter.resolve`."""


class WriteDecidedError(DecidedNotCompletedError):
    """A Spark batch write is decided (all of it will be visible) but completing it failed: the next write with the
    same checkpoint location, or ``kafka2pc recover``, completes it. Running the same write again would write it
    twice."""


class RecoveryIncompleteError(DecidedNotCompletedError):
    """Recovery did everything it could, but some decided checkpoints cannot be completed: a transaction of theirs
    was lost (aborted by the broker, e.g. by timeout without 2PC) or its fate is unknown. Nothing was guessed; an
    operator decides (``kafka2pc recover --resolve CHECKPOINT --reason ...``). ``report`` is the
    :class:`~kafka2pc.sink.RecoveryReport` of what was done; ``stuck`` maps each checkpoint to its error."""

    def __init__(self, report: Any, stuck: Mapping[int, Exception]) -> None:
        lines = "; ".join(f"checkpoint {c}: {e}" for c, e in sorted(stuck.items()))
        super().__init__(f"{len(stuck)} decided checkpoint(s) cannot be completed: {lines}")
        self.report = report
        self.stuck = dict(stuck)


# -- usage -----------------------------------------------------------------------------------------------------------

class ConfigError(UsageError, ValueError):
    """A configuration key is unknown, malformed or contradicts another; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config {key!r}: {problem}")
        self.key = key


class TransactionStateError(UsageError):
    """The operation is not allowed in the producer's current transaction state (e.g. produce after prepare)."""

    def __init__(self, operation: str, state: str, hint: str = "") -> None:
        message = f"{operation}() is not allowed in state {state}"
        super().__init__(f"{message}: {hint}" if hint else message)
        self.operation = operation
        self.state = state


class InvalidPreparedStateError(UsageError, ValueError):
    """A prepared-transaction state string is not ``"<producerId>:<epoch>"`` (or the empty string)."""


class RecordTooLargeError(UsageError, ValueError):
    """A record is larger than ``max.request.size`` or its topic's ``max.message.bytes``. It was not added to the
    transaction, which is unaffected."""


class DecisionConflictError(UsageError):
    """A checkpoint was recorded with another decision, or is older than the last recorded one. A decision, once
    recorded, is the commit point: it is never replaced, and no checkpoint goes back (two writers on one decision
    log, or a stale one)."""


class WriteConflictError(UsageError):
    """A Spark batch write found its checkpoint decided by another write on the same checkpoint location: none of
    its rows were written (its transactions were aborted). One write at a time per location."""


class WriteKeyInUseError(UsageError):
    """A keyed Spark batch write (``txnAppId``/``txnVersion``) found its version decided at its location by another
    streaming query: two queries share one ``txnAppId``. Refused, nothing written: give each query its own."""


class StaleWriteVersionError(UsageError):
    """A keyed Spark batch write (``txnAppId``/``txnVersion``) has a version below its application's last decided
    one: refused, nothing written. Versions must increase per application."""


class DualWriteUsageError(UsageError):
    """A ``DualWriter.transaction()`` block was misused: nested in another, or the application committed or rolled
    back the connection inside it. The block ended with both sides rolled back where that was still possible; the
    message says what the database may already hold."""


class CommandRefusedError(UsageError):
    """A ``kafka2pc`` command was refused before doing anything (a bad combination of arguments, no
    confirmation)."""
