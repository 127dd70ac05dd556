"""The small machines: one request, an immediate result, and a look that waits out an id's markers."""

import pytest

from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import Described, DescribeTransaction, NoAnswer, ObservedTransaction
from kafka2pc._core.requests import Immediately, LookUntilSettled, Request
from kafka2pc._core.retry import Retry
from kafka2pc.errors import BrokerUnavailableError


def looked(state):
    return Described(ObservedTransaction(state, 5, 3))


def test_a_request_finishes_with_its_answer_whatever_it_is():
    request = Request(DescribeTransaction())
    assert request.start() == DescribeTransaction()
    assert request.on_answer(NoAnswer("lost")) == Finished(NoAnswer("lost"))


def test_immediately_needs_no_request():
    assert Immediately(7).start() == Finished(7)
    with pytest.raises(TypeError):
        Immediately(7).on_answer(NoAnswer("x"))


def test_a_look_waits_while_markers_are_written_and_reports_what_it_saw_then():
    look = LookUntilSettled("t", Retry(total=5, backoff_s=0.05, factor=1.0, jitter=0.0))
    assert look.start() == DescribeTransaction()
    assert look.on_answer(looked("PrepareCommit")) == DescribeTransaction(after_s=0.05)
    assert look.on_answer(looked("CompleteCommit")) == Finished(ObservedTransaction("CompleteCommit", 5, 3))


def test_a_look_that_runs_out_of_time_reports_the_id_still_in_flux():
    look = LookUntilSettled("t", Retry(timeout_s=1.0, backoff_s=0.5, factor=1.0, jitter=0.0))
    look.start(now=0.0)
    assert look.on_answer(looked("PrepareAbort"), now=0.2) == DescribeTransaction(after_s=0.5)
    assert look.on_answer(looked("PrepareAbort"), now=0.9) == Finished(ObservedTransaction("PrepareAbort", 5, 3))


def test_a_look_without_an_answer_is_unavailable():
    look = LookUntilSettled("t", Retry(total=1))
    look.start()
    with pytest.raises(BrokerUnavailableError):
        look.on_answer(NoAnswer("lost"))
