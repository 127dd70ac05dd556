"""Completion: the commands it sends and what it concludes, for commit, abort and look-up."""

import attrs
import pytest

from kafka2pc._core import codes
from kafka2pc._core.completion import Completion, Goal, Phase
from kafka2pc._core.judge import Fate, TransactionOutcome
from kafka2pc._core.machine import Finished
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
from kafka2pc._core.retry import END_LOOKS
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    TransactionLostError,
    TransactionNotSettledError,
    TransactionOutcomeUnknownError,
    UnsupportedByBrokerError,
)
from kafka2pc.prepared_state import PreparedTxnState

R = PreparedTxnState(7, 10)
ID = ProducerIdentity(7, 10)


def run(completion, *answers):
    """Feed ``answers`` one by one; returns (commands sent, final result)."""
    sent = [completion.start()]
    result = None
    for answer in answers:
        result = completion.on_answer(answer)
        if isinstance(result, Finished):
            return sent, result.result
        sent.append(result)
    return sent, result


def commit(tv=2):
    return Completion("t", PreparedTxnState(7, 10, tv), Goal.COMMIT, tv)


def test_commit_is_one_end_txn_when_it_succeeds():
    sent, settled = run(commit(), EndAnswer(codes.NONE, ProducerIdentity(7, 11)))
    assert sent == [EndTxn(ID, True, 2)]
    assert settled.outcome is TransactionOutcome.COMMITTED and settled.ended_now
    assert settled.next_identity == ProducerIdentity(7, 11)


def test_commit_of_an_aborted_transaction_is_lost():
    with pytest.raises(TransactionLostError, match="the broker aborted it"):
        run(commit(), EndAnswer(codes.INVALID_TXN_STATE), Described(ObservedTransaction("CompleteAbort", 7, 11)))


def test_commit_retry_after_success_elsewhere_reports_committed():
    sent, settled = run(commit(1), EndAnswer(codes.PRODUCER_FENCED),
                        Described(ObservedTransaction("CompleteCommit", 7, 10)))
    assert sent == [EndTxn(ID, True, 1), DescribeTransaction()]
    assert settled.outcome is TransactionOutcome.COMMITTED and not settled.ended_now


def test_authorization_failure_is_not_retried():
    completion = commit()
    completion.start()
    with pytest.raises(AuthorizationError, match="grant WRITE"):
        completion.on_answer(EndAnswer(codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))


def test_an_end_refused_as_unsupported_is_not_retried():
    completion = commit()
    completion.start()
    with pytest.raises(UnsupportedByBrokerError, match=r"refused EndTxn .* \(UNSUPPORTED_VERSION\)"):
        completion.on_answer(EndAnswer(codes.UNSUPPORTED_VERSION))


@pytest.mark.parametrize("code", [-1, codes.UNKNOWN_TOPIC_OR_PARTITION, 19])  # unknown; NOT_ENOUGH_REPLICAS
@pytest.mark.parametrize(("seen", "outcome"), [
    ("CompleteCommit", TransactionOutcome.COMMITTED),  # it landed after all
    ("Ongoing", None),                                 # it did not: sent again
])
def test_an_error_that_says_nothing_about_the_end_is_looked_into(code, seen, outcome):
    """Before, such an answer raised KafkaProtocolError (a FatalError) while the producer stayed COMMITTING. The
    coordinator answers, so what it holds settles it: v2's commit at 7:10 ends as CompleteCommit at 7:11."""
    completion = commit()
    completion.start()
    assert completion.on_answer(EndAnswer(code)) == DescribeTransaction()
    step = completion.on_answer(Described(ObservedTransaction(seen, 7, 11 if outcome else 10)))
    if outcome is None:
        assert step == EndTxn(ID, True, 2)
    else:
        assert isinstance(step, Finished) and step.result.outcome is outcome and not step.result.ended_now


def test_no_answer_raises_and_says_the_outcome_is_open():
    completion = commit()
    completion.start()
    cause = TimeoutError("request timed out")
    with pytest.raises(TransactionNotSettledError, match="not known yet: retry") as raised:
        completion.on_answer(NoAnswer("timed out", cause=cause))
    assert isinstance(raised.value, BrokerUnavailableError) and raised.value.retriable()
    assert raised.value.__cause__ is cause


