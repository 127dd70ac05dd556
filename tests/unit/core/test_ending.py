"""What a failed end leaves: failed_end over every (owner, error), and every end of the producer (commit, abort,
complete of the held transaction, complete of another) over every kind of EndTxn answer and a lost one, run through
the real Completion and ProducerCore. The state it leaves and the error it raises always agree: FATAL_ERROR with a
FatalError, COMMITTING/ABORTING with a retriable error (the same end may be called again)."""

from __future__ import annotations

import pytest

from kafka2pc._core import codes
from kafka2pc._core.driver import drive
from kafka2pc._core.ending import failed_end
from kafka2pc._core.judge import TransactionOutcome
from kafka2pc._core.messages import (
    Described,
    DescribeTransaction,
    EndAnswer,
    EndTxn,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ObservedTransaction,
    ProducerIdentity,
)
from kafka2pc._core.producer_core import ProducerCore
from kafka2pc._core.retry import Retry
from kafka2pc._core.setup import TransactionSetup
from kafka2pc._core.states import Ending, Fatal, Owner, Prepared, Recovered, State, Unowned
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    FatalError,
    KafkaProtocolError,
    ProducerFencedError,
    RetriableError,
    TransactionLostError,
    TransactionNotSettledError,
    TransactionOutcomeUnknownError,
    UnsupportedByBrokerError,
)
from kafka2pc.prepared_state import PreparedTxnState

V2 = TransactionSetup(2, True, 60_000)
ME = ProducerIdentity(5, 3)
MINE = PreparedTxnState(5, 3, 2)
HELD = PreparedTxnState(4, 7, 2)  # an earlier producer's prepared transaction
ENDING = State.COMMITTING, State.ABORTING


def agrees(state: State, error: Exception) -> bool:
    """A FatalError exactly when the producer is dead; one that may be retried while an end is in progress."""
    if isinstance(error, FatalError) != (state is State.FATAL_ERROR):
        return False
    return state not in ENDING or isinstance(error, RetriableError)


# -- failed_end itself, over every (owner, error) ---------------------------------------------------------------------

OWNERS = {
    Owner.OWN: Ending(V2, MINE, True, Owner.OWN, ME),
    Owner.KEPT_BY_BROKER: Ending(V2, MINE, True, Owner.KEPT_BY_BROKER, ME),
    Owner.RESUMED: Ending(V2, HELD, True, Owner.RESUMED, None),
}
ERRORS = {
    "not settled": TransactionNotSettledError("t", "5:3", "no answer"),
    "broker unavailable": BrokerUnavailableError("no broker answered"),
    "protocol error": KafkaProtocolError("DescribeTransactions", "UNKNOWN_SERVER_ERROR", -1),
    "protocol error, unsupported": KafkaProtocolError("FindCoordinator", "UNSUPPORTED_VERSION",
                                                      codes.UNSUPPORTED_VERSION),
    "unauthorized": AuthorizationError("grant WRITE"),
    "fenced": ProducerFencedError("a newer producer"),
    "lost": TransactionLostError("t", 5, 3, "the broker aborted it"),
    "unsupported": UnsupportedByBrokerError("EndTxn v5"),
    "outcome unknown": TransactionOutcomeUnknownError("t", "5:3", "the id has moved on since"),
    "a bug": RuntimeError("a bug"),
}
#: (what the end failed with, whose transaction) -> (the state it leaves, the class it raises)
LEAVES = {
    ("not settled", "any"): (State.COMMITTING, TransactionNotSettledError),
    ("broker unavailable", "any"): (State.COMMITTING, BrokerUnavailableError),
    ("protocol error", "any"): (State.COMMITTING, TransactionNotSettledError),
    ("protocol error, unsupported", "any"): (State.FATAL_ERROR, UnsupportedByBrokerError),
    ("unauthorized", "any"): (State.FATAL_ERROR, AuthorizationError),
    ("fenced", "any"): (State.FATAL_ERROR, ProducerFencedError),
    ("lost", "any"): (State.FATAL_ERROR, TransactionLostError),
    ("unsupported", "any"): (State.FATAL_ERROR, UnsupportedByBrokerError),
    ("outcome unknown", Owner.OWN): (State.FATAL_ERROR, ProducerFencedError),
    ("outcome unknown", Owner.KEPT_BY_BROKER): (State.FATAL_ERROR, ProducerFencedError),
    ("outcome unknown", Owner.RESUMED): (State.RECOVERED_IDLE, TransactionOutcomeUnknownError),
    ("a bug", "any"): (State.COMMITTING, RuntimeError),
}


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("name", ERRORS)
def test_what_every_failure_of_every_owners_end_leaves(name, owner):
    ending, error = OWNERS[owner], ERRORS[name]
    left = failed_end("t", ending, error)
    expected_state, expected_class = LEAVES.get((name, owner)) or LEAVES[(name, "any")]
    core = ProducerCore("t")
    core.state = left.state
    assert (core.name, type(left.error)) == (expected_state, expected_class)
    if core.name is State.COMMITTING:
        assert left.state == ending  # the same end, under the same identity, may be retried
    if isinstance(left.state, Fatal):
        assert left.state.error is left.error  # every later call raises it
    if left.error is not error:
        assert left.error.__cause__ is error  # the cause is kept
    if not isinstance(error, RuntimeError):
        assert agrees(core.name, left.error)


