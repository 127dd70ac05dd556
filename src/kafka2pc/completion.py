"""Deciding what ``complete_transaction(state)`` must do, from what the coordinator reports. Pure; no I/O.

A transaction is identified by its producer id and epoch. kafka2pc makes that identity unique per transaction:

* transaction protocol v2 (KIP-890, Kafka 4.x): the coordinator bumps the epoch when a transaction ends, so the
  transaction run at epoch *e* ends as ``CompleteCommit``/``CompleteAbort`` at *e + 1* (timeouts and fencing
  included; measured on Apache Kafka 4.4.0, see docs/producer.md);
* transaction protocol v1 (Kafka 3.x): the coordinator keeps the epoch across transactions, so kafka2pc bumps it
  twice with InitProducerId before each new transaction. Transaction *e* then ends as ``CompleteCommit(e)``,
  ``CompleteAbort(e)`` (aborted by the producer) or ``CompleteAbort(e + 1)`` (aborted by the coordinator on timeout
  or fencing), and the next transaction of this producer starts at *e + 2* so none of those can be confused with it.
"""

from __future__ import annotations

import enum

import attrs

from kafka2pc.prepared_state import PreparedTxnState

ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
PREPARE_EPOCH_FENCE = "PrepareEpochFence"
#: states in which the coordinator is still writing markers or fencing: look again shortly.
IN_FLUX = frozenset({PREPARE_COMMIT, PREPARE_ABORT, PREPARE_EPOCH_FENCE})


@attrs.frozen
class ObservedTransaction:
    """What DescribeTransactions reported for a transactional id."""

    state: str
    producer_id: int
    epoch: int

    @property
    def as_prepared_state(self) -> PreparedTxnState:
        """The handle of this transaction, if it is ongoing."""
        return PreparedTxnState(self.producer_id, self.epoch)


class Action(enum.Enum):
    """What the I/O layer does next."""

    COMMIT_ONGOING = "commit the ongoing transaction: it is the requested one"
    ABORT_ONGOING = "abort the ongoing transaction: it is not the requested one"
    ALREADY_COMMITTED = "the requested transaction is already committed"
    ALREADY_ABORTED = "the requested transaction was already aborted"
    NOTHING_PENDING = "nothing is ongoing and the requested transaction is not the last one ended"
    LOOK_AGAIN = "the coordinator is completing a transaction; describe again shortly"


def decide(requested: PreparedTxnState, observed: ObservedTransaction | None, *, transaction_version: int) -> Action:
    """The action that completes ``requested`` exactly, given the coordinator's view ``observed``.

    ``observed`` is None when the coordinator does not know the transactional id.
    """
    if observed is None:
        return Action.NOTHING_PENDING
    if observed.state in IN_FLUX:
        return Action.LOOK_AGAIN
    same_producer = not requested.is_empty and observed.producer_id == requested.producer_id
    if observed.state == ONGOING:
        if same_producer and observed.epoch == requested.epoch:
            return Action.COMMIT_ONGOING
        return Action.ABORT_ONGOING
    if not same_producer:
        return Action.NOTHING_PENDING
    offset = observed.epoch - requested.epoch
    if transaction_version >= 2:
        if offset == 1 and observed.state == COMPLETE_COMMIT:
            return Action.ALREADY_COMMITTED
        if offset == 1 and observed.state == COMPLETE_ABORT:
            return Action.ALREADY_ABORTED
        return Action.NOTHING_PENDING
    if offset == 0 and observed.state == COMPLETE_COMMIT:
        return Action.ALREADY_COMMITTED
    if offset in (0, 1) and observed.state == COMPLETE_ABORT:
        return Action.ALREADY_ABORTED
    return Action.NOTHING_PENDING
