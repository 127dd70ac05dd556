"""What the coordinator's state implies about one transaction: :func:`judge`, the one interpreter of how a
transaction ended. Pure.

A transaction is identified by its producer id and epoch. kafka2pc keeps that identity unique per transaction:

* transaction protocol v2 (KIP-890, Kafka 4.x): the coordinator bumps the epoch when a transaction ends, so the
  transaction run at epoch *e* ends as ``CompleteCommit``/``CompleteAbort`` at *e + 1* (timeouts and fencing
  included; measured on Apache Kafka 4.4.0, see docs/producer.md). kafka2pc never runs a transaction at an epoch
  whose end would exhaust the epoch and rotate the producer id (:data:`MAX_TRANSACTION_EPOCH`).
* transaction protocol v1 (Kafka 3.x): the coordinator keeps the epoch across transactions, so every kafka2pc
  producer leaves at least two epochs between the end of one transaction and the next (its first one included, after
  a fresh InitProducerId). Transaction *e* then ends as ``CompleteCommit(e)``, ``CompleteAbort(e)`` (aborted by
  EndTxn) or ``CompleteAbort(e + 1)`` (aborted by the coordinator on timeout or fencing), and none of those can
  belong to another transaction.

The two protocols read one coordinator state differently only at the transaction's own epoch: ``Complete*`` at *e*
is a v1 end of it, but under v2 the end of the transaction before it (it never started). :func:`judge` therefore
uses the protocol the handle recorded, and without one (a handle parsed from KIP-939's bare string) it concludes
only where both readings agree: exact across a cluster upgrade from ``transaction.version`` 1 to 2.

Every verdict is a fact the coordinator's state implies under those rules; where it implies nothing, the verdict is
:attr:`Fate.UNKNOWN` and callers raise :class:`~kafka2pc.errors.TransactionOutcomeUnknownError` rather than guess.
"""

from __future__ import annotations

import enum

import attrs

from kafka2pc._core.messages import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    IN_FLUX,
    ONGOING,
    ObservedTransaction,
    ProducerIdentity,
)
from kafka2pc.prepared_state import MAX_EPOCH, PreparedTxnState

#: The highest epoch kafka2pc runs a transaction at: ending it (v2), or a coordinator abort of it (v1), moves the
#: epoch to at most 32766 without exhausting it, so the producer id never rotates under a prepared transaction.
MAX_TRANSACTION_EPOCH = MAX_EPOCH - 2


class TransactionOutcome(enum.Enum):
    """How a transaction ended."""

    COMMITTED = "committed"
    ABORTED = "aborted"


class Fate(enum.Enum):
    """What the coordinator's state implies about one transaction."""

    PENDING = "ongoing: it can still be committed or aborted"
    COMMITTED = "committed"
    ABORTED = "aborted"
    NEVER_STARTED = "the coordinator never ran a transaction at that producer id and epoch"
    UNKNOWN = "not ongoing, and the coordinator's state no longer says how it ended"
    IN_FLUX = "the coordinator is still ending or fencing a transaction"


@attrs.frozen
class Judgement:
    """A :class:`Fate`, why, and whether another transaction is ongoing on the transactional id."""

    fate: Fate
    reason: str
    other_pending: ProducerIdentity | None = None


def judge(requested: PreparedTxnState, observed: ObservedTransaction | None,
          transaction_version: int | None = None) -> Judgement:
    """What ``observed`` (DescribeTransactions; None: the id is unknown) implies about ``requested``, a transaction
    run under ``transaction_version`` (None: not known)."""
    if observed is not None and observed.state in IN_FLUX:
        return Judgement(Fate.IN_FLUX, f"coordinator reports {observed}")
    other = observed.identity if observed is not None and observed.state == ONGOING else None
    if requested.is_empty:
        return Judgement(Fate.NEVER_STARTED, "no transaction was requested", other)
    if observed is None:
        return Judgement(Fate.UNKNOWN, "the coordinator has no record of the transactional id (it expired after "
                                       "transactional.id.expiration.ms, or was never used on this cluster)")
    seen = f"coordinator reports {observed}"
    if observed.producer_id != requested.producer_id:
        return Judgement(Fate.UNKNOWN, f"{seen}: the id has another producer id since", other)
    lag = observed.epoch - requested.epoch
    if observed.state == ONGOING:
        if lag == 0:
            return Judgement(Fate.PENDING, seen)
        if lag < 0:
            return Judgement(Fate.NEVER_STARTED, f"{seen}, an earlier epoch", other)
        return Judgement(Fate.UNKNOWN, f"{seen}: a later transaction has started since", other)
    if observed.state not in (COMPLETE_COMMIT, COMPLETE_ABORT, EMPTY):
        return Judgement(Fate.UNKNOWN, seen)
    ended = {COMPLETE_COMMIT: Fate.COMMITTED, COMPLETE_ABORT: Fate.ABORTED}.get(observed.state)
    if ended is not None and lag == 1 and (ended is Fate.ABORTED or transaction_version != 1):
        return Judgement(ended, seen)  # v2's end (both); v1's coordinator abort; never a v1 commit: see above
    if ended is not None and lag == 0:
        if transaction_version == 1:
            return Judgement(ended, seen)  # v1 keeps the epoch at the end
        if transaction_version is None:
            return Judgement(Fate.UNKNOWN, f"{seen}: under transaction protocol v1 that is its end, under v2 the "
                                           "end of the one before it; the handle does not say which it ran under")
        return Judgement(Fate.NEVER_STARTED, seen)  # v2: the previous transaction ended at e; R never registered
    # a transaction at e, once registered, never leaves Empty(e) behind: the id never got past it
    if lag < 0 or (lag == 0 and observed.state == EMPTY):
        return Judgement(Fate.NEVER_STARTED, seen)
    return Judgement(Fate.UNKNOWN, f"{seen}: the id has moved on since")


def end_version(requested: PreparedTxnState, commit: bool, cluster_version: int) -> int:
    """The transaction protocol to end ``requested`` with (EndTxn v5 for 2, v4 for 1).

    Its recorded protocol when there is one. Otherwise (a bare ``"pid:epoch"``, a transaction only described):
    a commit may use the cluster's — both versions commit only an ongoing transaction and refuse a finished one —
    but an abort uses v4: a v5 abort of a v1 transaction that already committed at the current epoch is accepted
    as an abort of an empty transaction (it bumps the epoch), hiding the commit. A v4 abort never bumps, so its
    caller fences afterwards (``fence_after_abort``), and on a v2 cluster it is sent only after a look found the
    transaction no longer ongoing (:meth:`Completion.aborting`)."""
    if requested.transaction_version is not None:
        return requested.transaction_version
    return cluster_version if commit else 1