def test_every_error_kafka2pc_raises_in_an_end_has_its_row():
    assert {name for name, _ in LEAVES} == set(ERRORS)


# -- every end of the producer, over every kind of EndTxn answer -------------------------------------------------------

#: one code of each kind (OTHER: one no kind covers)
CODES = {**{found: code for code, found in reversed(codes._KINDS.items())}, codes.Kind.OTHER: -1}
#: the EndTxn answer's kind -> how the end settles when the coordinator keeps answering it and the transaction stays
#: ongoing (None: it succeeds)
AFTER = {
    codes.Kind.DONE: None,
    codes.Kind.UNAUTHORIZED: (State.FATAL_ERROR, AuthorizationError),
    codes.Kind.UNSUPPORTED: (State.FATAL_ERROR, UnsupportedByBrokerError),
    # anything else says the end did not happen yet, or nothing about it: looked at, sent again, not settled
    **{found: ("ending", TransactionNotSettledError) for found in (
        codes.Kind.DUPLICATE, codes.Kind.COORDINATOR_BUSY, codes.Kind.PARTITION_BUSY, codes.Kind.TIMED_OUT,
        codes.Kind.UNKNOWN_TOPIC, codes.Kind.UNKNOWN_ID, codes.Kind.FENCED, codes.Kind.STALE,
        codes.Kind.TIMEOUT_REFUSED, codes.Kind.TOO_LARGE, codes.Kind.OTHER)},
}
#: the producer's ends: how to start it in a core holding a transaction, and its decision
ENDS = {
    "commit": (lambda core, held: core.end(commit=True), True),
    "abort": (lambda core, held: core.end(commit=False), False),
    "complete the held one": (lambda core, held: core.complete(held), True),
    "complete another": (lambda core, held: core.complete(PreparedTxnState(5, 1, 2)), False),
}
HOLDERS = {
    "prepared": (lambda: Prepared(V2, ME, registered=True), MINE),
    "recovered, kept by the broker": (lambda: Recovered(V2, MINE, Owner.KEPT_BY_BROKER, ME), MINE),
    "recovered, resumed": (lambda: Recovered(V2, HELD, Owner.RESUMED, None), HELD),
}


def test_every_kind_has_an_expectation():
    assert set(AFTER) == set(codes.Kind) == set(CODES)


class Coordinator:
    """Answers every EndTxn with ``answer`` and every look with the transaction still ongoing."""

    def __init__(self, target: PreparedTxnState, answer):
        self.answer, self.target = answer, ProducerIdentity.of(target)
        self.sent: list[type] = []

    def now(self):
        return 0.0

    def execute(self, transactional_id, command):
        self.sent.append(type(command))
        if isinstance(command, EndTxn):
            assert command.transaction == self.target  # always exactly the held transaction
            return self.answer
        if isinstance(command, DescribeTransaction):
            return Described(ObservedTransaction("Ongoing", self.target.producer_id, self.target.epoch))
        assert isinstance(command, InitProducerId)  # a v1 fence; never here
        return InitAnswer(codes.NONE, self.target)

    def execute_all(self, commands):
        return [self.execute(*pair) for pair in commands]


@pytest.mark.parametrize("holder", HOLDERS)
@pytest.mark.parametrize("end", ENDS)
@pytest.mark.parametrize("kind", [*codes.Kind, "no answer"], ids=str)
def test_every_end_over_every_answer_leaves_a_state_its_error_agrees_with(kind, end, holder):
    start, target = HOLDERS[holder]
    operation, commit = ENDS[end]
    core = ProducerCore("t", retry=Retry(total=0))  # a lost answer reaches the machine at once
    core.state = start()
    answer = NoAnswer("timed out", cause=TimeoutError("timed out")) if kind == "no answer" else \
        EndAnswer(CODES[kind], ProducerIdentity(target.producer_id, target.epoch + 1))
    coordinator = Coordinator(target, answer)
    expected = ("ending", TransactionNotSettledError) if kind == "no answer" else AFTER[kind]
    if expected is None and end == "complete another":
        # the held one was aborted; the one named is not the one the coordinator still shows: its fate is unknown
        expected = ("ended", TransactionOutcomeUnknownError)
    elif expected is None:
        assert drive(coordinator, "t", operation(core, target)) is \
            (TransactionOutcome.COMMITTED if commit else TransactionOutcome.ABORTED)
        assert core.name in (State.READY, State.RECOVERED_IDLE)
        return
    with pytest.raises(Exception) as raised:  # the class is checked below
        drive(coordinator, "t", operation(core, target))
    state, error_class = expected
    assert type(raised.value) is error_class, raised.value
    if state == "ending":
        assert core.name is (State.COMMITTING if commit else State.ABORTING)
        assert core.state.target == target  # the same end may be retried, under the same identity
    elif state == "ended":
        assert core.name in (State.READY, State.RECOVERED_IDLE)
    else:
        assert core.name is state
    assert agrees(core.name, raised.value)
    if kind == "no answer":
        assert isinstance(raised.value.__cause__, TimeoutError)  # NoAnswer's cause, chained
    elif kind in (codes.Kind.COORDINATOR_BUSY, codes.Kind.TIMED_OUT):  # sent again by Resending until its budget
        # (none here) is spent
        assert coordinator.sent == [EndTxn]
    elif error_class is TransactionNotSettledError:
        assert coordinator.sent.count(EndTxn) == 3  # looked at, sent again, then not settled