@pytest.mark.parametrize("code", [codes.PRODUCER_FENCED, -1])
def test_still_pending_after_errors_is_not_settled_and_may_be_retried(code):
    """Before, this raised TransactionOutcomeUnknownError(still_pending=True), whose class says "not ongoing": the
    dual writer's recovery and the listing's abort read it as ended."""
    pending = Described(ObservedTransaction("Ongoing", 7, 10))
    refused = EndAnswer(code)
    with pytest.raises(TransactionNotSettledError, match="still ongoing after 3 EndTxn requests") as raised:
        run(commit(), refused, pending, refused, pending, refused, pending)
    assert raised.value.retriable() and not raised.value.fatal()


def test_look_ups_back_off_while_the_coordinator_writes_markers_and_are_bounded():
    completion = Completion("t", R, Goal.LOOK_UP, 2, looks=attrs.evolve(END_LOOKS, total=3))
    in_flux = Described(ObservedTransaction("PrepareCommit", 7, 11))
    assert completion.start() == DescribeTransaction()
    delays = [completion.on_answer(in_flux).after_s for _ in range(3)]
    assert delays == sorted(delays) and delays[0] > 0
    with pytest.raises(TransactionNotSettledError, match="no settled answer after 4 look-ups"):
        completion.on_answer(in_flux)


def test_an_error_that_says_nothing_about_a_v1_abort_is_checked_like_a_lost_answer():
    """The v4 abort of a writer that may live: it may have landed, so the look decides whether to fence."""
    completion = Completion("t", R, Goal.ABORT, 1, fence_after_abort=True)
    completion.start()
    assert completion.on_answer(EndAnswer(-1)) == DescribeTransaction()
    assert completion.phase is Phase.CHECKING_LOST_ABORT
    assert completion.on_answer(Described(ObservedTransaction("CompleteAbort", 7, 10))) == \
        InitProducerId(1000, expected=ID)


def test_abort_is_conditional_and_fences_on_v1_after_looking():
    """The fence is an InitProducerId naming the aborted identity, sent once and only while the id is still at it:
    Kafka checks only the producer id when a transaction is Ongoing, so a blind fence could abort a newer one."""
    aborted = Described(ObservedTransaction("CompleteAbort", 7, 10))
    sent, settled = run(Completion("t", R, Goal.ABORT, 1, fence_after_abort=True),
                        EndAnswer(codes.NONE), Described(ObservedTransaction("PrepareAbort", 7, 10)), aborted,
                        InitAnswer(codes.CONCURRENT_TRANSACTIONS), aborted, InitAnswer(codes.NONE, ID))
    fence = InitProducerId(1000, expected=ID)
    assert [type(c).__name__ for c in sent] == ["EndTxn", "DescribeTransaction", "DescribeTransaction",
                                                "InitProducerId", "DescribeTransaction", "InitProducerId"]
    assert sent[0] == EndTxn(ID, False, 1) and sent[3] == sent[5] == fence
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is True


@pytest.mark.parametrize("code", [codes.CONCURRENT_TRANSACTIONS, codes.REQUEST_TIMED_OUT])
def test_a_v1_fence_that_may_have_acted_is_looked_at_before_it_is_sent_again(code):
    """A fence answered busy, or REQUEST_TIMED_OUT (the broker gave up waiting: it may have landed), is looked at
    and sent again only while the id is still at the aborted identity. Before, REQUEST_TIMED_OUT reported the abort
    not fenced at once."""
    aborted = Described(ObservedTransaction("CompleteAbort", 7, 10))
    sent, settled = run(Completion("t", R, Goal.ABORT, 1, fence_after_abort=True), EndAnswer(codes.NONE), aborted,
                        InitAnswer(code), aborted, InitAnswer(codes.NONE, ProducerIdentity(7, 11)))
    assert [type(c).__name__ for c in sent] == ["EndTxn", "DescribeTransaction", "InitProducerId",
                                                "DescribeTransaction", "InitProducerId"]
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is True


def test_v1_fence_never_lands_on_a_newer_transaction():
    sent, settled = run(Completion("t", R, Goal.ABORT, 1, fence_after_abort=True),
                        EndAnswer(codes.NONE), Described(ObservedTransaction("Ongoing", 7, 12)))
    assert not any(isinstance(c, InitProducerId) for c in sent)
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is True  # the new owner fenced it


