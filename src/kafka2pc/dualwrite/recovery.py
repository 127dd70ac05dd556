"""What a dual writer's recovery does, decided from what the database stored and what the coordinator reports
(sans-IO: the writer carries it out).

The database's commit is the commit point: a prepared state in the row is a transaction the database committed, so
it is committed in Kafka; any other open transaction of the id was never committed in the database and is aborted.
A writer begins a Kafka transaction only after completing its previous one, and a successor recovers before it
writes, so a stored transaction the id has moved past was committed — when prepared transactions cannot time out
(two-phase commit active). Anything else is reported, never guessed."""

from __future__ import annotations

import attrs

from kafka2pc.coordinator_messages import ONGOING, ObservedTransaction, ProducerIdentity
from kafka2pc.prepared_state import PreparedTxnState


@attrs.frozen
class RecoveryPlan:
    """The actions, in order: abort ``abort`` (an open transaction the DB never committed), commit ``commit`` (the
    stored one, still open), then mark the row completed; or ``problem`` and nothing."""

    abort: ObservedTransaction | None = None
    commit: PreparedTxnState | None = None
    #: the stored transaction ended before: committed (see the module docstring)
    already_complete: bool = False
    problem: str | None = None


def plan_recovery(stored: PreparedTxnState | None, completed: bool, observed: ObservedTransaction | None, *,
                  two_phase_active: bool) -> RecoveryPlan:
    """Decide from the row (``stored``, ``completed``, and whether it was prepared with two-phase commit active)
    and DescribeTransactions (``observed``; None: unknown id)."""
    pending = observed if observed is not None and observed.state == ONGOING else None
    if stored is None or completed:
        if pending is not None and (stored is None or pending.identity != _identity(stored)):
            return RecoveryPlan(abort=pending)
        if pending is not None:  # the completed row's own transaction open again cannot happen: report it
            return RecoveryPlan(problem=f"the row says {stored} is complete, yet the coordinator reports {observed}")
        return RecoveryPlan()
    if observed is None:
        return RecoveryPlan(problem=f"the database committed Kafka transaction {stored}, but the coordinator no longer "
                                    "knows the transactional id (expired, or another cluster): whether Kafka "
                                    "committed it cannot be confirmed")
    if observed.producer_id != stored.producer_id:
        return RecoveryPlan(problem=f"the database committed Kafka transaction {stored}, but the coordinator holds "
                                    f"another producer id ({observed}): whether Kafka committed it cannot be confirmed")
    if pending is not None and pending.epoch == stored.epoch:
        return RecoveryPlan(commit=stored)
    if observed.epoch < stored.epoch:
        return RecoveryPlan(problem=f"the coordinator reports {observed}, older than the stored {stored}")
    abort = pending
    if not two_phase_active:
        # the broker may have aborted it on its timeout: the completion's own judgement decides (commit() reports)
        return RecoveryPlan(abort=abort, commit=stored)
    return RecoveryPlan(abort=abort, already_complete=True)


def _identity(state: PreparedTxnState) -> ProducerIdentity:
    return ProducerIdentity(state.producer_id, state.epoch)
