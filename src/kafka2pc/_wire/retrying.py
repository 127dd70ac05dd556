"""The I/O edge's own retries, of reads that may be repeated (metadata, configs, listings), under the one retry
policy (:class:`~kafka2pc._core.retry.Retry`; the client's is :data:`~kafka2pc._core.retry.READS`). Coordinator
commands are never retried here: the machines decide that (:mod:`kafka2pc._core.resend`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import kafka.errors as kafka_errors

from kafka2pc._core.retry import Retry
from kafka2pc.errors import BrokerUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: kafka-python's errors of a request that got no answer (a broker restarting, a connection lost, a timeout)
TRANSIENT = (kafka_errors.KafkaConnectionError, kafka_errors.NodeNotReadyError, kafka_errors.KafkaTimeoutError,
             kafka_errors.RequestTimedOutError, kafka_errors.UnknownBrokerIdError)
#: those of them that say the request never left (kafka-python refused to send it)
NOT_SENT = (kafka_errors.NodeNotReadyError, kafka_errors.UnknownBrokerIdError)


class TryAgain(Exception):
    """Raised by a call to :func:`with_retry` whose answer asks to be asked again; ``problem`` says why."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def with_retry(call: Callable[[], T], policy: Retry, what: str, *,
               exhausted: Callable[[str], Exception] | None = None) -> T:
    """Run ``call`` until it returns, retrying it under ``policy`` while it fails with a transient error or
    :class:`TryAgain`; then raise ``exhausted(problem)`` (by default BrokerUnavailableError)."""
    retry = policy.started(time.monotonic())
    while True:
        try:
            return call()
        except TryAgain as exc:
            problem, cause = exc.problem, exc
        except TRANSIENT as exc:
            problem, cause = f"did not answer ({exc!r})", exc
        following = retry.next(time.monotonic())
        if following is None:
            error = exhausted(problem) if exhausted is not None else BrokerUnavailableError(
                f"{what}: no usable answer {policy.describe()} ({problem})")
            raise error from cause
        log.debug("%s: %s; retrying in %.2f s", what, problem, following.delay_s)
        time.sleep(following.delay_s)
        retry = following
