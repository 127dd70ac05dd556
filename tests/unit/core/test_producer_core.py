"""ProducerCore without I/O: every operation in every state, and the command sequences of the paths that matter
(each numbered finding of the "core correctness" issue has its scenario here)."""

from __future__ import annotations

import pytest

from kafka2pc._core import codes
from kafka2pc._core.judge import TransactionOutcome
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import (
    AddAnswer,
    AddPartitions,
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
from kafka2pc._core.states import (
    Closed,
    Ending,
    Fatal,
    InTransaction,
    Owner,
    Prepared,
    Ready,
    Recovered,
    State,
    Unowned,
    WriteFailed,
)
from kafka2pc._core.transitions import TRANSITIONS, Operation
from kafka2pc.errors import (
    BrokerUnavailableError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionNotSettledError,
    TransactionOutcomeUnknownError,
    TransactionStateError,
)
from kafka2pc.prepared_state import PreparedTxnState

V1 = TransactionSetup(1, False, 60_000)
V2 = TransactionSetup(2, True, 60_000)
ME = ProducerIdentity(5, 3)
HELD = PreparedTxnState(5, 3, 1)


def core_in(state) -> ProducerCore:
    """A core in ``state`` that never sends a command again by itself (as if every resend budget were spent):
    what a lost answer does to the operation is the point here (test_resend.py has the resending)."""
    core = ProducerCore("t-0", retry=Retry(total=0))
    core.state = state
    return core


def exchange(operation, *script, step=None):
    """Drive an operation of the core from its start (or from ``step``): ``script`` alternates the expected command
    and the answer to give it. Returns the last step."""
    step = operation.start() if step is None else step
    for expected, answer in zip(script[::2], script[1::2], strict=True):
        if isinstance(expected, DescribeTransaction):  # how long it waits first is not the point here
            assert isinstance(step, DescribeTransaction)
        else:
            assert step == expected
        step = operation.on_answer(answer)
    return step


# -- every operation in every state ----------------------------------------------------------------------------------

STATES = {
    "UNINITIALIZED": Unowned(None),
    "RECOVERED_IDLE": Unowned(V2),
    "READY": Ready(V2, ME),
    "IN_TRANSACTION": InTransaction(V2, ME, registered=True),
    "PREPARED": Prepared(V2, ME, registered=True),
    "RECOVERED_PREPARED": Recovered(V2, HELD, Owner.RESUMED, None),
    "COMMITTING": Ending(V2, HELD, True, Owner.RESUMED, None),
    "ABORTING": Ending(V2, HELD, False, Owner.OWN, ME),
    "ABORTABLE_ERROR": WriteFailed(V2, ME, True, TransactionAbortableError("write failed")),
    "CLOSED": Closed(),
}
OPERATIONS = {
    "init": lambda core: core.init(keep_prepared=False, two_phase_wanted=True, init_producer_id_max_version=6,
                                   transaction_version=2, timeout_ms=None),
    "begin": lambda core: core.begin(),
    "produce": lambda core: core.open_transaction(),
    "prepare": lambda core: core.prepare(),
    "commit": lambda core: core.end(commit=True),
    "abort": lambda core: core.end(commit=False),
    "complete-held": lambda core: core.complete(HELD),
    "complete-other": lambda core: core.complete(PreparedTxnState(5, 1)),
}
#: the states in which the producer holds a transaction (complete_transaction commits it or aborts it)
HOLDING = {"PREPARED", "RECOVERED_PREPARED", "COMMITTING", "ABORTING"}
#: the table's name of each operation above
TABLE_OPERATION = {
    "init": Operation.INIT, "begin": Operation.BEGIN, "produce": Operation.WRITE, "prepare": Operation.PREPARE,
    "commit": Operation.COMMIT, "abort": Operation.ABORT, "complete-held": Operation.COMPLETE_HELD,
    "complete-other": Operation.COMPLETE_OTHER,
}


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("name", STATES)
def test_every_operation_in_every_state(name, operation):
    core = core_in(STATES[name])
    assert core.name.value == name
    table_operation = TABLE_OPERATION[operation]
    if operation.startswith("complete") and name not in HOLDING:
        table_operation = Operation.LOOK_UP
    if (State[name], table_operation) in TRANSITIONS:
        OPERATIONS[operation](core)
        return
    with pytest.raises(TransactionStateError) as info:
        OPERATIONS[operation](core)
    assert info.value.state == name
    assert core.state == STATES[name]  # an illegal call changes nothing


@pytest.mark.parametrize("operation", OPERATIONS)
def test_fatal_state_raises_its_error_on_every_call(operation):
    fenced = ProducerFencedError("fenced")
    core = core_in(Fatal(fenced))
    with pytest.raises(ProducerFencedError) as info:
        OPERATIONS[operation](core)
    assert info.value is fenced


# -- finding 1: a resumed transaction is retried under its own identity ---------------------------------------------

@pytest.mark.parametrize("retry", ["complete", "commit"])
def test_resumed_commit_retried_after_timeout_ends_the_resumed_transaction(retry):
    """Protocol v1, protocol-level resume: the EndTxn times out; the retry must send the same EndTxn under the resumed
    producer id and epoch (never end locally, never InitProducerId, which would abort the decided transaction)."""
    core = core_in(Recovered(V1, HELD, Owner.RESUMED, None))
    commit_held = EndTxn(ME, True, 1)
    with pytest.raises(BrokerUnavailableError):
        exchange(core.complete(HELD), commit_held, NoAnswer("timed out"))
    assert core.state == Ending(V1, HELD, True, Owner.RESUMED, None)
    again = core.complete(HELD) if retry == "complete" else core.end(commit=True)
    assert exchange(again, commit_held, EndAnswer(codes.NONE)) == Finished(TransactionOutcome.COMMITTED)
    # finding 5: no InitProducerId right after the commit (a failure there would make the call raise after success)
    assert core.state == Unowned(V1)
    with pytest.raises(TransactionStateError):
        core.end(commit=False)  # a retry may not change the decision


def test_resumed_commit_in_progress_refuses_another_decision():
    core = core_in(Ending(V1, HELD, True, Owner.RESUMED, None))
    with pytest.raises(TransactionStateError, match="a commit of 5:3 is in progress"):
        core.complete(PreparedTxnState(5, 1))


# -- finding 2: v1 epochs stay unique across producers; nothing pending is not "aborted" -----------------------------

def looked(state: str, epoch: int, pid: int = 5) -> Described:
    return Described(ObservedTransaction(state, pid, epoch))


def bump(epoch: int, setup=V1) -> InitProducerId:
    return InitProducerId(60_000, expected=ProducerIdentity(5, epoch), enable_2pc=setup.two_phase)


def test_v1_successor_leaves_two_epochs_before_its_first_transaction():
    core = core_in(Unowned(V1))  # after a keep-prepared recovery settled the resumed transaction
    step = exchange(core.begin(), DescribeTransaction(), looked("CompleteAbort", 4), InitProducerId(60_000),
                    InitAnswer(codes.NONE, ProducerIdentity(5, 5)),
                    DescribeTransaction(), looked("Empty", 5), bump(5), InitAnswer(codes.NONE, ProducerIdentity(5, 6)))
    assert step == Finished(None) and core.state == InTransaction(V1, ProducerIdentity(5, 6))


def test_a_producer_without_an_identity_starts_afresh_on_an_unknown_id_too():
    core = core_in(Unowned(V1))
    step = exchange(core.begin(), DescribeTransaction(), Described(None), InitProducerId(60_000),
                    InitAnswer(codes.NONE, ProducerIdentity(5, 0)),
                    DescribeTransaction(), looked("Empty", 0), bump(0), InitAnswer(codes.NONE, ProducerIdentity(5, 1)))
    assert step == Finished(None) and core.state == InTransaction(V1, ProducerIdentity(5, 1))


@pytest.mark.parametrize("seen", ["Ongoing", "PrepareCommit"])
def test_a_producer_without_an_identity_never_inits_over_a_transaction_it_does_not_hold(seen):
    """An open transaction may be a successor's, decided: a fresh InitProducerId would abort it. One being ended is
    looked at again until it settles; one that stays open means the id is another producer's."""
    core = core_in(Unowned(V1))
    begin = core.begin()
    step = begin.start()
    if seen != "Ongoing":
        step = exchange(begin, DescribeTransaction(), looked(seen, 7), step=step)
    with pytest.raises(ProducerFencedError, match="does not hold"):
        exchange(begin, DescribeTransaction(), looked("Ongoing", 7), step=step)
    assert core.name is State.FATAL_ERROR


def test_v1_producer_bumps_twice_between_its_transactions_each_after_a_look():
    """Review finding 1: each bump is sent only after DescribeTransactions showed the id at exactly this producer's
    identity and in no transaction, once."""
    core = core_in(Prepared(V1, ME, registered=True))
    done = exchange(core.end(commit=True), EndTxn(ME, True, 1),
                    EndAnswer(codes.NONE))
    assert done == Finished(TransactionOutcome.COMMITTED) and core.state == Ready(V1, ME, bumps_due=2)
    step = exchange(core.begin(), DescribeTransaction(), looked("CompleteCommit", 3), bump(3),
                    InitAnswer(codes.NONE, ProducerIdentity(5, 4)), DescribeTransaction(), looked("Empty", 4), bump(4),
                    InitAnswer(codes.NONE, ProducerIdentity(5, 5)))
    assert step == Finished(None) and core.state == InTransaction(V1, ProducerIdentity(5, 5))


def test_a_bump_is_never_sent_onto_someone_elses_transaction():
    """Review finding 1: a producer with bumps still due finds its id in another producer's transaction: it raises
    fenced and sends no InitProducerId (which Kafka would answer by aborting that transaction)."""
    core = core_in(Ready(V1, ME, bumps_due=2))
    with pytest.raises(ProducerFencedError, match="no bump was sent"):
        exchange(core.begin(), DescribeTransaction(), looked("Ongoing", 5))
    assert core.name is State.FATAL_ERROR


@pytest.mark.parametrize(("answer", "fenced_now"), [
    (InitAnswer(codes.NONE, ProducerIdentity(5, 4)), False),  # KIP-360: a retry of a bump that landed, unchanged
    (InitAnswer(codes.PRODUCER_FENCED), True),                # another producer's InitProducerId moved the epoch
])
def test_a_lost_bump_answer_is_looked_at_again_never_resent_blindly(answer, fenced_now):
    core = core_in(Ready(V1, ME, bumps_due=1))
    with pytest.raises(BrokerUnavailableError, match="may be retried"):
        exchange(core.begin(), DescribeTransaction(), looked("CompleteCommit", 3), bump(3), NoAnswer("lost"))
    assert core.state == Ready(V1, ME, bumps_due=1, bump_in_doubt=True)
    begin = core.begin()
    step = exchange(begin, DescribeTransaction(), looked("Empty", 4))
    assert step == bump(3)
    if fenced_now:
        with pytest.raises(ProducerFencedError):
            begin.on_answer(answer)
        return
    assert begin.on_answer(answer) == Finished(None) and core.state == InTransaction(V1, ProducerIdentity(5, 4))


def test_a_bump_in_doubt_never_lands_on_a_transaction():
    core = core_in(Ready(V1, ME, bumps_due=1, bump_in_doubt=True))
    with pytest.raises(ProducerFencedError, match="no bump was sent"):
        exchange(core.begin(), DescribeTransaction(), looked("Ongoing", 4))


def test_v1_abort_after_a_coordinator_timeout_continues_from_the_bumped_epoch():
    """Review finding 6: the coordinator aborted the transaction on timeout (CompleteAbort at e + 1, its last epoch
    forgotten); the producer continues from e + 1 with one bump, instead of a spurious PRODUCER_FENCED."""
    core = core_in(WriteFailed(V1, ME, True, TransactionAbortableError("timed out")))
    done = exchange(core.end(commit=False), EndTxn(ME, False, 1),
                    EndAnswer(codes.PRODUCER_FENCED), DescribeTransaction(), looked("CompleteAbort", 4))
    assert done == Finished(TransactionOutcome.ABORTED) and core.state == Ready(V1, ProducerIdentity(5, 4), 1)
    assert exchange(core.begin(), DescribeTransaction(), looked("CompleteAbort", 4), bump(4),
                    InitAnswer(codes.NONE, ProducerIdentity(5, 5))) == Finished(None)


def test_resumed_end_failing_with_an_unexpected_error_stays_retryable():
    """Review finding 4: an EndTxn error other than a lost answer must not drop the held decision. It is looked
    into; still ongoing after the EndTxn sent again, it is not settled: a retriable error, the decision kept."""
    core = core_in(Recovered(V2, HELD, Owner.RESUMED, None))
    ongoing = looked("Ongoing", 3)
    with pytest.raises(TransactionNotSettledError):
        exchange(core.complete(HELD), EndTxn(ME, True, 1), EndAnswer(-1), DescribeTransaction(), ongoing,
                 EndTxn(ME, True, 1), EndAnswer(-1), DescribeTransaction(), ongoing,
                 EndTxn(ME, True, 1), EndAnswer(-1), DescribeTransaction(), ongoing)
    assert core.name is State.COMMITTING
    assert exchange(core.complete(HELD), EndTxn(ME, True, 1), EndAnswer(codes.NONE)) == \
        Finished(TransactionOutcome.COMMITTED)


def test_a_stale_state_is_unknown_not_aborted_not_lost():
    core = core_in(Ready(V1, ProducerIdentity(5, 9)))
    with pytest.raises(TransactionOutcomeUnknownError, match="moved on") as info:
        exchange(core.complete(PreparedTxnState(5, 3)), DescribeTransaction(),
                 Described(ObservedTransaction("CompleteCommit", 5, 9)))
    assert info.value.observed == "CompleteCommit at 5:9"
    assert core.state == Ready(V1, ProducerIdentity(5, 9))


# -- finding 3: never run a transaction whose end would exhaust the epoch --------------------------------------------

def test_v2_rotates_the_producer_id_before_an_exhausting_transaction():
    core = core_in(Ready(V2, ProducerIdentity(5, 32766)))
    step = exchange(core.begin(), DescribeTransaction(), looked("CompleteCommit", 32766), bump(32766, V2),
                    InitAnswer(codes.NONE, ProducerIdentity(9, 0)))
    assert step == Finished(None) and core.state == InTransaction(V2, ProducerIdentity(9, 0))


def test_v2_last_usable_epoch_needs_no_bump_and_ends_at_the_next():
    last = ProducerIdentity(5, 32765)
    core = core_in(Ready(V2, last))
    assert core.begin().start() == Finished(None)
    core.note_sent()
    assert core.prepare() == PreparedTxnState(5, 32765)
    step = core.end(commit=True)
    assert exchange(step, EndTxn(last, True, 2), EndAnswer(codes.NONE, ProducerIdentity(5, 32766))) == \
        Finished(TransactionOutcome.COMMITTED)
    assert core.state == Ready(V2, ProducerIdentity(5, 32766))


# -- finding 5: a v1 abort of a transaction the coordinator never registered is an abort, not fencing ---------------

def test_v1_abort_after_failed_add_partitions_is_not_fencing():
    core = core_in(InTransaction(V1, ME))
    register = core.register({("t", 0)})
    assert register.start() == AddPartitions(ME, frozenset({("t", 0)}))
    with pytest.raises(TransactionAbortableError):
        register.on_answer(AddAnswer(codes.TOPIC_AUTHORIZATION_FAILED))
    step = core.end(commit=False)
    done = exchange(step, EndTxn(ME, False, 1), EndAnswer(codes.INVALID_TXN_STATE),
                    DescribeTransaction(), looked("Empty", 3))
    assert done == Finished(TransactionOutcome.ABORTED)
    assert core.state == Ready(V1, ME, bumps_due=2)


def test_prepared_state_records_the_transaction_protocol():
    for setup in (V1, V2):
        core = core_in(InTransaction(setup, ME, registered=True))
        assert core.prepare().transaction_version == setup.transaction_version


# -- empty transactions ----------------------------------------------------------------------------------------------

def test_a_transaction_that_wrote_nothing_prepares_empty_and_ends_locally():
    core = core_in(InTransaction(V2, ME))
    assert core.prepare().is_empty
    assert core.complete(PreparedTxnState.empty()).start() == Finished(TransactionOutcome.ABORTED)  # nothing sent
    assert core.state == Ready(V2, ME)


def test_own_commit_answered_fenced_and_taken_over_is_fencing():
    core = core_in(Prepared(V2, ME, registered=True))
    step = core.end(commit=True)
    with pytest.raises(ProducerFencedError, match="owned by a newer producer"):
        exchange(step, EndTxn(ME, True, 2), EndAnswer(codes.PRODUCER_FENCED),
                 DescribeTransaction(), Described(ObservedTransaction("Empty", 5, 5)))
    assert core.name is State.FATAL_ERROR


# -- second review -------------------------------------------------------------------------------------------------

def test_a_bump_refused_for_any_other_reason_looks_again_and_never_starts_afresh():
    """Second review F1: UNKNOWN_SERVER_ERROR (a bump at an exhausted epoch that another producer's init overtook)
    must not lead to a fresh InitProducerId, which Kafka checks against nothing: a look finds the successor."""
    core = core_in(Ready(V1, ProducerIdentity(5, 32765), bumps_due=1))
    with pytest.raises(ProducerFencedError, match="no bump was sent"):
        exchange(core.begin(), DescribeTransaction(), looked("CompleteCommit", 32765), bump(32765),
                 InitAnswer(-1), DescribeTransaction(), looked("Empty", 32766))


@pytest.mark.parametrize("code", [codes.NOT_COORDINATOR, codes.COORDINATOR_NOT_AVAILABLE,
                                  codes.CONCURRENT_TRANSACTIONS])
def test_a_bump_answered_busy_or_moved_is_in_doubt_and_looked_at(code):
    """Second review F2: Kafka can answer these after it applied the bump; the producer looks before anything."""
    core = core_in(Ready(V1, ME, bumps_due=1))
    begin = core.begin()
    step = exchange(begin, DescribeTransaction(), looked("CompleteCommit", 3), bump(3), InitAnswer(code))
    assert isinstance(step, DescribeTransaction)
    assert exchange(begin, DescribeTransaction(), looked("Empty", 4), bump(3),
                    InitAnswer(codes.NONE, ProducerIdentity(5, 4)), step=step) == Finished(None)


def test_an_expired_id_is_never_initialised_afresh_by_a_bump():
    core = core_in(Ready(V1, ME, bumps_due=1))
    with pytest.raises(ProducerFencedError, match="expired"):
        exchange(core.begin(), DescribeTransaction(), Described(None))
