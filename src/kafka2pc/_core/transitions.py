"""Every legal move of a two-phase producer, in one table: which operation may be called in which public
:class:`~kafka2pc._core.states.State`, and the states it can leave the producer in, whether it succeeds or fails.

:class:`~kafka2pc._core.producer_core.ProducerCore` refuses any call the table does not list (with a
:class:`~kafka2pc.errors.TransactionStateError`), and the unit and model-based tests check that every move they
observe is listed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from kafka2pc._core.states import State


class Operation(enum.Enum):
    """A public call of the producer, by what it does."""

    INIT = "init_transactions"
    BEGIN = "begin_transaction"
    WRITE = "produce: produce, produce_batch or flush add to, or send, the open transaction"
    PREPARE = "prepare_transaction"
    COMMIT = "commit_transaction"
    ABORT = "abort_transaction"
    LOOK_UP = "complete_transaction: while no transaction is held (it reports what became of the one named)"
    COMPLETE_HELD = "complete_transaction: naming the transaction held (commit it)"
    COMPLETE_OTHER = "complete_transaction: naming another transaction than the one held (abort it, report the other)"
    CONTINUE = "continue_after_completion: go on after another process ended the prepared transaction"
    CLOSE = "close"

    @property
    def method(self) -> str:
        """The name of the public method."""
        return self.value.split(":")[0]


S, Op = State, Operation
#: where an end leaves the producer: its next identity is known, it must look first, the end may be retried, or not
_ENDED = frozenset({S.READY, S.RECOVERED_IDLE, S.FATAL_ERROR})
_COMMIT = _ENDED | {S.COMMITTING}
_ABORT = _ENDED | {S.ABORTING}
_WRITE = frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.FATAL_ERROR})
_CLOSE = frozenset({S.CLOSED})

#: (state, operation) -> the states the operation can leave the producer in. Nothing else may be called.
TRANSITIONS: Mapping[tuple[State, Operation], frozenset[State]] = MappingProxyType({
    (S.UNINITIALIZED, Op.INIT): frozenset({S.READY, S.RECOVERED_PREPARED, S.RECOVERED_IDLE, S.UNINITIALIZED,
                                          S.FATAL_ERROR}),
    (S.RECOVERED_IDLE, Op.BEGIN): frozenset({S.IN_TRANSACTION, S.RECOVERED_IDLE, S.READY, S.FATAL_ERROR}),
    # a report that the transaction named was lost (TransactionLostError, a FatalError) leaves the producer fatal
    (S.RECOVERED_IDLE, Op.LOOK_UP): frozenset({S.RECOVERED_IDLE, S.FATAL_ERROR}),
    (S.READY, Op.BEGIN): frozenset({S.IN_TRANSACTION, S.READY, S.FATAL_ERROR}),
    (S.READY, Op.LOOK_UP): frozenset({S.READY, S.FATAL_ERROR}),
    (S.IN_TRANSACTION, Op.WRITE): _WRITE,
    (S.IN_TRANSACTION, Op.PREPARE): _WRITE | {S.PREPARED},  # it flushes first
    (S.IN_TRANSACTION, Op.COMMIT): _COMMIT | _WRITE,  # it flushes first
    (S.IN_TRANSACTION, Op.ABORT): _ABORT,
    (S.PREPARED, Op.COMMIT): _COMMIT,
    (S.PREPARED, Op.ABORT): _ABORT,
    (S.PREPARED, Op.COMPLETE_HELD): _COMMIT,
    (S.PREPARED, Op.COMPLETE_OTHER): _ABORT,
    (S.PREPARED, Op.CONTINUE): frozenset({S.READY, S.PREPARED}),  # PREPARED: it may not; close it
    (S.RECOVERED_PREPARED, Op.COMMIT): _COMMIT,
    (S.RECOVERED_PREPARED, Op.ABORT): _ABORT,
    (S.RECOVERED_PREPARED, Op.COMPLETE_HELD): _COMMIT,
    (S.RECOVERED_PREPARED, Op.COMPLETE_OTHER): _ABORT,
    # an end that did not settle may be retried, with the same decision only
    (S.COMMITTING, Op.COMMIT): _COMMIT,
    (S.COMMITTING, Op.COMPLETE_HELD): _COMMIT,
    (S.ABORTING, Op.ABORT): _ABORT,
    (S.ABORTING, Op.COMPLETE_OTHER): _ABORT,
    (S.ABORTABLE_ERROR, Op.ABORT): _ABORT,
    **{(state, Op.CLOSE): _CLOSE for state in State if state is not S.CLOSED},
})


def allowed(state: State, operation: Operation) -> bool:
    """Whether ``operation`` may be called in ``state``."""
    return (state, operation) in TRANSITIONS
