"""Whether to send a command again: the decision the wire layer used to make out of the machines' sight.

The transport only reports what happened: an answer (with its error code), or :class:`NoAnswer` (``sent`` says
whether the request may have reached a broker; ``cause`` is the exception it saw). :class:`Resending` wraps a
machine and, by the command's :attr:`resend_safe`, sends it again itself — after a lost answer, a coordinator that
moved, is loading or is busy (:attr:`~kafka2pc._core.codes.Kind.COORDINATOR_BUSY`), or a broker that gave up
waiting before the request completed (:attr:`~kafka2pc._core.codes.Kind.TIMED_OUT`: an answer that says no more
than a lost one, e.g. a fresh InitProducerId waiting for a block of producer ids) — with the backoff of its
:class:`~kafka2pc._core.retry.Retry` (:data:`~kafka2pc._core.retry.COORDINATOR_RETRY`), until the policy's time runs
out. Then, and for every command that is not safe to repeat, the machine itself gets the answer, a lost one as
:class:`NoAnswer` (carrying the last cause). A guarded bump (InitProducerId expecting an identity) is never sent
again here, not even when it certainly never reached a broker: it was decided on a look, and sent later, after a
backoff, it could land on a successor's newer transaction (Kafka checks only the producer id of an Ongoing one and
aborts it). Its machine looks again instead.

So "what happens when EndTxn times out": EndTxn is safe to repeat (Kafka answers NONE to a retry of an end that
succeeded), so it is sent again with backoff until ``max.block.ms``; then the
:class:`~kafka2pc._core.completion.Completion` gets a NoAnswer and raises
:class:`~kafka2pc.errors.TransactionNotSettledError` (a BrokerUnavailableError, retriable), and
:func:`~kafka2pc._core.ending.failed_end` keeps the producer COMMITTING or ABORTING, from where the same decision may
be retried.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import attrs

from kafka2pc._core import codes
from kafka2pc._core.machine import Finished, Machine, failure
from kafka2pc._core.messages import Answer, Command, NoAnswer
from kafka2pc._core.retry import COORDINATOR_RETRY, Retry

R = TypeVar("R")
__all__ = ["ASK_AGAIN", "Resending", "why_again"]

#: the kinds of answer after which a resend-safe command is asked again, as after a lost answer
ASK_AGAIN = frozenset({codes.Kind.COORDINATOR_BUSY, codes.Kind.TIMED_OUT})


def why_again(command: Command, answer: Answer) -> str | None:
    """Why ``command`` may be sent again after ``answer`` (None: it may not, or need not)."""
    if isinstance(answer, NoAnswer):
        return answer.reason if command.resend_safe else None
    if command.resend_safe and codes.kind(answer.error) in ASK_AGAIN:
        return codes.error_name(answer.error)
    return None


class Resending(Generic[R]):
    """``inner``, with every command that may be sent again sent again under ``policy`` (a
    :class:`~kafka2pc._core.machine.Machine` itself)."""

    def __init__(self, inner: Machine[R], policy: Retry = COORDINATOR_RETRY):
        self.inner = inner
        self._policy = policy
        #: the series of tries of the current command, begun (at ``_since``) only once it is to be sent again
        self._retry: Retry | None = None
        self._since: float | None = None
        self._command: Command | None = None

    def start(self, now: float | None = None) -> Command | Finished[R]:
        """The inner machine's first command."""
        return self._sending(self.inner.start(now), now)

    def on_answer(self, answer: Answer, now: float | None = None) -> Command | Finished[R]:
        """The same command again, or the inner machine's next step."""
        command = self._command
        if command is None:
            raise TypeError(f"no command in progress for {answer!r}")
        problem = why_again(command, answer)
        if problem is not None:
            tries = self._retry or self._policy.started(self._since)
            retry = tries.next(now)
            if retry is not None:
                self._retry = retry
                return attrs.evolve(command, after_s=retry.delay_s)
            lost = answer if isinstance(answer, NoAnswer) else None
            answer = NoAnswer(f"{type(command).__name__} got no usable answer {tries.describe()} (last: "
                              f"{problem})", sent=lost is None or lost.sent, cause=None if lost is None else lost.cause)
        return self._sending(self.inner.on_answer(answer, now), now)

    def on_failure(self, error: Exception) -> Exception:
        """The transport failed the command in progress with ``error`` instead of answering: the inner machine's
        say on it (:func:`~kafka2pc._core.machine.failure`)."""
        return failure(self.inner, error)

    def _sending(self, step: Command | Finished[R], now: float | None) -> Command | Finished[R]:
        if not isinstance(step, Finished):
            self._command, self._retry, self._since = step, None, now
        return step