def test_a_retried_end_that_settles_goes_on():
    """After a TransactionNotSettledError the same call ends the same transaction."""
    core = ProducerCore("t", retry=Retry(total=0))
    core.state = Prepared(V2, ME, registered=True)
    with pytest.raises(TransactionNotSettledError):
        drive(Coordinator(MINE, EndAnswer(-1)), "t", core.end(commit=True))
    assert core.name is State.COMMITTING
    assert drive(Coordinator(MINE, EndAnswer(codes.NONE, ProducerIdentity(5, 4))), "t", core.end(commit=True)) \
        is TransactionOutcome.COMMITTED
    assert core.name is State.READY


# -- errors the edge raises instead of answering ---------------------------------------------------------------------

class Refusing:
    """Answers EndTxn with ``end``, and raises ``error`` instead of answering a look."""

    def __init__(self, end: int, error: Exception):
        self.end, self.error = end, error

    def now(self):
        return 0.0

    def execute(self, transactional_id, command):
        if isinstance(command, EndTxn):
            return EndAnswer(self.end)
        raise self.error


@pytest.mark.parametrize(("error", "state", "raised_class"), [
    (AuthorizationError("grant DESCRIBE"), State.FATAL_ERROR, AuthorizationError),
    (KafkaProtocolError("DescribeTransactions", "UNKNOWN_SERVER_ERROR", -1), State.COMMITTING,
     TransactionNotSettledError),
    (UnsupportedByBrokerError("DescribeTransactions"), State.FATAL_ERROR, UnsupportedByBrokerError),
])
def test_an_error_the_edge_raises_during_an_end_goes_through_the_core(error, state, raised_class):
    """Before, the driver let it pass the core by: the producer stayed COMMITTING while a FatalError was raised."""
    core = ProducerCore("t", retry=Retry(total=0))
    core.state = Prepared(V2, ME, registered=True)
    with pytest.raises(raised_class) as raised:
        drive(Refusing(codes.INVALID_TXN_STATE, error), "t", core.end(commit=True))
    assert core.name is state and agrees(core.name, raised.value)
    assert raised.value is error or raised.value.__cause__ is error


def test_a_report_of_a_lost_transaction_leaves_the_producer_fatal():
    """complete_transaction naming a transaction the broker aborted raises TransactionLostError, a FatalError: the
    producer is FATAL_ERROR (before, it stayed READY)."""
    core = ProducerCore("t", retry=Retry(total=0))
    core.state = Unowned(V2)
    step = core.complete(PreparedTxnState(5, 1, 2))
    assert isinstance(step.start(), DescribeTransaction)
    with pytest.raises(TransactionLostError):
        step.on_answer(Described(ObservedTransaction("CompleteAbort", 5, 2)))
    assert core.name is State.FATAL_ERROR


def test_a_report_whose_fate_is_unknown_leaves_the_producer_as_it_was():
    core = ProducerCore("t", retry=Retry(total=0))
    core.state = Unowned(V2)
    step = core.complete(PreparedTxnState(5, 1, 2))
    step.start()
    with pytest.raises(TransactionOutcomeUnknownError):
        step.on_answer(Described(ObservedTransaction("CompleteCommit", 5, 9)))
    assert core.name is State.RECOVERED_IDLE


def test_a_lost_answer_keeps_its_cause():
    core = ProducerCore("t", retry=Retry(total=0))
    core.state = Prepared(V2, ME, registered=True)
    cause = ConnectionResetError("reset by peer")
    step = core.end(commit=True)
    assert step.start() == EndTxn(ME, True, 2)
    with pytest.raises(TransactionNotSettledError) as raised:
        step.on_answer(NoAnswer("connection lost", cause=cause))
    assert raised.value.__cause__ is cause
    assert core.name is State.COMMITTING
