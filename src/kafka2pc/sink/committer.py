"""The committer: record a checkpoint's decision durably, then complete its transactions, then mark it done."""

from __future__ import annotations

import logging

from kafka2pc import metrics
from kafka2pc.errors import TransactionLostError, TransactionOutcomeUnknownError
from kafka2pc.sink.decision_log import Decision, DecisionLog
from kafka2pc.sink.prepared import PreparedTransaction
from kafka2pc.transaction_control import TransactionControl

log = logging.getLogger(__name__)


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
        self.decision_log.record(decision)
        if not self.decision_log.is_done(decision.checkpoint):
            self.roll_forward(decision)
        return list(decision.transactions)

    def roll_forward(self, decision: Decision) -> None:
        """Commit every transaction of an already recorded ``decision`` (idempotent), then mark it done.

        A transaction that can never commit raises :class:`~kafka2pc.errors.TransactionLostError`, one whose fate
        cannot be known :class:`~kafka2pc.errors.TransactionOutcomeUnknownError`; the decision then stays undone."""
        for txn in decision.transactions:
            try:
                settled = self.control.commit(txn.transactional_id, txn.state)
            except TransactionLostError:
                metrics.TRANSACTIONS_ENDED.labels(outcome="lost").inc()
                log.error("checkpoint %d decided to commit %s of %r, which can never commit", decision.checkpoint,
                          txn.state, txn.transactional_id)
                raise
            except TransactionOutcomeUnknownError:
                metrics.TRANSACTIONS_ENDED.labels(outcome="unknown").inc()
                raise
            if settled.ended_now:
                metrics.TRANSACTIONS_ENDED.labels(outcome="committed").inc()
        self.decision_log.mark_done(decision.checkpoint)
        log.debug("checkpoint %d: %d transaction(s) committed", decision.checkpoint, len(decision.transactions))
