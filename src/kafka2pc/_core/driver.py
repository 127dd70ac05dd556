"""The one driver of sans-IO machines: send each command over a transport, hand back the answer, until finished.

:func:`drive` runs one machine; :func:`drive_all` runs many at once, sending every pending command of a round
together (one round trip where the transport can) — the committer's rounds of EndTxn and DescribeTransactions.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, TypeVar

from kafka2pc._core.machine import Finished, Machine, failure
from kafka2pc._core.messages import Answer, Command

log = logging.getLogger(__name__)
R = TypeVar("R")


class CoordinatorTransport(Protocol):
    """The I/O edge the machines are driven over: it sends, waits as a command asks, and reports; it never
    decides."""

    def execute(self, transactional_id: str, command: Command) -> Answer:
        """Wait ``command.after_s``, send ``command`` to the coordinator of ``transactional_id`` and return its
        answer (:class:`~kafka2pc._core.messages.NoAnswer` when none came in time)."""
        ...

    def execute_all(self, commands: Sequence[tuple[str, Command]]) -> Sequence[Answer | Exception]:
        """:meth:`execute` for commands of several transactional ids, all at once; an exception in place of an
        answer is the error :meth:`execute` would have raised for that command alone."""
        ...

    def now(self) -> float:
        """A monotonic clock reading (the machines' only time)."""
        ...


def drive(transport: CoordinatorTransport, transactional_id: str, machine: Machine[R]) -> R:
    """Run ``machine`` for ``transactional_id`` until it finishes; its errors propagate. An error the transport
    raises instead of answering goes through the machine first (:func:`~kafka2pc._core.machine.failure`)."""
    step = machine.start(transport.now())
    while not isinstance(step, Finished):
        try:
            answer = transport.execute(transactional_id, step)
        except Exception as error:
            raised = _failed(machine, error)
            if raised is error:
                raise
            raise raised from error
        step = machine.on_answer(answer, transport.now())
    return step.result


def _failed(machine: Machine[R], error: Exception) -> Exception:
    """The error to raise (or report) when the transport raised ``error`` for ``machine``'s command: the machine's
    say on it (:func:`~kafka2pc._core.machine.failure`), chained to ``error`` when it is another one."""
    raised = failure(machine, error)
    if raised is not error:
        raised.__cause__ = error
    return raised


def drive_all(transport: CoordinatorTransport,
              machines: Sequence[tuple[str, Machine[R]]]) -> list[R | Exception]:
    """Run several machines at once, each for its transactional id; in order, each one's result or the error it
    ended with (one failing never stops the others; an error the transport raised for one command goes through its
    machine first, as in :func:`drive`). Each round sends every pending command together."""
    results: dict[int, R | Exception] = {}
    steps: dict[int, Command] = {}

    def advance(index: int, step: Command | Finished[R]) -> None:
        if isinstance(step, Finished):
            results[index] = step.result
        else:
            steps[index] = step

    now = transport.now()
    for index, (_, machine) in enumerate(machines):
        try:
            advance(index, machine.start(now))
        except Exception as exc:
            results[index] = exc
    while steps:  # bounded: every machine finishes or raises after a bounded number of commands
        pending = sorted(steps)
        answers = _answers(transport, [(machines[i][0], steps.pop(i)) for i in pending])
        now = transport.now()
        for index, answer in zip(pending, answers, strict=True):
            if isinstance(answer, Exception):  # raised instead of answering: the machine's say first, as in drive
                results[index] = _failed(machines[index][1], answer)
                continue
            try:
                advance(index, machines[index][1].on_answer(answer, now))
            except Exception as exc:
                results[index] = exc
    return [results[index] for index in range(len(machines))]


def _answers(transport: CoordinatorTransport, commands: list[tuple[str, Command]]) -> list[Answer | Exception]:
    """Answers to ``commands`` (all at once where the transport can); an error belongs to its own command only."""
    try:
        return list(transport.execute_all(commands))
    except Exception as exc:  # e.g. one id may not be described: ask each on its own
        log.debug("concurrent round failed (%r); one by one", exc)
    answers: list[Answer | Exception] = []
    for transactional_id, command in commands:
        try:
            answers.append(transport.execute(transactional_id, command))
        except Exception as exc:
            answers.append(exc)
    return answers
