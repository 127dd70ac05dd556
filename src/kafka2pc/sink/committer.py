"""The committer: record a checkpoint's decision durably (the commit point), then complete its transactions, then mark
it done; and make a checkpoint's outcome hold when it is offered again (a replayed batch, a retried commit)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from kafka2pc import metrics
from kafka2pc.errors import (
    BrokerUnavailableError,
    DecisionConflictError,
    TransactionLostError,
    TransactionNotSettledError,
    TransactionOutcomeUnknownError,
)
from kafka2pc.sink.decision_log import Decision, DecisionLog
from kafka2pc.sink.prepared import PreparedTransaction
from kafka2pc.transaction_control import ONGOING, ProducerIdentity, Settled, TransactionControl

log = logging.getLogger(__name__)


@attrs.frozen
class Settlement:
    """What :meth:`Committer.settle` did for one checkpoint."""

    checkpoint: int
    #: True: this call recorded the decision; False: the checkpoint was already decided (a replay)
    decided_now: bool
    #: the transactions of the checkpoint's decision (all committed now), or () if its record was pruned long ago
    committed: tuple[PreparedTransaction, ...]
    #: transactional ids of offered transactions that were not the decided ones, aborted
    aborted: tuple[str, ...]
    #: time spent checking that the offered transactions are still open (before the record)
    check_seconds: float = 0.0
    record_seconds: float = 0.0
    complete_seconds: float = 0.0


class Committer:
    """Completes the prepared transactions of decided checkpoints. Engine-neutral: the Spark driver and the
    dual-writer both drive one."""

    def __init__(self, control: TransactionControl, decision_log: DecisionLog):
        self.control = control
        self.decision_log = decision_log

    def commit(self, decision: Decision) -> list[PreparedTransaction]:
        """Record ``decision`` (the commit point), commit every transaction of it, mark it done; returns them (their
        ids are free again). The same decision again is a no-op once done (its ids may be reused since), and rolls
        it forward while not done; another decision for a recorded checkpoint raises
        :class:`~kafka2pc.sink.DecisionConflictError`."""
        _hold(decision.transactions)
        self._record(decision)
        if not self.decision_log.is_done(decision.checkpoint):
            self.roll_forward(decision)
        else:
            for txn in decision.transactions:  # completed long ago
                _release(txn)
        return list(decision.transactions)

    def settle(self, checkpoint: int, offered: Sequence[PreparedTransaction],
               metadata: Mapping[str, Any] | None = None) -> Settlement:
        """Commit ``offered`` as checkpoint ``checkpoint`` — unless the checkpoint is already decided, in which case
        the recorded decision is completed and every offered transaction that is not part of it is aborted (a
        replayed batch, whose rows are already committed once).

        Before recording, every offered transaction is checked to be still ongoing at its producer id and epoch;
        if one is not (something aborted it), nothing is recorded, all offered ones are aborted and
        :class:`~kafka2pc.errors.TransactionLostError` says so: the checkpoint can then be run again."""
        existing = self.decision_log.decision(checkpoint)
        last = self.decision_log.last_checkpoint()
        if existing is None and last is not None and checkpoint < last:
            # decided long ago (its record has been pruned): whatever is offered now is a replay's
            return Settlement(checkpoint, False, (), self._abort_others(offered, ()))
        if existing is not None:
            # first the replay's own transactions (always right, and conditional), so they never linger even when
            # the recorded decision cannot be completed
            aborted = self._abort_others(offered, existing.transactions)
            if not self.decision_log.is_done(checkpoint):
                self.roll_forward(existing)
            return Settlement(checkpoint, False, existing.transactions, aborted)
        started = time.monotonic()
        _hold(offered)  # prepared, and this committer's until completed: the oldest-open gauge counts them
        self._check_pending(checkpoint, offered)
        decision = Decision(checkpoint, offered, metadata or {})
        checked = time.monotonic()
        try:
            self._record(decision)
        except DecisionConflictError as exc:
            return self._lost_race(checkpoint, offered, exc)
        recorded = time.monotonic()
        self.roll_forward(decision)
        return Settlement(checkpoint, True, decision.transactions, (), checked - started, recorded - checked,
                          time.monotonic() - recorded)

    def _record(self, decision: Decision) -> None:
        """Record ``decision`` in the log: the commit point, timed."""
        with metrics.RECORD_DECISION_SECONDS.labels(path=metrics.SINK).time():
            self.decision_log.record(decision)

    def _lost_race(self, checkpoint: int, offered: Sequence[PreparedTransaction],
                   conflict: DecisionConflictError) -> Settlement:
        """Another writer on the same log recorded ``checkpoint`` (or a later one) between the look and the record:
        its decision stands, and every offered transaction outside it is aborted, as for a replay."""
        existing = self.decision_log.decision(checkpoint)
        decided = existing.transactions if existing is not None else ()
        log.warning("checkpoint %d: another writer recorded its decision first (%s); aborting the %d transaction(s) "
                    "offered here", checkpoint, conflict, len(offered))
        return Settlement(checkpoint, False, decided, self._abort_others(offered, decided))

    def _check_pending(self, checkpoint: int, offered: Sequence[PreparedTransaction]) -> None:
        seen = self.control.describe_all([t.transactional_id for t in offered])
        for txn, observed in zip(offered, seen, strict=True):
            if isinstance(observed, Exception):  # no answer proves nothing: decide nothing, abort nothing
                raise BrokerUnavailableError(f"checkpoint {checkpoint}: {txn.transactional_id!r} could not be looked "
                                             f"at ({observed}); nothing was recorded")
            if observed is None or observed.state != ONGOING or observed.identity != ProducerIdentity.of(txn.state):
                self._abort_others(offered, ())
                raise TransactionLostError(
                    txn.transactional_id, txn.state.producer_id, txn.state.epoch,
                    f"it is no longer ongoing (coordinator reports {observed}) before checkpoint {checkpoint} was "
                    "decided: nothing was recorded and every transaction offered for it was aborted; run the "
                    "checkpoint again")

    def _abort_others(self, offered: Sequence[PreparedTransaction],
                      decided: Sequence[PreparedTransaction]) -> tuple[str, ...]:
        keep = {(t.transactional_id, t.state) for t in decided}
        extra = [t for t in offered if (t.transactional_id, t.state) not in keep]
        aborted = []
        for txn, result in zip(extra, self.control.abort_all([(t.transactional_id, t.state) for t in extra]),
                               strict=True):
            if isinstance(result, Exception):
                log.warning("could not abort %s of %r (a replayed attempt's): %s; recovery's LISTING will",
                            txn.state, txn.transactional_id, result)
                continue
            _release(txn)
            if isinstance(result, Settled) and result.outcome is not None:
                aborted.append(txn.transactional_id)
        return tuple(aborted)

    def roll_forward(self, decision: Decision) -> None:
        """Commit every transaction of an already recorded ``decision`` (idempotent; all at once), then mark it done.

        A transaction that can never commit raises :class:`~kafka2pc.errors.TransactionLostError`, one whose fate
        cannot be known :class:`~kafka2pc.errors.TransactionOutcomeUnknownError`, after every other one was
        committed; the decision then stays undone."""
        with metrics.COMPLETE_SECONDS.labels(path=metrics.SINK).time():
            self._roll_forward(decision)

    def _roll_forward(self, decision: Decision) -> None:
        results = self.control.commit_all([(t.transactional_id, t.state) for t in decision.transactions])
        failure: Exception | None = None
        for txn, result in zip(decision.transactions, results, strict=True):
            if isinstance(result, Settled):
                _release(txn)
                if result.ended_now:
                    metrics.TRANSACTIONS_ENDED.labels(outcome="committed").inc()
                continue
            if isinstance(result, TransactionLostError):
                metrics.TRANSACTIONS_ENDED.labels(outcome="lost").inc()
                log.error("checkpoint %d decided to commit %s of %r, which can never commit", decision.checkpoint,
                          txn.state, txn.transactional_id)
            elif isinstance(result, TransactionOutcomeUnknownError):
                metrics.TRANSACTIONS_ENDED.labels(outcome="unknown").inc()
            # one that may still commit comes first: the decision is then retried, not reported stuck to an operator
            # whose resolution would let LISTING abort it
            if failure is None or (isinstance(result, TransactionNotSettledError)
                                   and isinstance(failure, (TransactionLostError, TransactionOutcomeUnknownError))):
                failure = result  # (a fatal error, e.g. a missing ACL, keeps its place: it needs an operator)
        if failure is not None:
            raise failure
        self.decision_log.mark_done(decision.checkpoint)
        log.debug("checkpoint %d: %d transaction(s) committed", decision.checkpoint, len(decision.transactions))


def _hold(transactions: Sequence[PreparedTransaction]) -> None:
    """Count ``transactions`` as open in this process (from now, unless it knew them already) until released."""
    for txn in transactions:
        prefix = metrics.sink_prefix(txn.transactional_id)
        if prefix is not None:
            metrics.OPEN_TRANSACTIONS.found(prefix, metrics.SINK, txn.transactional_id, lambda: None)


def _release(txn: PreparedTransaction) -> None:
    """``txn`` is no longer open (committed, or aborted)."""
    prefix = metrics.sink_prefix(txn.transactional_id)
    if prefix is not None:
        metrics.OPEN_TRANSACTIONS.closed(prefix, metrics.SINK, txn.transactional_id)
