"""The small machines of the operations that need no producer: one request, and a look that waits out an id's
markers. :class:`~kafka2pc._core.resend.Resending` around them sends again what may be sent again."""

from __future__ import annotations

from typing import Generic, TypeVar

from kafka2pc._core.looks import Looks
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import IN_FLUX, Answer, Command, Described, NoAnswer, ObservedTransaction
from kafka2pc._core.retry import Retry
from kafka2pc.errors import BrokerUnavailableError

R = TypeVar("R")


class Request:
    """Send ``command``; finish with its answer (a lost one included: the caller reads it)."""

    def __init__(self, command: Command):
        self.command = command

    def start(self, now: float | None = None) -> Command:
        """The command."""
        return self.command

    def on_answer(self, answer: Answer, now: float | None = None) -> Finished[Answer]:
        """Its answer."""
        return Finished(answer)


class Immediately(Generic[R]):
    """Finish at once with ``result``: an operation that turned out to need no request."""

    def __init__(self, result: R):
        self.result = result

    def start(self, now: float | None = None) -> Finished[R]:
        """The result."""
        return Finished(self.result)

    def on_answer(self, answer: Answer, now: float | None = None) -> Finished[R]:
        """Never called: :meth:`start` finished."""
        raise TypeError(f"no command in progress for {answer!r}")


class LookUntilSettled:
    """DescribeTransactions until the id is not in the middle of writing markers (or ``policy`` runs out); finish
    with what was last seen. Raises BrokerUnavailableError when a look gets no answer."""

    def __init__(self, transactional_id: str, policy: Retry):
        self.transactional_id = transactional_id
        self._looks = Looks(policy)
        self._last: ObservedTransaction | None = None

    def start(self, now: float | None = None) -> Command:
        """The first look."""
        look = self._looks.next(now)
        assert look is not None
        return look

    def on_answer(self, answer: Answer, now: float | None = None) -> Command | Finished[ObservedTransaction | None]:
        """Look again while in flux; else what the coordinator reported."""
        if isinstance(answer, NoAnswer):
            raise BrokerUnavailableError(f"transactional id {self.transactional_id!r}: {answer.reason}") \
                from answer.cause
        if not isinstance(answer, Described):
            raise TypeError(f"unexpected answer {answer!r}")
        observed = answer.observed
        if observed is not None and observed.state in IN_FLUX:
            look = self._looks.next(now)
            if look is not None:
                return look
        return Finished(observed)
