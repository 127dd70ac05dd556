"""The committer: record a checkpoint's decision durably, then complete its transactions, then mark it done."""

from __future__ import annotations

import logging

from kafka2pc import metrics
from kafka2pc.errors import TransactionLostError
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
        """Record ``decision``, commit every transaction of it, mark it done; returns them (their ids are free)."""
        self.decision_log.record(decision)
        self.roll_forward(decision)
        return list(decision.transactions)

    def roll_forward(self, decision: Decision) -> None:
        """Commit every transaction of an already recorded ``decision`` (idempotent), then mark it done."""
        for txn in decision.transactions:
            try:
                committed = self.control.complete(txn.transactional_id, txn.state)
            except TransactionLostError:
                metrics.TRANSACTIONS_ENDED.labels(outcome="lost").inc()
                raise
            if committed:
                metrics.TRANSACTIONS_ENDED.labels(outcome="committed").inc()
            else:
                metrics.TRANSACTIONS_ENDED.labels(outcome="lost").inc()
                raise TransactionLostError(
                    txn.transactional_id, txn.state.producer_id, txn.state.epoch,
                    f"checkpoint {decision.checkpoint} decided to commit it, but the broker has neither it ongoing "
                    "nor as the last transaction of the id (was the id used by someone else, or did it expire?)")
        self.decision_log.mark_done(decision.checkpoint)
        log.debug("checkpoint %d: %d transaction(s) committed", decision.checkpoint, len(decision.transactions))
