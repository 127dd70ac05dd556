"""The producer's control plane, sans-IO: the core decides, the I/O edge sends.

Each state (:mod:`~kafka2pc._core.states`) is a frozen value carrying what the next move needs: the transaction
setup, the producer's identity, whose transaction is being ended and under which producer id and epoch. Each
operation (:meth:`ProducerCore.begin`, :meth:`~ProducerCore.end`, :meth:`~ProducerCore.complete` ...) is checked
against :data:`~kafka2pc._core.transitions.TRANSITIONS` and returns a :class:`~kafka2pc._core.machine.Machine`: the
driver runs it, and the core takes its result (or failure, the edge's included) into its state. Illegal calls raise
:class:`~kafka2pc.errors.TransactionStateError` and change nothing; a failed operation leaves the state from which
it may be retried, or FATAL_ERROR, and a :class:`~kafka2pc.errors.FatalError` always leaves FATAL_ERROR. What a
failed end leaves is :func:`~kafka2pc._core.ending.failed_end`'s to say.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import attrs

from kafka2pc._core import codes
from kafka2pc._core.beginning import FATAL, Beginning, fresh_bumps, identity_after_handover
from kafka2pc._core.completion import Completion, Goal, Settled
from kafka2pc._core.ending import failed_end
from kafka2pc._core.initialization import Initialization, Initialized
from kafka2pc._core.judge import Fate, TransactionOutcome, end_version
from kafka2pc._core.machine import Finished, Machine
from kafka2pc._core.messages import AddAnswer, AddPartitions, Answer, Command, NoAnswer, ObservedTransaction
from kafka2pc._core.requests import Immediately, Request
from kafka2pc._core.resend import Resending
from kafka2pc._core.retry import COORDINATOR_RETRY, Retry
from kafka2pc._core.setup import TransactionSetup, fenced
from kafka2pc._core.states import (
    Closed,
    CoreState,
    Ending,
    Fatal,
    InTransaction,
    Owner,
    Prepared,
    Ready,
    Recovered,
    State,
    TopicPartition,
    Unowned,
    WriteFailed,
    state_name,
)
from kafka2pc._core.transitions import Operation, allowed
from kafka2pc.errors import (
    AuthorizationError,
    FatalError,
    TransactionAbortableError,
    TransactionLostError,
    TransactionStateError,
)
from kafka2pc.prepared_state import PreparedTxnState

log = logging.getLogger(__name__)
R = TypeVar("R")


class _Operation(Generic[R]):
    """One operation of the core, as a machine: runs ``inner``; ``done`` turns its result into the operation's, or
    into a machine whose result is the operation's; ``progress`` sees each step; ``failed`` turns an error (the
    machine's, or one the edge raised instead of answering) into the one to raise."""

    def __init__(self, inner: Machine[Any], done: Callable[[Any], Finished[R] | Machine[Any]],
                 failed: Callable[[Exception], Exception], progress: Callable[[], None] = lambda: None):
        self._inner, self._done, self._failed, self._progress = inner, done, failed, progress
        self._chained = False

    def start(self, now: float | None = None) -> Command | Finished[R]:
        """The first command of the operation."""
        return self._guarded(lambda: self._inner.start(now), now)

    def on_answer(self, answer: Answer, now: float | None = None) -> Command | Finished[R]:
        """The next command, or the operation's result."""
        return self._guarded(lambda: self._inner.on_answer(answer, now), now)

    def _guarded(self, step: Callable[[], Command | Finished[Any]], now: float | None) -> Command | Finished[R]:
        try:
            result = step()
            if isinstance(result, Finished) and not self._chained:
                following = self._done(result.result)
                if isinstance(following, Finished):
                    return following
                self._inner, self._chained = following, True  # it goes on with another machine (a look-up)
                result = following.start(now)
        except Exception as error:
            raised = self._failed(error)
            if raised is error:
                raise
            raise raised from error
        if not isinstance(result, Finished):
            self._progress()
        return result

    def on_failure(self, error: Exception) -> Exception:
        """The edge raised ``error`` instead of answering: the operation's failure, as for its machine's errors."""
        return self._failed(error)


