"""The producer's control plane as a sans-IO state machine, in h11's way: the core decides, the I/O edge sends.

Each state (:mod:`kafka2pc.producer_states`) is a frozen value carrying what the next move needs: the transaction
setup, the producer's identity, whose transaction is being ended and under which producer id and epoch. An operation
(:meth:`ProducerCore.begin`, :meth:`~ProducerCore.end`, :meth:`~ProducerCore.complete` ...) returns the first
:mod:`~kafka2pc.coordinator_messages` command; the edge sends it and passes the answer to
:meth:`~ProducerCore.on_answer`, which returns the next command or :class:`Done`. Illegal calls raise
:class:`~kafka2pc.errors.TransactionStateError` and change nothing; a failed operation leaves the state from which
it may be retried, or FATAL_ERROR.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from kafka2pc import broker_errors as codes
from kafka2pc.begin_plan import FATAL, Beginning, fresh_bumps
from kafka2pc.completion import Completion, Fate, Goal, Settled, TransactionOutcome, end_version
from kafka2pc.coordinator_messages import (
    AddAnswer,
    AddPartitions,
    Answer,
    Command,
    DescribeTransaction,
    InitProducerId,
    NoAnswer,
)
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    KafkaProtocolError,
    TransactionAbortableError,
    TransactionLostError,
    TransactionOutcomeUnknownError,
    TransactionStateError,
)
from kafka2pc.init_plan import Initialization, Initialized, TransactionSetup, fenced
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.producer_states import (
    AbortableError,
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
    state_name,
)

log = logging.getLogger(__name__)


@attrs.frozen
class Done:
    """An operation finished; ``result`` is what the public call returns."""

    result: Any = None


Step = Command | Done


@attrs.frozen
class _Adding:
    partitions: frozenset[TopicPartition]




class ProducerCore:
    """The control plane of one :class:`~kafka2pc.TwoPhaseProducer`. Not thread-safe, like the producer."""

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.state: CoreState = Unowned(None)
        self.fallback_reason: str | None = None
        #: how transactions run, once init_transactions has decided it (kept after close)
        self.setup: TransactionSetup | None = None
        self._operation: Initialization | Beginning | Completion | _Adding | None = None

    @property
    def name(self) -> State:
        """The public name of the current state."""
        return state_name(self.state)

    def _illegal(self, operation: str, hint: str = "") -> TransactionStateError:
        state = self.state
        if isinstance(state, Fatal):
            raise state.error
        error = TransactionStateError(operation, self.name.value, hint or _HINTS.get(self.name, ""))
        if isinstance(state, AbortableError):
            raise error from state.error
        return error

    def open_transaction(self, operation: str = "produce") -> InTransaction:
        """The open transaction records may be added to, or raise."""
        if not isinstance(self.state, InTransaction):
            raise self._illegal(operation)
        return self.state

    # -- initialisation ----------------------------------------------------------------------------------------------

    def init(self, *, keep_prepared: bool, two_phase_wanted: bool, init_producer_id_max_version: int,
             transaction_version: int, timeout_ms: int | None) -> Step:
        """Start ``init_transactions``."""
        if not (isinstance(self.state, Unowned) and self.state.setup is None):
            raise self._illegal("init_transactions", "init_transactions() was already called")
        plan = Initialization(self.transactional_id, keep_prepared=keep_prepared, two_phase_wanted=two_phase_wanted,
                              init_producer_id_max_version=init_producer_id_max_version,
                              transaction_version=transaction_version, timeout_ms=timeout_ms)
        self._operation = plan
        return plan.start()

    def _initialized(self, plan: Initialization, found: Initialized) -> Done:
        self.fallback_reason = plan.fallback_reason
        self.setup = found.setup
        if found.held is not None:
            owner = Owner.KEPT_BY_BROKER if found.kept_by_broker else Owner.RESUMED
            self.state = Recovered(found.setup, found.held, owner, found.identity)
        elif found.identity is not None:
            self.state = Ready(found.setup, found.identity, bumps_due=fresh_bumps(found.setup.transaction_version))
        else:
            self.state = Unowned(found.setup)
        return Done(found.held)

    # -- beginning ---------------------------------------------------------------------------------------------------

    def begin(self) -> Step:
        """Start ``begin_transaction``: the InitProducerId requests this transaction needs first, then open it."""
        state = self.state
        if not (isinstance(state, Ready) or (isinstance(state, Unowned) and state.setup is not None)):
            raise self._illegal("begin_transaction")
        plan = Beginning(self.transactional_id, state)
        self._operation = plan
        return self._began(plan, plan.start())

    def _began(self, plan: Beginning, step: DescribeTransaction | InitProducerId | InTransaction) -> Step:
        if isinstance(step, InTransaction):
            self._operation = None
            self.state = step
            return Done()
        self.state = plan.state
        return step

    # -- writing -----------------------------------------------------------------------------------------------------

    def note_sent(self) -> None:
        """Protocol v2: a Produce request of the open transaction was sent, so the coordinator may know it."""
        state = self.open_transaction()
        if not state.registered:
            self.state = attrs.evolve(state, registered=True)

    def register(self, partitions: set[TopicPartition]) -> Step:
        """Protocol v1: AddPartitionsToTxn for the ``partitions`` not yet in the transaction (Done if none)."""
        state = self.open_transaction()
        missing = frozenset(partitions) - state.partitions
        if not missing:
            return Done()
        self.state = attrs.evolve(state, registered=True)  # from now on the coordinator may know the transaction
        self._operation = _Adding(missing)
        return AddPartitions(state.identity, missing)

    def _after_add(self, adding: _Adding, answer: Answer) -> Done:
        self._operation = None
        state = self.open_transaction()
        if isinstance(answer, AddAnswer) and answer.error == codes.NONE:
            self.state = attrs.evolve(state, partitions=state.partitions | adding.partitions)
            return Done()
        if isinstance(answer, NoAnswer):
            self.abortable(TransactionAbortableError(f"AddPartitionsToTxn got no answer: {answer.reason}"))
        assert isinstance(answer, AddAnswer)
        if answer.error in (codes.PRODUCER_FENCED, codes.INVALID_PRODUCER_EPOCH):
            self.fatal(fenced(self.transactional_id, codes.error_name(answer.error)))
        if answer.error == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            self.fatal(AuthorizationError(f"the principal may not write with transactional id "
                                          f"{self.transactional_id!r}: grant WRITE on it"))
        self.abortable(TransactionAbortableError(f"AddPartitionsToTxn failed: {codes.error_name(answer.error)}"))
        raise AssertionError("unreachable")

    def abortable(self, error: BaseException) -> None:
        """A write of the open transaction failed: it can now only be aborted. Raises ``error``."""
        state = self.state
        if isinstance(state, InTransaction):
            self.state = AbortableError(state.setup, state.identity, state.registered, error)
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

    # -- ending ------------------------------------------------------------------------------------------------------

    def end(self, *, commit: bool, operation: str, report: PreparedTxnState | None = None) -> Step:
        """Start the commit or abort of the transaction this producer holds, or retry one in progress."""
        state = self.state
        if isinstance(state, Ending):
            if state.commit != commit:
                raise self._illegal(operation, f"{'a commit' if state.commit else 'an abort'} of {state.target} is "
                                               "in progress; only the same decision may be retried")
            ending = attrs.evolve(state, report=report)
        elif isinstance(state, InTransaction | Prepared | AbortableError):
            if commit and isinstance(state, AbortableError):
                raise self._illegal(operation)
            if not state.registered:  # the coordinator never heard of it: ending it is local
                self.state = Ready(state.setup, state.identity)
                return self._ended(commit, report)
            ending = Ending(state.setup, state.identity.state(state.setup.transaction_version), commit, Owner.OWN,
                            state.identity, report)
        elif isinstance(state, Recovered):
            target = state.held
            if state.owner is Owner.KEPT_BY_BROKER:  # KIP-939: ended under the producer's new identity
                assert state.identity is not None
                target = state.identity.state(state.setup.transaction_version)
            ending = Ending(state.setup, target, commit, state.owner, state.identity, report)
        else:
            raise self._illegal(operation)
        self.state = ending
        cluster_version = ending.setup.transaction_version
        if commit:
            plan = Completion(self.transactional_id, ending.target, Goal.COMMIT,
                              end_version(ending.target, True, cluster_version))
        else:  # a resumed transaction's writer may still be alive, and must not reopen it at the same epoch
            plan = Completion.aborting(self.transactional_id, ending.target, cluster_version,
                                       writer_may_live=ending.owner is Owner.RESUMED)
        self._operation = plan
        return plan.start()

    def _after_end(self, settled: Settled) -> Step:
        ending = self.state
        assert isinstance(ending, Ending)
        self._operation = None
        if settled.outcome is not (TransactionOutcome.COMMITTED if ending.commit else TransactionOutcome.ABORTED):
            # an abort found the transaction committed: another producer completed it under this identity
            self.fatal(fenced(self.transactional_id, f"its transaction {ending.target} was committed by another "
                                                     f"producer ({settled.detail})"))
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

    def _ended(self, commit: bool, report: PreparedTxnState | None) -> Step:
        if report is not None:
            return self._look_up(report)
        return Done(TransactionOutcome.COMMITTED if commit else TransactionOutcome.ABORTED)

    # -- complete_transaction ----------------------------------------------------------------------------------------

    def complete(self, requested: PreparedTxnState) -> Step:
        """Start ``complete_transaction(requested)``: commit the held transaction if ``requested`` names it; else
        abort the held one, then report what became of ``requested``."""
        state = self.state
        held = _held(state)
        if held is not None:
            if requested == held and not requested.is_empty:
                if held.transaction_version is None and isinstance(state, Recovered):
                    self.state = attrs.evolve(state, held=requested)  # the caller's record says its protocol
                return self.end(commit=True, operation="complete_transaction")
            if isinstance(state, Ending) and state.commit:
                raise self._illegal("complete_transaction", f"a commit of {state.target} is in progress; "
                                                            f"{requested} names another transaction")
            return self.end(commit=False, operation="complete_transaction", report=requested)
        if isinstance(state, Ready | Unowned) and state.setup is not None:
            return self._look_up(requested)
        raise self._illegal("complete_transaction")

    def _look_up(self, requested: PreparedTxnState) -> Step:
        setup = getattr(self.state, "setup", None)
        if requested.is_empty or setup is None:
            return Done(TransactionOutcome.ABORTED)
        if requested.transaction_version is None and setup.transaction_version == 1:
            requested = attrs.evolve(requested, transaction_version=1)  # a v1 cluster never ran a v2 transaction
        version = requested.transaction_version or setup.transaction_version
        plan = Completion(self.transactional_id, requested, Goal.LOOK_UP, version)
        self._operation = plan
        return plan.start()

    def _after_look_up(self, plan: Completion, settled: Settled) -> Done:
        self._operation = None
        if settled.outcome is None:
            raise TransactionStateError(
                "complete_transaction", self.name.value,
                f"transactional id {self.transactional_id!r} has an ongoing transaction ({settled.detail}) that "
                "this producer did not recover; another producer may be using the id")
        if settled.fate is Fate.ABORTED:
            raise TransactionLostError(self.transactional_id, plan.requested.producer_id, plan.requested.epoch,
                                       f"the broker reports it aborted ({settled.detail})")
        return Done(settled.outcome)

    # -- answers -----------------------------------------------------------------------------------------------------

    def on_answer(self, answer: Answer) -> Step:
        """Continue the operation in progress with the answer to its last command."""
        operation = self._operation
        if isinstance(operation, _Adding):
            return self._after_add(operation, answer)
        if isinstance(answer, NoAnswer) and not isinstance(operation, Initialization | Beginning | Completion):
            self._operation = None
            raise BrokerUnavailableError(f"transactional id {self.transactional_id!r}: {answer.reason} (state "
                                         f"{self.name.value}; the call may be retried)")
        if isinstance(operation, Beginning):
            try:
                return self._began(operation, operation.on_answer(answer))
            except Exception as error:
                self._operation = None
                self.state = Fatal(error) if isinstance(error, FATAL) else operation.state
                raise
        if isinstance(operation, Initialization):
            return self._continue_init(operation, answer)
        if isinstance(operation, Completion):
            return self._continue_completion(operation, answer)
        raise TypeError(f"no operation in progress for {answer!r}")

    def _continue_init(self, plan: Initialization, answer: Answer) -> Step:
        try:
            step = plan.on_answer(answer)
        except Exception as error:
            self._operation = None
            if isinstance(error, FATAL):
                self.state = Fatal(error)
            raise
        if isinstance(step, Initialized):
            self._operation = None
            return self._initialized(plan, step)
        return step

    def _continue_completion(self, plan: Completion, answer: Answer) -> Step:
        try:
            step = plan.on_answer(answer)
        except BrokerUnavailableError:
            self._operation = None  # Ending stays: the same decision may be retried
            raise
        except Exception as error:
            self._operation = None
            state = self.state
            if not isinstance(state, Ending) or _retryable(error):
                raise  # the transaction may still be pending: Ending stays, the same decision may be retried
            if state.owner is Owner.RESUMED:
                self.state = Unowned(state.setup)  # settled as far as it can be; the producer carries on
                raise
            if isinstance(error, TransactionOutcomeUnknownError):
                # this producer's own transaction is no longer the id's: a newer producer took the id over
                error = fenced(self.transactional_id, f"ending its transaction {state.target}: {error.reason}")
            self.state = Fatal(error)
            raise error from None
        if not isinstance(step, Settled):
            return step
        if plan.goal is Goal.LOOK_UP:
            return self._after_look_up(plan, step)
        return self._after_end(step)

    def abandon(self) -> None:
        """The edge gave up on the operation in progress (its transport raised): the state stays as it is."""
        self._operation = None

    def close(self) -> None:
        """Closed; nothing is sent."""
        self._operation = None
        self.state = Closed()


def _retryable(error: Exception) -> bool:
    """Whether an end that failed with ``error`` may still be pending, so the same decision must stay retryable."""
    if isinstance(error, TransactionOutcomeUnknownError):
        return error.still_pending
    return isinstance(error, KafkaProtocolError) and not isinstance(error, AuthorizationError)


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
