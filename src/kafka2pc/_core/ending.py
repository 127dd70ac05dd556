"""What a failed end leaves: the producer's next state and the error it raises, decided in one place
(:func:`failed_end`), for every path that ends a transaction — ``commit_transaction``, ``abort_transaction`` and
``complete_transaction`` of a held (prepared or recovered) transaction, whatever ended it: a
:class:`~kafka2pc._core.completion.Completion` that raised, or the edge raising instead of answering. The error
itself is :func:`end_error`'s to say, for a producer's end and for
:class:`~kafka2pc.transaction_control.TransactionControl`'s (the Completion's ``on_failure``) alike: the same failure
of the same end raises the same class wherever it ran.

The error's group always agrees with the state it leaves. An end that failed with

* a :class:`~kafka2pc.errors.RetriableError` — nothing settled it (:class:`~kafka2pc.errors.TransactionNotSettledError`,
  a BrokerUnavailableError): the producer stays COMMITTING or ABORTING and raises it; the same end may be called again;
* a :class:`~kafka2pc.errors.KafkaProtocolError` the edge raised (a code no kind covers): it stays COMMITTING or
  ABORTING and raises TransactionNotSettledError from it; of kind UNSUPPORTED: FATAL_ERROR, UnsupportedByBrokerError;
* :class:`~kafka2pc.errors.TransactionOutcomeUnknownError` — of a resumed transaction (an earlier producer's, ended
  under its own identity): RECOVERED_IDLE, raising it (that transaction's fate is unknown; the producer is not
  involved); of its own transaction (or one the broker kept for it): FATAL_ERROR, raising ProducerFencedError from it
  (the id has moved on past this producer);
* any other :class:`~kafka2pc.errors.FatalError` (fenced, unauthorized, lost, unsupported): FATAL_ERROR, raising it;
* anything else (a bug, an error kafka2pc does not know): it stays COMMITTING or ABORTING and raises it.

So a FatalError leaves the producer FATAL_ERROR, and a producer left COMMITTING or ABORTING raised an error that is
not fatal: the same decision may be retried, and Kafka's EndTxn (exact, conditional on the producer id and epoch,
idempotent) makes the retry safe.
"""

from __future__ import annotations

import attrs

from kafka2pc._core import codes
from kafka2pc._core.setup import fenced
from kafka2pc._core.states import CoreState, Ending, Fatal, Owner, Unowned
from kafka2pc.errors import (
    FatalError,
    KafkaProtocolError,
    RetriableError,
    TransactionNotSettledError,
    TransactionOutcomeUnknownError,
    UnsupportedByBrokerError,
)
from kafka2pc.prepared_state import PreparedTxnState


@attrs.frozen
class FailedEnd:
    """Where a failed end leaves the producer, and the error to raise."""

    state: CoreState
    error: Exception = attrs.field(eq=False)


def end_error(transactional_id: str, target: PreparedTxnState, error: Exception) -> Exception:
    """The error an end of ``target`` that failed with ``error`` raises, whoever runs it (a producer, or
    TransactionControl): a :class:`~kafka2pc.errors.KafkaProtocolError` the edge raised (a code no kind covers)
    becomes :class:`~kafka2pc.errors.TransactionNotSettledError` from it (the end may or may not have happened; the
    same end may be retried), or, of kind UNSUPPORTED, :class:`~kafka2pc.errors.UnsupportedByBrokerError`; any other
    error is raised as it is."""
    if not isinstance(error, KafkaProtocolError):
        return error
    if codes.kind(error.error_code) is codes.Kind.UNSUPPORTED:
        return _chained(UnsupportedByBrokerError(str(error)), error)
    return _chained(TransactionNotSettledError(transactional_id, str(target), f"{error}; it may or may not have ended",
                                               error_code=error.error_code), error)


def failed_end(transactional_id: str, ending: Ending, error: Exception) -> FailedEnd:
    """What the end in progress (``ending``) leaves when it failed with ``error`` (see the module's table; the error
    raised is :func:`end_error`'s)."""
    error = end_error(transactional_id, ending.target, error)
    if isinstance(error, RetriableError):
        return FailedEnd(ending, error)
    if isinstance(error, FatalError):
        return _fatal(error)
    if isinstance(error, TransactionOutcomeUnknownError):
        if ending.owner is Owner.RESUMED:
            return FailedEnd(Unowned(ending.setup), error)  # settled as far as it can be; the producer carries on
        # this producer's own transaction is no longer the id's: a newer producer took the id over
        return _fatal(_chained(fenced(transactional_id, f"ending its transaction {ending.target}: {error.reason}"),
                               error))
    return FailedEnd(ending, error)


def _fatal(error: Exception) -> FailedEnd:
    return FailedEnd(Fatal(error), error)


def _chained(error: Exception, cause: Exception) -> Exception:
    error.__cause__ = cause
    return error
