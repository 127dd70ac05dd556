"""The producer's transaction state machine: pure, no I/O, every legal move listed in one table.

In the spirit of Kafka's ``TransactionManager.State`` and of h11: the I/O layer asks the machine before it acts
(:meth:`TransactionStateMachine.check`) and reports what happened (:meth:`TransactionStateMachine.fire`); anything
not in :data:`TRANSITIONS` is refused with a :class:`~kafka2pc.errors.TransactionStateError`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from kafka2pc.errors import TransactionStateError


class State(enum.Enum):
    """Where a two-phase producer stands."""

    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    #: init_transactions(keep_prepared_txn=True) found a prepared transaction of an earlier producer; only
    #: complete/commit/abort may follow.
    RECOVERED_PREPARED = "RECOVERED_PREPARED"
    #: init_transactions(keep_prepared_txn=True) found nothing ongoing; the producer has not fenced anyone yet, so
    #: complete_transaction can still report what became of an earlier transaction.
    RECOVERED_IDLE = "RECOVERED_IDLE"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    #: prepare_transaction flushed everything; the transaction waits for the coordinator's decision.
    PREPARED = "PREPARED"
    COMMITTING = "COMMITTING"
    ABORTING = "ABORTING"
    #: a write failed; the transaction can only be aborted.
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    #: fenced, unauthorized or otherwise unusable; only close.
    FATAL_ERROR = "FATAL_ERROR"
    CLOSED = "CLOSED"


class Event(enum.Enum):
    """What the I/O layer is about to do, or has just seen happen."""

    INIT = "init"                          # InitProducerId (or the keep-prepared look-up) starts
    INIT_DONE = "init_done"                # this producer has its own producer id and epoch
    INIT_KEPT = "init_kept"                # a prepared transaction of an earlier producer was kept
    INIT_NOTHING_KEPT = "init_nothing_kept"
    INIT_FAILED = "init_failed"            # retriable: init_transactions may be called again
    REINIT = "reinit"                      # a recovered transaction is settled; get this producer's own epoch
    BEGIN = "begin"
    SEND = "send"
    PREPARE = "prepare"
    COMMIT = "commit"
    ABORT = "abort"
    LOOKUP = "lookup"                      # complete_transaction on a past transaction: a read, no move
    END_DONE = "end_done"                  # EndTxn succeeded
    ABORTABLE = "abortable"
    FATAL = "fatal"
    CLOSE = "close"


S, E = State, Event
_ANY_OPEN = (S.UNINITIALIZED, S.INITIALIZING, S.RECOVERED_PREPARED, S.RECOVERED_IDLE, S.READY, S.IN_TRANSACTION,
             S.PREPARED, S.COMMITTING, S.ABORTING, S.ABORTABLE_ERROR, S.FATAL_ERROR)

#: (state, event) -> next state. Nothing else is legal.
TRANSITIONS: Mapping[tuple[State, Event], State] = MappingProxyType({
    (S.UNINITIALIZED, E.INIT): S.INITIALIZING,
    (S.INITIALIZING, E.INIT_DONE): S.READY,
    (S.INITIALIZING, E.INIT_KEPT): S.RECOVERED_PREPARED,
    (S.INITIALIZING, E.INIT_NOTHING_KEPT): S.RECOVERED_IDLE,
    (S.INITIALIZING, E.INIT_FAILED): S.UNINITIALIZED,
    (S.RECOVERED_PREPARED, E.COMMIT): S.COMMITTING,
    (S.RECOVERED_PREPARED, E.ABORT): S.ABORTING,
    (S.RECOVERED_IDLE, E.LOOKUP): S.RECOVERED_IDLE,
    (S.RECOVERED_IDLE, E.REINIT): S.INITIALIZING,
    (S.READY, E.BEGIN): S.IN_TRANSACTION,
    (S.READY, E.LOOKUP): S.READY,
    (S.IN_TRANSACTION, E.SEND): S.IN_TRANSACTION,
    (S.IN_TRANSACTION, E.PREPARE): S.PREPARED,
    (S.IN_TRANSACTION, E.COMMIT): S.COMMITTING,
    (S.IN_TRANSACTION, E.ABORT): S.ABORTING,
    (S.IN_TRANSACTION, E.ABORTABLE): S.ABORTABLE_ERROR,
    (S.PREPARED, E.COMMIT): S.COMMITTING,
    (S.PREPARED, E.ABORT): S.ABORTING,
    (S.COMMITTING, E.COMMIT): S.COMMITTING,   # a commit that timed out may be retried
    (S.COMMITTING, E.END_DONE): S.READY,
    (S.COMMITTING, E.REINIT): S.INITIALIZING,
    (S.ABORTING, E.ABORT): S.ABORTING,
    (S.ABORTING, E.END_DONE): S.READY,
    (S.ABORTING, E.REINIT): S.INITIALIZING,
    (S.ABORTABLE_ERROR, E.ABORT): S.ABORTING,
    **{(state, E.FATAL): S.FATAL_ERROR for state in _ANY_OPEN},
    **{(state, E.CLOSE): S.CLOSED for state in _ANY_OPEN},
})

# What the user called, for error messages: event -> public method name.
_OPERATION = {
    E.INIT: "init_transactions", E.BEGIN: "begin_transaction", E.SEND: "produce", E.PREPARE: "prepare_transaction",
    E.COMMIT: "commit_transaction", E.ABORT: "abort_transaction", E.LOOKUP: "complete_transaction",
    E.REINIT: "begin_transaction", E.CLOSE: "close",
}

_HINTS = {
    S.UNINITIALIZED: "call init_transactions() first",
    S.RECOVERED_PREPARED: "a prepared transaction was recovered; complete_transaction(), commit or abort it first",
    S.PREPARED: "the transaction is prepared; only complete_transaction(), commit or abort may follow",
    S.ABORTABLE_ERROR: "a write failed; abort_transaction() is the only way forward",
    S.FATAL_ERROR: "the producer is unusable (fenced or unauthorized); close it",
    S.CLOSED: "the producer is closed",
    S.READY: "no transaction is open; call begin_transaction() first",
    S.IN_TRANSACTION: "a transaction is already open",
}


class TransactionStateMachine:
    """Holds the current :class:`State` and moves it only along :data:`TRANSITIONS`."""

    def __init__(self) -> None:
        self.state = State.UNINITIALIZED
        self.error: BaseException | None = None

    def can(self, event: Event) -> bool:
        """Whether ``event`` is legal now."""
        return (self.state, event) in TRANSITIONS

    def check(self, event: Event) -> None:
        """Raise unless ``event`` is legal now. In FATAL_ERROR the error that made the producer unusable (say,
        :class:`~kafka2pc.errors.ProducerFencedError`) is raised again; otherwise a TransactionStateError, chained to
        the write failure in ABORTABLE_ERROR."""
        if (self.state, event) in TRANSITIONS:
            return
        if self.state is State.FATAL_ERROR and self.error is not None:
            raise self.error
        operation = _OPERATION.get(event, event.value)
        error = TransactionStateError(operation, self.state.value, _HINTS.get(self.state, ""))
        if self.error is not None and self.state is State.ABORTABLE_ERROR:
            raise error from self.error
        raise error

    def fire(self, event: Event, error: BaseException | None = None) -> State:
        """Take the transition for ``event`` (raising if illegal) and return the new state."""
        self.check(event)
        self.state = TRANSITIONS[(self.state, event)]
        if event in (Event.FATAL, Event.ABORTABLE):
            self.error = error
        elif self.state is not State.FATAL_ERROR and self.state is not State.CLOSED:
            self.error = None
        return self.state
