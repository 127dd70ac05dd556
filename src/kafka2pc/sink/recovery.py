"""Recovery after a crash: roll every undone decision forward, then abort every other open transaction of the
prefix (LISTING, FLIP-511). Exact: ids outside the prefix's grammar are never touched, ids being rolled forward are
never aborted."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence

import attrs

from kafka2pc import metrics
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.config.keys import PRODUCER_KEYS
from kafka2pc.config.producer import max_block_ms
from kafka2pc.errors import (
    CommandRefusedError,
    Kafka2pcError,
    RecoveryIncompleteError,
    TransactionLostError,
    TransactionNotSettledError,
    TransactionOutcomeUnknownError,
)
from kafka2pc.sink.committer import Committer
from kafka2pc.sink.decision_log import DecisionLog, FileDecisionLog
from kafka2pc.sink.naming import TransactionalIdGrammar
from kafka2pc.sink.prepared import PreparedTransaction
from kafka2pc.transaction_control import ONGOING, OPEN_STATES, Settled, TransactionControl, TransactionOutcome

log = logging.getLogger(__name__)


@attrs.frozen
class RecoveryReport:
    """What recovery did."""

    checkpoints_rolled_forward: tuple[int, ...]
    rolled_forward: tuple[str, ...]
    aborted: tuple[str, ...]
    #: every id of the prefix the brokers know, in any state: writers adopt them so POOLING reuses them
    known_ids: tuple[str, ...]
    seconds: float
    #: decided checkpoints that could not be completed (see :class:`RecoveryIncompleteError`)
    stuck: tuple[int, ...] = ()


def open_since(control: TransactionControl, transactional_id: str) -> float | None:
    """When the transaction open on ``transactional_id`` began (DescribeTransactions' start time, in seconds since
    the epoch), for :data:`~kafka2pc.metrics.OLDEST_OPEN_TRANSACTION`; None when it cannot be told now (a metric
    never fails what it watches)."""
    try:
        description = control.describe_full(transactional_id)
    except Exception:
        return None
    if description is None or description.start_time_ms <= 0:
        return None
    return description.start_time_ms / 1000


def abort_open_transactions(control: TransactionControl, grammar: TransactionalIdGrammar,
                            keep: Collection[str] = ()) -> list[str]:
    """Abort the open transaction of every id of ``grammar`` except ``keep``; returns the ids aborted.

    The listing is complete or raises (:class:`~kafka2pc.errors.IncompleteListingError`) before anything is
    aborted. Each abort is conditional on the producer id listed and the producer id and epoch described: a
    transaction that started on the id since is left alone.

    What the listing found open and is left open (kept, or not aborted) is what this process counts under the prefix
    in :data:`~kafka2pc.metrics.OLDEST_OPEN_TRANSACTION` from then on, from when a listing first found it (a lower
    bound of its age); each abort counts in :data:`~kafka2pc.metrics.RECOVERY_SETTLED`."""
    kept = set(keep)
    found = [listing for listing in control.list(states=OPEN_STATES, pattern=f"^{grammar.pattern}$")
             if grammar.owns(listing.transactional_id)]
    # only an ongoing transaction can be aborted: one listed as completing (PrepareCommit, PrepareAbort,
    # PrepareEpochFence) is ending on its coordinator already, like the ones just committed before a cleanup
    listed = [listing for listing in found if listing.transactional_id not in kept and listing.state == ONGOING]
    results = control.abort_all_ongoing([(listing.transactional_id, listing.producer_id) for listing in listed])
    aborted: list[str] = []
    failures: list[Exception] = []
    left_open = [listing.transactional_id for listing in found if listing.transactional_id in kept]
    for listing, result in zip(listed, results, strict=True):
        if isinstance(result, Exception):
            failures.append(result)
            left_open.append(listing.transactional_id)
        elif result is not None:
            log.info("aborted lingering transaction of %r", listing.transactional_id)
            aborted.append(listing.transactional_id)
    metrics.RECOVERY_SETTLED.labels(prefix=grammar.prefix, path=metrics.SINK,
                                    reason=metrics.ABORTED_UNDECIDED).inc(len(aborted))
    # counted from now, not from DescribeTransactions' start time: a look per id, one after another, on the path of
    # every recovery and cleanup (each with the whole resend budget when the coordinator is silent) costs more than
    # the gauge is worth; an id already counted keeps its start
    metrics.OPEN_TRANSACTIONS.retain(grammar.prefix, metrics.SINK, left_open)
    if failures:
        raise failures[0]
    return aborted


def recover(control: TransactionControl, prefix: str, decision_log: DecisionLog, *,
            report_known: bool = True) -> RecoveryReport:
    """Complete what was decided, abort what was not, and report the ids the prefix has on the brokers.

    Reads every undone decision first: a corrupt or foreign record raises
    :class:`~kafka2pc.sink.DecisionLogCorruptError` before any transaction is touched. A decision that cannot be
    completed (a transaction lost, or its fate unknown) does not stop the rest: the other decisions are rolled
    forward and LISTING runs (keeping every id of an undone decision), then :class:`RecoveryIncompleteError` says
    which checkpoints are stuck and why, until an operator resolves them (``kafka2pc recover --resolve``). A
    decision whose transaction is not settled yet (:class:`~kafka2pc.errors.TransactionNotSettledError`: its markers
    still being written, an error that says nothing) does not stop the rest either; when no checkpoint is stuck,
    that error is raised at the end (retriable: the next recovery completes it).
    ``report_known=False`` skips listing the prefix's ids (for engines that do not pool them across restarts).
    """
    with metrics.RECOVERY_RUN_SECONDS.labels(path=metrics.SINK).time():
        return _recover(control, prefix, decision_log, report_known=report_known)


def _recover(control: TransactionControl, prefix: str, decision_log: DecisionLog, *,
             report_known: bool) -> RecoveryReport:
    started = time.monotonic()
    grammar = TransactionalIdGrammar(prefix)
    undone = decision_log.undone()
    keep = {txn.transactional_id for decision in undone for txn in decision.transactions}
    committer = Committer(control, decision_log)
    rolled: list[int] = []
    stuck: dict[int, Kafka2pcError] = {}
    not_settled: list[TransactionNotSettledError] = []
    for decision in undone:
        log.info("rolling checkpoint %d forward (%d transactions)", decision.checkpoint, len(decision.transactions))
        try:
            committer.roll_forward(decision)
        except TransactionNotSettledError as exc:  # may still commit: the next recovery tries again
            log.warning("checkpoint %d is not completed yet: %s", decision.checkpoint, exc)
            not_settled.append(exc)
            continue
        except (TransactionLostError, TransactionOutcomeUnknownError) as exc:
            log.error("checkpoint %d cannot be completed: %s", decision.checkpoint, exc)
            stuck[decision.checkpoint] = exc
            continue
        rolled.append(decision.checkpoint)
    # read again: a decision recorded meanwhile (recovery must not run beside a live committer, but waits on
    # unsettled ends make it long) keeps its ids too
    keep |= {txn.transactional_id for decision in decision_log.undone() for txn in decision.transactions}
    aborted = abort_open_transactions(control, grammar, keep)
    known = [listing.transactional_id for listing in control.list(pattern=f"^{grammar.pattern}$")
             if grammar.owns(listing.transactional_id)] if report_known else []
    rolled_ids = {t.transactional_id for d in undone if d.checkpoint in rolled for t in d.transactions}
    report = RecoveryReport(tuple(rolled), tuple(sorted(rolled_ids)), tuple(aborted), tuple(known),
                            time.monotonic() - started, tuple(sorted(stuck)))
    metrics.RECOVERY_ROLLED_FORWARD.labels(prefix=prefix).inc(len(report.rolled_forward))
    metrics.RECOVERY_ABORTED.labels(prefix=prefix).inc(len(report.aborted))
    metrics.RECOVERY_SETTLED.labels(prefix=prefix, path=metrics.SINK,
                                    reason=metrics.COMMITTED_DECIDED).inc(len(report.rolled_forward))
    metrics.RECOVERY_SECONDS.labels(prefix=prefix).set(report.seconds)
    if stuck:
        raise RecoveryIncompleteError(report, stuck)
    if not_settled:
        raise not_settled[0]
    return report


def resolve_as_done(control: TransactionControl, decision_log: DecisionLog, checkpoint: int, reason: str) -> None:
    """Count the stuck decision of ``checkpoint`` as done (:meth:`~kafka2pc.sink.DecisionLog.resolve`), only when
    no transaction of it can still commit: the next recovery's LISTING no longer keeps their ids, so one still open
    would be aborted although it was decided. A look at each ends nothing; one still open, or one that cannot be
    looked at now, refuses (:class:`~kafka2pc.errors.CommandRefusedError`): run recovery without ``--resolve``
    until only lost ones (or ones whose fate is unknown) are left."""
    decision = decision_log.decision(checkpoint)
    if decision is None:
        raise CommandRefusedError(f"checkpoint {checkpoint} has no decision to resolve")
    looked = control.look_up_all([(t.transactional_id, t.state) for t in decision.transactions])
    for txn, result in zip(decision.transactions, looked, strict=True):
        if isinstance(result, Settled) and result.outcome is None:
            raise CommandRefusedError(f"checkpoint {checkpoint}: {txn.state} of {txn.transactional_id!r} is still "
                                      "open and can still commit: run `kafka2pc recover` without --resolve (it "
                                      "commits it); resolve only what cannot be completed")
        if isinstance(result, Exception) and not isinstance(result, (TransactionLostError,
                                                                    TransactionOutcomeUnknownError)):
            raise CommandRefusedError(f"checkpoint {checkpoint}: {txn.state} of {txn.transactional_id!r} could not "
                                      f"be looked at ({result}); nothing was resolved, try again") from result
    decision_log.resolve(checkpoint, reason)


def resolve_for_replay(control: TransactionControl, decision_log: FileDecisionLog, checkpoint: int,
                       reason: str) -> None:
    """Abandon the stuck decision of ``checkpoint`` so that its replay writes it anew
    (:meth:`~kafka2pc.sink.DecisionLog.resolve` with ``replay=True``), only when that cannot write anything twice.

    Nothing is ended before it is known safe: the log's own refusals come first (a done checkpoint, one below the
    last), then a look at every transaction of the decision, ending nothing. One that committed, or whose fate is
    unknown, refuses the replay; so does a decision none of whose transactions is lost (recovery can still complete
    it). Only then is the replay noted as pending and the open transactions aborted, conditionally on their
    producer id and epoch; a rerun after an interruption takes the transactions the pending note names as aborted
    by it (on protocol v1 its fence leaves their fate unreadable). Run it with the query stopped: a committer rolling
    the decision forward meanwhile can still commit one of them, which then refuses the replay
    (:class:`~kafka2pc.errors.CommandRefusedError` throughout)."""
    decision = decision_log.decision(checkpoint)
    if decision is None:
        raise CommandRefusedError(f"checkpoint {checkpoint} has no decision to resolve")
    decision_log.check_replayable(checkpoint)
    pairs = [(t.transactional_id, t.state) for t in decision.transactions]
    named = [f"{txn_id} {state}" for txn_id, state in pairs]
    pending = decision_log.pending_replay(checkpoint) == named
    looked = control.look_up_all(pairs)
    _refuse_unless_replayable(checkpoint, decision.transactions, looked, pending=pending)
    still_open = [isinstance(r, Settled) and r.outcome is None for r in looked]
    if not pending and all(still_open):
        raise CommandRefusedError(f"checkpoint {checkpoint} is not lost: every transaction of it is still open, and "
                                  "recovery (`kafka2pc recover` without --resolve) can complete it")
    decision_log.note_pending_replay(checkpoint, named)
    to_abort = [t for t, is_open in zip(decision.transactions, still_open, strict=True) if is_open]
    aborted = control.abort_all([(t.transactional_id, t.state) for t in to_abort])
    _refuse_unless_replayable(checkpoint, to_abort, aborted, pending=True)
    decision_log.resolve(checkpoint, reason, replay=True)
    log.warning("checkpoint %d abandoned for replay (%d transaction(s), all aborted): %s", checkpoint,
                len(decision.transactions), reason)


def _refuse_unless_replayable(checkpoint: int, transactions: Sequence[PreparedTransaction],
                              results: Sequence[Settled | Exception], *, pending: bool) -> None:
    """Refuse when a result shows a transaction committed, or (unless a pending replay of ours aborted it) of an
    unknown fate."""
    blocking = []
    for txn, result in zip(transactions, results, strict=False):
        name = f"{txn.transactional_id} {txn.state}"
        if isinstance(result, Settled) and result.outcome is TransactionOutcome.COMMITTED:
            blocking.append(f"{name}: committed")
        elif isinstance(result, TransactionOutcomeUnknownError) and not pending:
            blocking.append(f"{name}: {result}")
        elif isinstance(result, Exception) and not isinstance(result, TransactionOutcomeUnknownError):
            blocking.append(f"{name}: {type(result).__name__}: {result}")
    if blocking:
        raise CommandRefusedError(
            f"checkpoint {checkpoint} cannot be resolved for replay: not every transaction of it is known aborted "
            f"({'; '.join(blocking)}). Replaying it could write rows twice: check the topic, then resolve it "
            "without replay (the checkpoint then counts as done).")


def abort_lingering(config: Mapping[str, object], prefix: str, keep: Collection[str] = ()) -> list[str]:
    """Abort every open transaction whose id is ``<prefix>-<subtask>-<counter>``, except those in ``keep``.

    ``config`` holds the connection settings (Kafka's dotted names; producer keys are accepted and ignored).
    Returns the ids whose transactions were aborted.
    """
    client_config = ClientConfig.from_dict(config, consumed_elsewhere=PRODUCER_KEYS)
    with ClusterClient(client_config, bootstrap_timeout_s=max_block_ms(config) / 1000) as client:
        return abort_open_transactions(TransactionControl(client), TransactionalIdGrammar(prefix), keep)