class ProducerCore:
    """The control plane of one :class:`~kafka2pc.TwoPhaseProducer`. Not thread-safe, like the producer.
    ``retry``: how long commands that may be sent again are (the producer's ``max.block.ms``)."""

    def __init__(self, transactional_id: str, retry: Retry = COORDINATOR_RETRY) -> None:
        self.transactional_id = transactional_id
        self.state: CoreState = Unowned(None)
        self.fallback_reason: str | None = None
        #: the fallback was decided because the broker has transaction.two.phase.commit.enable=false
        self.two_phase_turned_off = False
        #: how transactions run, once init_transactions has decided it (kept after close)
        self.setup: TransactionSetup | None = None
        self._retry = retry

    @property
    def name(self) -> State:
        """The public name of the current state."""
        return state_name(self.state)

    def _check(self, operation: Operation, hint: str = "") -> None:
        """Raise unless the table allows ``operation`` now (a fatal state raises the error that caused it)."""
        if allowed(self.name, operation):
            return
        raise self._refusal(operation.method, hint)

    def _refusal(self, method: str, hint: str = "") -> Exception:
        state = self.state
        if isinstance(state, Fatal):
            raise state.error
        if not hint and isinstance(state, Ending):
            hint = (f"{'a commit' if state.commit else 'an abort'} of {state.target} is in progress; only the same "
                    "decision may be retried")
        error = TransactionStateError(method, self.name.value, hint or _HINTS.get(self.name, ""))
        if isinstance(state, WriteFailed):
            raise error from state.error
        return error

    def _operation(self, inner: Machine[Any], done: Callable[[Any], Finished[R] | Machine[Any]],
                   failed: Callable[[Exception], Exception] = lambda error: error,
                   progress: Callable[[], None] = lambda: None) -> Machine[R]:
        return Resending(_Operation(inner, done, failed, progress), self._retry)

    def open_transaction(self, operation: str = "produce") -> InTransaction:
        """The open transaction records may be added to, or raise."""
        if not isinstance(self.state, InTransaction):
            raise self._refusal(operation)
        return self.state

    # -- initialisation ----------------------------------------------------------------------------------------------

    def check_init(self) -> None:
        """Raise unless ``init_transactions`` may be called now (TransactionStateError; a fatal state raises its
        error), changing nothing: the edge calls it before it reads what :meth:`init` needs from the cluster, so a
        refused call never depends on, nor is changed by, that read."""
        self._check(Operation.INIT, "init_transactions() was already called")

    def init(self, *, keep_prepared: bool, two_phase_wanted: bool, init_producer_id_max_version: int,
             transaction_version: int, timeout_ms: int | None,
             versions_age_s: float | None = 0.0) -> Machine[PreparedTxnState | None]:
        """``init_transactions``; its result is the kept prepared transaction, if any."""
        self.check_init()
        plan = Initialization(self.transactional_id, keep_prepared=keep_prepared, two_phase_wanted=two_phase_wanted,
                              init_producer_id_max_version=init_producer_id_max_version,
                              transaction_version=transaction_version, timeout_ms=timeout_ms,
                              versions_age_s=versions_age_s)

        def done(found: Initialized) -> Finished[PreparedTxnState | None]:
            self.fallback_reason = plan.fallback_reason
            self.two_phase_turned_off = plan.two_phase_turned_off
            self.setup = found.setup
            if found.held is not None:
                owner = Owner.KEPT_BY_BROKER if found.kept_by_broker else Owner.RESUMED
                self.state = Recovered(found.setup, found.held, owner, found.identity)
            elif found.identity is not None:
                self.state = Ready(found.setup, found.identity,
                                   bumps_due=fresh_bumps(found.setup.transaction_version))
            else:
                self.state = Unowned(found.setup)
            return Finished(found.held)

        return self._operation(plan, done, self._fatal_if_fatal)

    def _fatal_if_fatal(self, error: Exception) -> Exception:
        """A failure outside an end: a FatalError (or a configuration the broker refuses) leaves FATAL_ERROR."""
        if isinstance(error, (*FATAL, FatalError)) and not isinstance(self.state, Fatal | Closed):
            self.state = Fatal(error)
        return error

    # -- beginning ---------------------------------------------------------------------------------------------------

    def begin(self) -> Machine[None]:
        """``begin_transaction``: the InitProducerId requests this transaction needs first, then open it."""
        self._check(Operation.BEGIN)
        state = self.state
        assert isinstance(state, Ready | Unowned)
        plan = Beginning(self.transactional_id, state)

        def done(opened: InTransaction) -> Finished[None]:
            self.state = opened
            return Finished(None)

        def failed(error: Exception) -> Exception:
            self.state = plan.state
            return self._fatal_if_fatal(error)

        def progress() -> None:
            self.state = plan.state

        return self._operation(plan, done, failed, progress)

    # -- writing -----------------------------------------------------------------------------------------------------

    def note_sent(self) -> None:
        """Protocol v2: a Produce request of the open transaction was sent, so the coordinator may know it."""
        state = self.open_transaction()
        if not state.registered:
            self.state = attrs.evolve(state, registered=True)

    def register(self, partitions: set[TopicPartition]) -> Machine[None]:
        """Protocol v1: AddPartitionsToTxn for the ``partitions`` not yet in the transaction."""
        state = self.open_transaction()
        missing = frozenset(partitions) - state.partitions
        if not missing:
            return Immediately(None)
        self.state = attrs.evolve(state, registered=True)  # from now on the coordinator may know the transaction
        return self._operation(Request(AddPartitions(state.identity, missing)),
                               lambda answer: self._after_add(missing, answer))

    def _after_add(self, added: frozenset[TopicPartition], answer: Answer) -> Finished[None]:
        state = self.open_transaction()
        if isinstance(answer, AddAnswer) and codes.kind(answer.error) is codes.Kind.DONE:
            self.state = attrs.evolve(state, partitions=state.partitions | added)
            return Finished(None)
        if isinstance(answer, NoAnswer):
            self.abortable(TransactionAbortableError(f"AddPartitionsToTxn got no answer: {answer.reason}"))
        assert isinstance(answer, AddAnswer)
        kind = codes.kind(answer.error)
        if kind is codes.Kind.FENCED:
            self.fatal(fenced(self.transactional_id, codes.error_name(answer.error)))
        if kind is codes.Kind.UNAUTHORIZED:
            self.fatal(AuthorizationError(f"the principal may not write with transactional id "
                                          f"{self.transactional_id!r}: grant WRITE on it"))
        self.abortable(TransactionAbortableError(f"AddPartitionsToTxn failed: {codes.error_name(answer.error)}"))
        raise AssertionError("unreachable")

    def abortable(self, error: BaseException) -> None:
        """A write of the open transaction failed: it can now only be aborted. Raises ``error``."""
        state = self.state
        if isinstance(state, InTransaction):
            self.state = WriteFailed(state.setup, state.identity, state.registered, error)
        raise error

    def fatal(self, error: BaseException) -> None:
        """The producer is unusable (fenced, unauthorized). Raises ``error``."""
        if not isinstance(self.state, Fatal | Closed):
            self.state = Fatal(error)
        raise error

    def prepare(self) -> PreparedTxnState:
        """Vote on the open transaction (the edge has flushed it). One that wrote nothing prepares as the empty
        state: the coordinator never heard of it, so there is nothing to complete."""
        state = self.open_transaction("prepare_transaction")
        prepared = Prepared(state.setup, state.identity, state.registered)
        self.state = prepared
        return prepared.handle

    def continue_after_completion(self, observed: ObservedTransaction | None) -> bool:
        """After another process ended the transaction this producer prepared: go on (READY) with the epoch that end
        gave the id, when ``observed`` shows nothing else happened to it since (:func:`identity_after_handover`).
        False: the producer stays PREPARED, to be closed."""
        self._check(Operation.CONTINUE)
        state = self.state
        assert isinstance(state, Prepared)
        following = identity_after_handover(state.identity, observed, state.setup.transaction_version) \
            if state.registered else None
        if following is None:
            return False
        self.state = Ready(state.setup, following)
        return True

    # -- ending ------------------------------------------------------------------------------------------------------

    def end(self, *, commit: bool, operation: Operation | None = None,
            report: PreparedTxnState | None = None) -> Machine[TransactionOutcome]:
        """The commit or abort of the transaction this producer holds, or a retry of one in progress; then, with
        ``report``, what became of that transaction."""
        state = self.state
        self._check(operation or (Operation.COMMIT if commit else Operation.ABORT))
        if isinstance(state, Ending):
            ending = attrs.evolve(state, report=report)
        elif isinstance(state, InTransaction | Prepared | WriteFailed):
            if not state.registered:  # the coordinator never heard of it: ending it is local
                self.state = Ready(state.setup, state.identity)
                return Resending(self._ended(commit, report), self._retry)
            ending = Ending(state.setup, state.identity.state(state.setup.transaction_version), commit, Owner.OWN,
                            state.identity, report)
        else:
            assert isinstance(state, Recovered)
            target = state.held
            if state.owner is Owner.KEPT_BY_BROKER:  # KIP-939: ended under the producer's new identity
                assert state.identity is not None
                target = state.identity.state(state.setup.transaction_version)
            ending = Ending(state.setup, target, commit, state.owner, state.identity, report)
        self.state = ending
        cluster_version = ending.setup.transaction_version
        if commit:
            plan = Completion(self.transactional_id, ending.target, Goal.COMMIT,
                              end_version(ending.target, True, cluster_version))
        else:  # a resumed transaction's writer may still be alive, and must not reopen it at the same epoch
            plan = Completion.aborting(self.transactional_id, ending.target, cluster_version,
                                       writer_may_live=ending.owner is Owner.RESUMED)
        return self._operation(plan, self._after_end, self._end_failed)

    def _after_end(self, settled: Settled) -> Finished[TransactionOutcome] | Machine[Any]:
        ending = self.state
        assert isinstance(ending, Ending)
        if settled.outcome is not (TransactionOutcome.COMMITTED if ending.commit else TransactionOutcome.ABORTED):
            # an abort found the transaction committed: another producer completed it under this identity
            raise fenced(self.transactional_id, f"its transaction {ending.target} was committed by another producer "
                                                f"({settled.detail})")
        if settled.fenced is False:
            log.warning("%r: %s aborted, but its writer could not be fenced (%s): if that writer is alive it could "
                        "still write at this epoch; stop it, or abort again with TransactionControl",
                        self.transactional_id, ending.target, settled.detail)
        setup, following = ending.setup, settled.next_identity
        if ending.owner is Owner.RESUMED:
            self.state = Unowned(setup)  # this producer gets its own identity when it begins a transaction
        elif setup.transaction_version >= 2:
            self.state = Unowned(setup) if following is None else Ready(setup, following)
        else:
            assert ending.identity is not None
            after = following or ending.identity  # a coordinator abort (timeout, fence) moved the epoch once
            if after.producer_id != ending.identity.producer_id:
                self.state = Unowned(setup)
            else:
                # v1: two bumps before the next transaction, sent (guarded) when it begins; until then the
                # coordinator still reports this end, so completing it again, from any process, says how it ended
                self.state = Ready(setup, after, bumps_due=max(0, 2 - (after.epoch - ending.identity.epoch)))
        return self._ended(ending.commit, ending.report)

    def _end_failed(self, error: Exception) -> Exception:
        state = self.state
        if not isinstance(state, Ending):  # the end succeeded; the report of another transaction failed
            return self._fatal_if_fatal(error)
        left = failed_end(self.transactional_id, state, error)
        self.state = left.state
        return left.error

    def _ended(self, commit: bool, report: PreparedTxnState | None) -> Machine[TransactionOutcome]:
        """What follows an end (unwrapped: it runs inside the end's operation): the report's look-up, or the
        outcome."""
        if report is not None:
            return self._look_up_plan(report)
        return Immediately(TransactionOutcome.COMMITTED if commit else TransactionOutcome.ABORTED)

    # -- complete_transaction ----------------------------------------------------------------------------------------

    def complete(self, requested: PreparedTxnState) -> Machine[TransactionOutcome]:
        """``complete_transaction(requested)``: commit the held transaction if ``requested`` names it; else abort
        the held one, then report what became of ``requested``."""
        state = self.state
        held = _held(state)
        if held is None:
            self._check(Operation.LOOK_UP)
            return self._operation(self._look_up_plan(requested), Finished, self._fatal_if_fatal)
        if requested == held and not requested.is_empty:
            self._check(Operation.COMPLETE_HELD)
            if held.transaction_version is None and isinstance(state, Recovered):
                self.state = attrs.evolve(state, held=requested)  # the caller's record says its protocol
            return self.end(commit=True, operation=Operation.COMPLETE_HELD)
        hint = f"a commit of {held} is in progress; {requested} names another transaction"
        self._check(Operation.COMPLETE_OTHER, hint if isinstance(state, Ending) else "")
        return self.end(commit=False, operation=Operation.COMPLETE_OTHER, report=requested)

    def _look_up_plan(self, requested: PreparedTxnState) -> Machine[TransactionOutcome]:
        setup = getattr(self.state, "setup", None)
        if requested.is_empty or setup is None:
            return Immediately(TransactionOutcome.ABORTED)
        if requested.transaction_version is None and setup.transaction_version == 1:
            requested = attrs.evolve(requested, transaction_version=1)  # a v1 cluster never ran a v2 transaction
        version = requested.transaction_version or setup.transaction_version
        plan = Completion(self.transactional_id, requested, Goal.LOOK_UP, version)
        return _Operation(plan, lambda settled: self._after_look_up(requested, settled), lambda error: error)

    def _after_look_up(self, requested: PreparedTxnState, settled: Settled) -> Finished[TransactionOutcome]:
        if settled.outcome is None:
            raise TransactionStateError(
                "complete_transaction", self.name.value,
                f"transactional id {self.transactional_id!r} has an ongoing transaction ({settled.detail}) that "
                "this producer did not recover; another producer may be using the id")
        if settled.fate is Fate.ABORTED:
            raise TransactionLostError(self.transactional_id, requested.producer_id, requested.epoch,
                                       f"the broker reports it aborted ({settled.detail})")
        return Finished(settled.outcome)

    def close(self) -> None:
        """Closed; nothing is sent."""
        self.state = Closed()


def _held(state: CoreState) -> PreparedTxnState | None:
    if isinstance(state, Prepared):
        return state.handle
    if isinstance(state, Recovered):
        return state.held
    if isinstance(state, Ending):
        return state.target
    return None


_HINTS = {
    State.UNINITIALIZED: "call init_transactions() first",
    State.RECOVERED_PREPARED: "a prepared transaction was recovered; complete_transaction(), commit or abort it first",
    State.PREPARED: "the transaction is prepared; only complete_transaction(), commit or abort may follow",
    State.COMMITTING: "a commit is in progress; retry it with commit_transaction() or complete_transaction()",
    State.ABORTING: "an abort is in progress; retry it with abort_transaction()",
    State.ABORTABLE_ERROR: "a write failed; abort_transaction() is the only way forward",
    State.FATAL_ERROR: "the producer is unusable (fenced or unauthorized); close it",
    State.CLOSED: "the producer is closed",
    State.READY: "no transaction is open; call begin_transaction() first",
    State.IN_TRANSACTION: "a transaction is already open",
}
