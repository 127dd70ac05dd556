"""Resending: the machines' decision to send a command again, which the wire layer used to make unseen."""

import pytest

from kafka2pc._core import codes
from kafka2pc._core.completion import Completion, Goal
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import (
    Described,
    DescribeTransaction,
    EndAnswer,
    EndTxn,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ProducerIdentity,
)
from kafka2pc._core.requests import Request
from kafka2pc._core.resend import Resending, why_again
from kafka2pc._core.retry import Retry
from kafka2pc.errors import BrokerUnavailableError
from kafka2pc.prepared_state import PreparedTxnState

ME = ProducerIdentity(5, 3)
FRESH = InitProducerId(60_000)
GUARDED_BUMP = InitProducerId(60_000, expected=ME)
POLICY = Retry(timeout_s=10.0, backoff_s=1.0, factor=1.0, jitter=0.0)


@pytest.mark.parametrize(("command", "answer", "again"), [
    (EndTxn(ME, True, 2), NoAnswer("lost"), True),                       # Kafka answers NONE to a retried end
    (EndTxn(ME, True, 2), EndAnswer(codes.NOT_COORDINATOR), True),
    (EndTxn(ME, True, 2), EndAnswer(codes.CONCURRENT_TRANSACTIONS), True),
    (EndTxn(ME, True, 2), EndAnswer(codes.INVALID_TXN_STATE), False),    # the machine looks into that one
    (DescribeTransaction(), Described(None, error=codes.COORDINATOR_LOAD_IN_PROGRESS), True),
    (FRESH, InitAnswer(codes.CONCURRENT_TRANSACTIONS), True),
    # the broker gave up waiting (a block of producer ids, a slow replica): it says no more than a lost answer
    (FRESH, InitAnswer(codes.REQUEST_TIMED_OUT), True),
    (EndTxn(ME, True, 2), EndAnswer(codes.REQUEST_TIMED_OUT), True),
    (GUARDED_BUMP, InitAnswer(codes.REQUEST_TIMED_OUT), False),          # it may have acted: the machine looks
    (GUARDED_BUMP, NoAnswer("lost"), False),                             # it may have acted: the machine looks
    (GUARDED_BUMP, InitAnswer(codes.CONCURRENT_TRANSACTIONS), False),
    # it never left, yet its look would be stale by the time it is sent again: the machine looks again instead
    (GUARDED_BUMP, NoAnswer("no coordinator", sent=False), False),
    (EndTxn(ME, True, 2), EndAnswer(codes.NONE), False),
])
def test_what_may_be_sent_again(command, answer, again):
    assert (why_again(command, answer) is not None) is again


def test_a_lost_end_is_sent_again_with_backoff_until_the_deadline_then_the_machine_hears_of_it():
    completion = Completion("t", PreparedTxnState(5, 3, 2), Goal.COMMIT, 2)
    machine = Resending(completion, POLICY)
    end = machine.start(now=100.0)
    assert end == EndTxn(ME, True, 2)
    again = machine.on_answer(NoAnswer("lost"), now=101.0)
    assert again == EndTxn(ME, True, 2, after_s=1.0)
    assert machine.on_answer(NoAnswer("lost"), now=108.5) == EndTxn(ME, True, 2, after_s=1.0)
    with pytest.raises(BrokerUnavailableError, match=r"no usable answer within 10 s \(last: lost\)"):
        machine.on_answer(NoAnswer("lost"), now=109.5)  # a try at 110.5 would start past the deadline


def test_a_resent_command_that_succeeds_finishes_the_machine():
    machine = Resending(Completion("t", PreparedTxnState(5, 3, 2), Goal.COMMIT, 2), POLICY)
    machine.start(now=0.0)
    machine.on_answer(EndAnswer(codes.COORDINATOR_LOAD_IN_PROGRESS), now=0.1)
    finished = machine.on_answer(EndAnswer(codes.NONE), now=1.2)
    assert isinstance(finished, Finished) and finished.result.ended_now


def test_each_new_command_gets_a_fresh_budget():
    machine = Resending(Completion("t", PreparedTxnState(5, 3, 2), Goal.COMMIT, 2), POLICY)
    machine.start(now=0.0)
    assert isinstance(machine.on_answer(EndAnswer(codes.NOT_COORDINATOR), now=9.0), EndTxn)
    look = machine.on_answer(EndAnswer(codes.INVALID_TXN_STATE), now=9.5)  # the machine's next command: a look
    assert isinstance(look, DescribeTransaction)
    assert isinstance(machine.on_answer(NoAnswer("lost"), now=15.0), DescribeTransaction)  # its own 10 s


def test_a_command_not_safe_to_repeat_goes_back_to_the_machine_at_once():
    request = Resending(Request(GUARDED_BUMP), POLICY)
    assert request.start(now=0.0) == GUARDED_BUMP
    assert request.on_answer(NoAnswer("lost"), now=0.1) == Finished(NoAnswer("lost"))


def test_without_a_clock_the_count_limits():
    request = Resending(Request(FRESH), Retry(total=2, jitter=0.0))
    request.start()
    assert request.on_answer(NoAnswer("lost")) == InitProducerId(60_000, after_s=0.05)
    assert request.on_answer(NoAnswer("lost")) == InitProducerId(60_000, after_s=0.1)
    finished = request.on_answer(NoAnswer("lost"))
    assert isinstance(finished, Finished) and isinstance(finished.result, NoAnswer)
    assert "after 3 tries" in finished.result.reason
