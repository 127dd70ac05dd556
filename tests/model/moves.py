"""Every move a producer makes, checked against the one statement of legal moves (kafka2pc._core.transitions):
a call the table allows ends in one of the states it lists; a call it does not allow is refused and changes
nothing. And every error a call raises agrees with the state it leaves: a FatalError leaves FATAL_ERROR (and a call
that makes the producer FATAL_ERROR raises one); a call that leaves an end in progress (COMMITTING, ABORTING) raises
an error that says to call again (kafka2pc._core.ending)."""

from __future__ import annotations

from typing import Any

from kafka2pc import PreparedTxnState, TwoPhaseProducer
from kafka2pc._core.producer_core import _held
from kafka2pc._core.states import State
from kafka2pc._core.transitions import TRANSITIONS, Operation
from kafka2pc.errors import FatalError, Kafka2pcError, TransactionStateError

_OPERATIONS = {
    "init_transactions": Operation.INIT, "begin_transaction": Operation.BEGIN, "produce": Operation.WRITE,
    "produce_batch": Operation.WRITE, "flush": Operation.WRITE, "prepare_transaction": Operation.PREPARE,
    "commit_transaction": Operation.COMMIT, "abort_transaction": Operation.ABORT, "close": Operation.CLOSE,
    "continue_after_completion": Operation.CONTINUE,
}


def operation_of(producer: TwoPhaseProducer, method: str, args: tuple[Any, ...]) -> Operation | None:
    """The table's operation of a call (None: one the table does not govern, a no-op of the facade)."""
    state = producer.state
    if method == "flush" and state in (State.READY, State.PREPARED):
        return None  # flush() returns at once there
    if method == "close" and state is State.CLOSED:
        return None
    if method != "complete_transaction":
        return _OPERATIONS.get(method)
    held = _held(producer._core.state)
    requested = args[0] if isinstance(args[0], PreparedTxnState) else PreparedTxnState.parse(args[0])
    if held is None:
        return Operation.LOOK_UP
    return Operation.COMPLETE_HELD if requested == held and not requested.is_empty else Operation.COMPLETE_OTHER


class Checked:
    """``producer`` whose every call is checked against the table; ``moves`` collects (before, operation, after)."""

    def __init__(self, producer: TwoPhaseProducer, moves: set[tuple[State, Operation, State]]):
        self._producer = producer
        self._moves = moves

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._producer, name)
        if not callable(attribute) or name.startswith("_") or name not in (*_OPERATIONS, "complete_transaction"):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            before = self._producer.state
            operation = operation_of(self._producer, name, args)
            try:
                return attribute(*args, **kwargs)
            except TransactionStateError:
                if operation is not None and before is not State.FATAL_ERROR:
                    assert (before, operation) not in TRANSITIONS, f"{name} refused in {before}, which the table allows"
                    assert self._producer.state is before, f"a refused {name} moved {before} to {self._producer.state}"
                raise
            except Kafka2pcError as error:
                check_agreement(name, before, self._producer.state, error)
                raise
            finally:
                after = self._producer.state
                if operation is not None and (before, operation) in TRANSITIONS:
                    assert after in TRANSITIONS[(before, operation)], \
                        f"{name}: {before} -> {after}, which the table does not list for {operation.name}"
                    self._moves.add((before, operation, after))

        return call


def check_agreement(name: str, before: State, after: State, error: Kafka2pcError) -> None:
    """The error a call raised agrees with the state it left the producer in."""
    if isinstance(error, FatalError):
        assert after is State.FATAL_ERROR, f"{name} raised {error!r}, a FatalError, and left the producer {after}"
    elif after is State.FATAL_ERROR and before is not State.FATAL_ERROR:
        raise AssertionError(f"{name} made the producer FATAL_ERROR but raised {error!r}, not a FatalError")
    if after in (State.COMMITTING, State.ABORTING):
        assert error.retriable(), f"{name} left the producer {after} but raised {error!r}, which is not retriable"
