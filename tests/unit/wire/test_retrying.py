"""with_retry: the I/O edge's retries of reads, under the one retry policy."""

import kafka.errors as kafka_errors
import pytest

from kafka2pc._core.retry import Retry
from kafka2pc._wire.retrying import TryAgain, with_retry
from kafka2pc.errors import BrokerUnavailableError

QUICK = Retry(timeout_s=0.5, backoff_s=0.01, max_backoff_s=0.02)


def flaky(failures):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return "answer"

    return call, calls


def test_transient_errors_and_answers_that_ask_again_are_retried():
    call, calls = flaky([kafka_errors.KafkaConnectionError("reset"), TryAgain("kept loading")])
    assert with_retry(call, QUICK, "Metadata") == "answer" and len(calls) == 3


def test_a_read_that_never_answers_is_unavailable_after_the_policy_ends():
    call, _ = flaky([kafka_errors.KafkaTimeoutError("slow")] * 1000)
    with pytest.raises(BrokerUnavailableError, match=r"Metadata: no usable answer within 0.5 s \(did not answer"):
        with_retry(call, QUICK, "Metadata")


def test_the_caller_says_which_error_a_spent_policy_becomes():
    call, _ = flaky([TryAgain("kept answering NOT_COORDINATOR")] * 1000)
    with pytest.raises(ValueError, match="kept answering NOT_COORDINATOR"):
        with_retry(call, QUICK, "x", exhausted=ValueError)


def test_other_errors_are_not_retried():
    call, calls = flaky([RuntimeError("bug")])
    with pytest.raises(RuntimeError):
        with_retry(call, QUICK, "x")
    assert len(calls) == 1