def test_v1_fence_that_fails_is_reported():
    """The fence got no answer and the looks after it (a bounded number: each may wait a full timeout) got none
    either: aborted, not known to be fenced."""
    sent, settled = run(Completion("t", R, Goal.ABORT, 1, fence_after_abort=True), EndAnswer(codes.NONE),
                        Described(ObservedTransaction("CompleteAbort", 7, 10)), *[NoAnswer("lost")] * 10)
    assert [type(c).__name__ for c in sent] == ["EndTxn", "DescribeTransaction", "InitProducerId",
                                                *["DescribeTransaction"] * 4]
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is False


def test_v1_fence_whose_look_gets_no_answer_looks_again():
    sent, settled = run(Completion("t", R, Goal.ABORT, 1, fence_after_abort=True), EndAnswer(codes.NONE),
                        NoAnswer("lost"), Described(ObservedTransaction("CompleteAbort", 7, 10)),
                        InitAnswer(codes.NONE, ProducerIdentity(7, 11)))
    assert [type(c).__name__ for c in sent] == ["EndTxn", "DescribeTransaction", "DescribeTransaction",
                                                "InitProducerId"]
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is True


@pytest.mark.parametrize(("after", "fenced", "bumps"), [
    ("CompleteAbort", True, 2),   # the fence never arrived: bumped again, still only at exactly the aborted identity
    ("Empty", True, 1),            # it landed (7:11): fenced, nothing more is sent
])
def test_v1_fence_without_an_answer_is_looked_up_before_it_is_sent_again(after, fenced, bumps):
    aborted = Described(ObservedTransaction("CompleteAbort", 7, 10))
    looked = Described(ObservedTransaction(after, 7, 10 if after == "CompleteAbort" else 11))
    sent, settled = run(Completion("t", R, Goal.ABORT, 1, fence_after_abort=True), EndAnswer(codes.NONE), aborted,
                        NoAnswer("lost"), looked, InitAnswer(codes.NONE, ProducerIdentity(7, 11)))
    assert sum(isinstance(c, InitProducerId) for c in sent) == bumps
    assert all(c == InitProducerId(1000, expected=ID) for c in sent if isinstance(c, InitProducerId))
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is fenced


@pytest.mark.parametrize(("seen", "expected"), [
    # the abort landed: fence it, as after an answer
    ("CompleteAbort", ["EndTxn", "DescribeTransaction", "InitProducerId"]),
    # it never arrived: the (epoch-exact) abort again, then the fence
    ("Ongoing", ["EndTxn", "DescribeTransaction", "EndTxn", "DescribeTransaction", "InitProducerId"]),
])
def test_a_v1_abort_without_an_answer_is_looked_up_and_still_fenced(seen, expected):
    """A lost answer to a v4 abort of a transaction whose writer may live must not skip the fence: the writer
    could otherwise reopen a transaction at the aborted epoch (model-based counterexample)."""
    aborted = Described(ObservedTransaction("CompleteAbort", 7, 10))
    answers = [NoAnswer("lost"), Described(ObservedTransaction(seen, 7, 10))]
    if seen == "Ongoing":
        answers += [EndAnswer(codes.NONE), aborted]
    sent, last = run(Completion("t", R, Goal.ABORT, 1, fence_after_abort=True), *answers)
    assert [type(c).__name__ for c in sent] == expected
    assert all(c == EndTxn(ID, False, 1) for c in sent if isinstance(c, EndTxn))
    assert last == InitProducerId(1000, expected=ID)


def test_a_v1_abort_without_an_answer_and_nothing_to_look_at_raises():
    completion = Completion("t", R, Goal.ABORT, 1, fence_after_abort=True)
    completion.start()
    assert isinstance(completion.on_answer(NoAnswer("lost")), DescribeTransaction)
    with pytest.raises(BrokerUnavailableError, match="not known yet"):
        completion.on_answer(NoAnswer("lost"))


