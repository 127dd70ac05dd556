"""What a dual writer's recovery does, decided from what the database stored and what the coordinator reports
(sans-IO: the writer carries it out).

The database's commit is the commit point: a prepared state in the row is a transaction the database committed, so
it is committed in Kafka; any other open transaction of the id was never committed in the database and is aborted.
A writer begins a Kafka transaction only after completing its previous one (after an unfinished one it recovers
first), and a successor recovers before it writes, so an open transaction that is not the stored one means the
stored one was completed, and a stored transaction the id has moved past was committed — when prepared
transactions cannot time out (two-phase commit active). Anything else is reported, never guessed."""

from __future__ import annotations

import attrs

from kafka2pc.prepared_state import MAX_EPOCH, PreparedTxnState
from kafka2pc.transaction_control import ONGOING, ObservedTransaction, ProducerIdentity

#: a stored transaction at this epoch or later may be the last before the producer id rotated (a v1 producer bumps
#: twice between transactions, and the bump that would reach 32766 rotates instead)
ROTATION_EPOCH = MAX_EPOCH - 4


@attrs.frozen
class RecoveryPlan:
    """The actions, in order: abort ``abort`` (an open transaction the DB never committed), commit ``commit`` (the
    stored one), then mark the row completed; or ``problem`` and nothing. ``unknown_means_committed``: if the
    completion cannot tell the stored transaction's fate because the id moved past it, it was committed (prepared
    with two-phase commit: no broker timeout could have aborted it)."""

    abort: ObservedTransaction | None = None
    commit: PreparedTxnState | None = None
    unknown_means_committed: bool = False
    problem: str | None = None


def plan_recovery(stored: PreparedTxnState | None, completed: bool, observed: ObservedTransaction | None, *,
                  two_phase_active: bool, ever_owned: bool = True) -> RecoveryPlan:
    """Decide from the row (``stored``: the last transaction the database committed; ``completed``: known to be
    complete; ``two_phase_active``: prepared with two-phase commit; ``ever_owned``: a writer ever recovered the id
    in this table) and DescribeTransactions (``observed``; None: the coordinator does not know the id)."""
    pending = observed if observed is not None and observed.state == ONGOING else None
    if stored is None:
        if pending is not None and not ever_owned:
            # no writer ever owned the id here (another state table or search_path, a truncated table): the open
            # transaction may be one another table's database committed, so aborting it could lose decided data
            return RecoveryPlan(problem=f"Kafka holds an open transaction ({pending}) for an id no writer ever "
                                        "owned in this state table (another state_table= or search_path, or a "
                                        "truncated table?): whether a database committed it cannot be known")
        return RecoveryPlan(abort=pending)
    if pending is not None:
        if pending.identity == _identity(stored):
            return RecoveryPlan(commit=stored)  # the DB committed it and Kafka has it open: mode (c)
        # never committed by the DB (modes a, b); the stored one was completed before it began, whatever producer
        # id it has (a rotation on epoch exhaustion included)
        return RecoveryPlan(abort=pending)
    if completed:
        return RecoveryPlan()
    if observed is None:
        return RecoveryPlan(problem=f"the database committed Kafka transaction {stored}, but the coordinator no longer "
                                    "knows the transactional id (expired, or another cluster): whether Kafka "
                                    "committed it cannot be confirmed")
    if observed.producer_id != stored.producer_id and stored.epoch < ROTATION_EPOCH:
        # not a rotation on epoch exhaustion: the id was re-created since (expired and reused, another cluster)
        return RecoveryPlan(problem=f"the database committed Kafka transaction {stored}, but the coordinator holds "
                                    f"another producer id ({observed}) without an exhausted epoch to explain it: "
                                    "whether Kafka committed it cannot be confirmed")
    return RecoveryPlan(commit=stored, unknown_means_committed=two_phase_active)


def _identity(state: PreparedTxnState) -> ProducerIdentity:
    return ProducerIdentity(state.producer_id, state.epoch)
