"""The one contract every sans-IO machine keeps, in h11's way: the machine decides, the I/O edge sends.

A machine's :meth:`~Machine.start` returns its first command (or :class:`Finished` when it needs none); the edge
sends the command and passes the answer to :meth:`~Machine.on_answer`, which returns the next command or
:class:`Finished` with the result. A machine never sleeps, connects or reads a clock: a command's ``after_s`` asks
the edge to wait before sending it, and ``now`` (a monotonic clock reading the driver passes in) is the only time a
machine sees. It raises kafka2pc's errors (:mod:`kafka2pc.errors`) when its goal cannot be reached. When the edge
raises instead of answering (a refusal it recognised: an ACL, a version the broker lacks), the driver asks the machine
what to make of it (:func:`failure`), so that a machine keeping state (the producer's core) hears of every way its
operation ended.
:mod:`~kafka2pc._core.driver` runs machines over a transport; the model-based tests run the same machines against a
model of Kafka's coordinator.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar, runtime_checkable

import attrs

from kafka2pc._core.messages import Answer, Command

R_co = TypeVar("R_co", covariant=True)


@attrs.frozen
class Finished(Generic[R_co]):
    """A machine reached its goal; ``result`` is what it was for."""

    result: R_co


class Machine(Protocol[R_co]):
    """A sans-IO machine: :meth:`start`, then :meth:`on_answer` until it returns :class:`Finished`."""

    def start(self, now: float | None = None) -> Command | Finished[R_co]:
        """The first command, or the result when none is needed."""
        ...

    def on_answer(self, answer: Answer, now: float | None = None) -> Command | Finished[R_co]:
        """The next command, given the answer to the last one; or the result."""
        ...


@runtime_checkable
class Interruptible(Protocol):
    """A machine that takes a failure of the edge into its state: :meth:`on_failure` returns the error to raise."""

    def on_failure(self, error: Exception) -> Exception:
        """The edge raised ``error`` instead of answering the last command."""
        ...


def failure(machine: object, error: Exception) -> Exception:
    """The error to raise when the edge failed ``machine``'s command with ``error``: the machine's say on it if it
    takes failures into its state (:class:`Interruptible`), else ``error`` itself."""
    return machine.on_failure(error) if isinstance(machine, Interruptible) else error