def test_an_abort_of_an_unrecorded_protocol_on_v2_ends_an_ongoing_transaction_with_a_bump():
    """On a v2 cluster the abort of a bare handle looks first: ongoing at exactly its identity, it is aborted with
    EndTxn v5, which bumps the epoch at once, so its writer cannot reopen it; no fence is needed."""
    completion = Completion.aborting("t", R, 2, writer_may_live=True)
    sent, settled = run(completion, Described(ObservedTransaction("Ongoing", 7, 10)),
                        EndAnswer(codes.NONE, ProducerIdentity(7, 11)))
    assert sent == [DescribeTransaction(), EndTxn(ID, False, 2, guarded_by_look=True)]  # never resent blindly
    assert settled.outcome is TransactionOutcome.ABORTED and settled.next_identity == ProducerIdentity(7, 11)


@pytest.mark.parametrize("state", ["CompleteCommit", "CompleteAbort", "Empty"])
def test_an_abort_of_an_unrecorded_protocol_on_v2_takes_the_v4_path_unless_ongoing(state):
    """Finished at its epoch, it may be a v1 commit that a v5 abort would hide: v4, as without the look."""
    completion = Completion.aborting("t", R, 2, writer_may_live=True)
    sent = [completion.start(), completion.on_answer(Described(ObservedTransaction(state, 7, 10)))]
    assert sent == [DescribeTransaction(), EndTxn(ID, False, 1)]


def test_an_abort_of_a_recorded_protocol_sends_it_without_looking():
    assert Completion.aborting("t", PreparedTxnState(7, 10, 2), 2, writer_may_live=True).start() == \
        EndTxn(ID, False, 2)
    v1 = Completion.aborting("t", PreparedTxnState(7, 10, 1), 2, writer_may_live=True)
    assert v1.start() == EndTxn(ID, False, 1) and v1.fence_after_abort
    assert not Completion.aborting("t", PreparedTxnState(7, 10, 1), 1, writer_may_live=False).fence_after_abort


def test_abort_finding_it_committed_reports_committed():
    _, settled = run(Completion("t", R, Goal.ABORT, 2), EndAnswer(codes.INVALID_TXN_STATE),
                        Described(ObservedTransaction("CompleteCommit", 7, 11)))
    assert settled.outcome is TransactionOutcome.COMMITTED and settled.fate is Fate.COMMITTED


def test_abort_of_a_transaction_replaced_since_touches_nothing_else():
    """The id has a newer transaction (7:12) when the abort of 7:10 arrives: the EndTxn, conditional on 7:10, is
    refused, and nothing is sent for 7:12."""
    with pytest.raises(TransactionOutcomeUnknownError) as info:
        run(Completion("t", R, Goal.ABORT, 2), EndAnswer(codes.PRODUCER_FENCED),
            Described(ObservedTransaction("Ongoing", 7, 12)))
    assert info.value.other_pending == "7:12"


def test_look_up_reports_without_ending_anything():
    sent, settled = run(Completion("t", R, Goal.LOOK_UP, 2), Described(ObservedTransaction("Ongoing", 7, 10)))
    assert sent == [DescribeTransaction()]
    assert settled.outcome is None and settled.pending == ID


def test_empty_transactions_cannot_be_committed_or_aborted():
    for goal in (Goal.COMMIT, Goal.ABORT):
        with pytest.raises(ValueError, match="non-empty"):
            Completion("t", PreparedTxnState.empty(), goal, 2)


def test_a_v1_abort_whose_answer_was_lost_is_fenced_even_when_its_markers_are_still_being_written():
    """The lost abort landed: the first look finds PrepareAbort at its identity, the next CompleteAbort. The
    writer may live, so the fence is still sent (else it could reopen the transaction at that epoch)."""
    sent, settled = run(Completion("t", R, Goal.ABORT, 1, fence_after_abort=True), NoAnswer("lost"),
                        Described(ObservedTransaction("PrepareAbort", 7, 10)),
                        Described(ObservedTransaction("CompleteAbort", 7, 10)), InitAnswer(codes.NONE,
                                                                                          ProducerIdentity(7, 11)))
    assert [type(c).__name__ for c in sent] == ["EndTxn", "DescribeTransaction", "DescribeTransaction",
                                                "InitProducerId"]
    assert sent[3] == InitProducerId(1000, expected=ID)
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is True
