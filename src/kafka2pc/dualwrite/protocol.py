"""The dual-write protocol, decided once for every edge (sans-IO: its steps yield actions, see :mod:`.actions`).

Per transaction: lock the id's state row, hand the application its block, prepare Kafka, store the prepared state
in the row, commit the database (the commit point), complete Kafka. Recovery reads the row and commits what the
database committed, aborts what it did not (:mod:`kafka2pc.dualwrite.recovery`)."""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from kafka2pc import metrics
from kafka2pc.dualwrite.actions import Block, Call, Commit, Rollback, Steps
from kafka2pc.dualwrite.connection import DbapiConnection
from kafka2pc.dualwrite.outcome import CommitOutcome, judge_failed_commit
from kafka2pc.dualwrite.recovery import plan_recovery
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import (
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriteRecoveryError,
    DualWriteUsageError,
    Kafka2pcError,
    ProducerFencedError,
    TransactionLostError,
    TransactionOutcomeUnknownError,
    TransactionStateError,
)
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.producer import DECISION_STANDS_S, TwoPhaseProducer, decision_stands
from kafka2pc.sink.recovery import open_since
from kafka2pc.transaction_control import ONGOING, TransactionControl

log = logging.getLogger("kafka2pc.dualwrite.writer")

#: the state row's owner after DualWriter.resolve: no writer, yet the row has been owned (see plan_recovery)
RESOLVED_BY_OPERATOR = "resolved-by-operator"
#: a record kept back by an edge until the block ends: TwoPhaseProducer.produce's arguments
Record = tuple[Any, ...]


def _prepare(producer: TwoPhaseProducer, records: Sequence[Record]) -> PreparedTxnState:
    for record in records:
        producer.produce(*record)
    with metrics.on_behalf_of(metrics.DUAL_WRITE):
        return producer.prepare_transaction()


def _as_dual_write(function: Callable[..., Any], *args: Any) -> Any:
    with metrics.on_behalf_of(metrics.DUAL_WRITE):
        return function(*args)


class WriterProtocol:
    """One dual writer's state and its protocol steps. ``new_producer`` and ``new_control`` make (without I/O) a
    TwoPhaseProducer and a TransactionControl for the writer's cluster; ``now`` is the monotonic clock of two-phase
    decisions; ``lease`` is (its token, its length in seconds) for a pool's writer."""

    def __init__(self, transactional_id: str, db: DbapiConnection, table: StateTable, *,
                 new_producer: Callable[[], TwoPhaseProducer], new_control: Callable[[], TransactionControl],
                 two_phase_commit: bool, owner: str, lease: tuple[str, float] | None,
                 recovery_idle_limit_ms: int | None, metric_prefix: str, now: Callable[[], float]):
        self.transactional_id = transactional_id
        self.db, self.table = db, table
        self._new_producer, self._new_control = new_producer, new_control
        self.producer = new_producer()
        self.two_phase_commit, self.owner, self.lease = two_phase_commit, owner, lease
        #: a leased writer's recovery waits on Kafka (up to max.block.ms) with its row locked
        self.recovery_idle_limit_ms = recovery_idle_limit_ms
        self.metric_prefix = metric_prefix
        self._now = now
        #: True until a recovery has settled the id, and again from a database commit until Kafka's completion
        self.needs_recovery = True
        #: True once a recovery made this writer the id's owner: from then on another owner means it is fenced
        self.owned = False
        #: when the producer decided on two-phase commit (its init_transactions, in the last recovery)
        self.decided_at: float | None = None

    # -- recovery ----------------------------------------------------------------------------------------------------

    def recover(self, *, take_over: bool = True, keep_lease: bool = False) -> Steps[None]:
        """Settle what the id has left unfinished, then own it (see DualWriter.recover)."""
        with metrics.RECOVERY_RUN_SECONDS.labels(path=metrics.DUAL_WRITE).time():
            yield from self._recover(take_over=take_over, keep_lease=keep_lease)

    def recover_unfinished(self, *, keep_lease: bool = False) -> Steps[None]:
        """Recover when needed, never taking the id back from a later owner (see DualWriter.recover_unfinished)."""
        if self.needs_recovery:
            yield from self.recover(take_over=not self.owned, keep_lease=keep_lease)

    def _recover(self, *, take_over: bool, keep_lease: bool) -> Steps[None]:
        table, control = self.table, self._new_control()
        yield Call(self.producer.close)  # in whatever state: a prepared transaction stays open for the decision below
        self.producer = self._new_producer()
        stored = yield from table.begin_locked(self.transactional_id, idle_limit_ms=self.recovery_idle_limit_ms)
        try:
            if self.lease is not None and stored.lease_owner != self.owner:
                raise ProducerFencedError(f"{self.transactional_id!r}: this process's lease on the id was taken over "
                                          "by another process (it expired): this writer is fenced; the new holder "
                                          "settles its unfinished transaction")
            if not take_over and stored.owner not in (None, self.owner):
                raise ProducerFencedError(f"{self.transactional_id!r} belongs to another writer now (it recovered "
                                          "after this one): this writer is fenced; its unfinished transaction is "
                                          "the new owner's to settle")
            observed = yield Call(control.describe, (self.transactional_id,))
            if observed is not None and observed.state == ONGOING:  # open until settled: the gauge counts it
                since = yield Call(open_since, (control, self.transactional_id))
                metrics.OPEN_TRANSACTIONS.found(self.metric_prefix, metrics.DUAL_WRITE, self.transactional_id,
                                                lambda: since)
            plan = plan_recovery(stored.prepared, stored.completed, observed, two_phase_active=stored.two_phase,
                                 ever_owned=stored.owner is not None)
            if plan.problem is not None:
                raise DualWriteRecoveryError(f"{self.transactional_id!r}: {plan.problem}. Nothing was changed; after "
                                             "checking the topic, DualWriter.resolve(reason) clears the row")
            if plan.abort is not None:
                aborted = yield Call(functools.partial(control.abort_ongoing, self.transactional_id,
                                                        producer_id=plan.abort.producer_id))
                if aborted is not None:
                    self._count_settled(metrics.ABORTED_UNDECIDED)
                log.info("%r: aborted %s, which the database never committed", self.transactional_id, plan.abort)
            if plan.commit is not None:
                yield from self._commit_stored(control, plan.commit,
                                               unknown_means_committed=plan.unknown_means_committed)
            yield Call(self.producer.init_transactions)
        except BaseException as exc:  # a fence, or an interrupt, never keeps the lease
            yield from self._end_failed_recovery(keep_lease=keep_lease and isinstance(exc, Exception)
                                                 and not isinstance(exc, ProducerFencedError))
            raise
        try:
            self.decided_at = self._now()
            yield from table.write(self.transactional_id, owner=self.owner, completed=True, lease=self.lease)
            yield Commit()
        except BaseException:
            yield from self._end_failed_recovery(keep_lease=False)
            raise
        self.needs_recovery = False
        self.owned = True
        metrics.OPEN_TRANSACTIONS.closed(self.metric_prefix, metrics.DUAL_WRITE, self.transactional_id)

    def _end_failed_recovery(self, *, keep_lease: bool) -> Steps[None]:
        """Roll back a recovery that wrote nothing. Its row was locked while it waited for Kafka, and the keeper's
        renewals skip a locked row: with ``keep_lease`` the lease, if still this writer's, is renewed before the lock
        is let go, or another process could claim the id in between (and do no better). Paths that give the id up
        (a reap, a retirement, a failed start) do not keep it."""
        if keep_lease and self.lease is not None:
            try:
                yield self.table.extend_lease(self.transactional_id, self.lease)
                yield Commit()
                return
            except Exception:
                pass
        with contextlib.suppress(Exception):
            yield Rollback()

    def _count_settled(self, reason: str) -> None:
        metrics.RECOVERY_SETTLED.labels(prefix=self.metric_prefix, path=metrics.DUAL_WRITE, reason=reason).inc()

    def _commit_stored(self, control: TransactionControl, stored: PreparedTxnState, *,
                       unknown_means_committed: bool) -> Steps[None]:
        try:
            if (yield Call(control.commit, (self.transactional_id, stored))).ended_now:
                self._count_settled(metrics.COMMITTED_DECIDED)
        except TransactionLostError as exc:
            raise DualWriteRecoveryError(f"{self.transactional_id!r}: the database committed Kafka transaction "
                                         f"{stored}, which Kafka can no longer commit: {exc}") from exc
        except TransactionOutcomeUnknownError as exc:
            if not unknown_means_committed:
                raise DualWriteRecoveryError(f"{self.transactional_id!r}: the database committed Kafka transaction "
                                             f"{stored}, prepared without two-phase commit; its fate cannot be known "
                                             f"now ({exc})") from exc
            log.debug("%r: %s was completed before (%s)", self.transactional_id, stored, exc)

    def resolve(self, reason: str) -> Steps[None]:
        """Operator action after a DualWriteRecoveryError: mark the stored transaction handled."""
        yield from self.table.begin_locked(self.transactional_id)
        # the operator's mark owns the id (a recovery then acts on whatever Kafka holds open) until a writer recovers
        yield from self.table.write(self.transactional_id, owner=RESOLVED_BY_OPERATOR, completed=True,
                                    clear_problem=True)
        yield Commit()
        self.needs_recovery, self.owned = True, False
        log.warning("%r: stored transaction marked handled by an operator: %s", self.transactional_id, reason)

    # -- a transaction -----------------------------------------------------------------------------------------------

    def transaction(self) -> Steps[None]:
        """One dual-write transaction; its Block is the application's."""
        yield from self.recover_unfinished(keep_lease=True)
        yield from self._decide_again_if_due()
        table, producer = self.table, self.producer
        yield from self._lock_owned_row()
        token = uuid.uuid4().hex
        savepoint_held = False
        try:
            yield table.mark_block()
            savepoint_held = True
            yield Call(producer.begin_transaction)
            metrics.OPEN_TRANSACTIONS.opened(self.metric_prefix, metrics.DUAL_WRITE, self.transactional_id)
            kept_back = yield Block()
            yield from self._check_block_intact()
            savepoint_held = False
            prepared = yield Call(_prepare, (producer, kept_back))
            yield from table.write(self.transactional_id, prepared=prepared, two_phase=producer.two_phase_commit_active,
                                   token=token, completed=False, lease=self.lease)
        except Exception as exc:
            ended = False
            try:
                ended = savepoint_held and not isinstance(exc, DualWriteUsageError) and (
                    self.db.ended_inside()  # known in memory: even if the connection was lost afterwards
                    or (not self.session_lost(exc) and not self.db.marked_for_rollback()
                        and not table.is_failed_transaction(exc) and (yield from table.block_ended())))
            finally:  # an interrupt thrown in at the savepoint's check must not skip the rollback
                yield from self._roll_back_both()
            if ended:
                raise self._block_ended_error(exc, session_gone=self.session_lost(exc)) from exc
            raise
        except BaseException:
            yield from self._roll_back_both()
            raise
        self.needs_recovery = True  # from here only the database's answer (or a recovery) decides
        yield from self._commit_database(prepared, token)
        try:
            yield Call(_as_dual_write, (producer.complete_transaction, prepared))
            metrics.OPEN_TRANSACTIONS.closed(self.metric_prefix, metrics.DUAL_WRITE, self.transactional_id)
        except Exception as exc:
            raise DualWriteIncompleteError(f"{self.transactional_id!r}: the database committed; completing Kafka "
                                           f"transaction {prepared} failed ({exc}); the writer's next transaction() "
                                           "commits it first, or raises ProducerFencedError if another writer "
                                           "recovered the id meanwhile (which committed it); recover() takes the id "
                                           "over from such a writer") from exc
        if not producer.two_phase_commit_active:
            # without 2PC a recovery cannot read "the id moved past the stored transaction" as "it committed" (the
            # broker may have timed it out), and the next begin moves the id past it (protocol v1 bumps the epoch):
            # so the row must say it completed before then. A failure here leaves it to a recovery, which can tell.
            try:
                yield from self._mark_completed()
            except Exception as exc:
                log.warning("%r: could not record in the database that %s completed (%r); the next transaction() "
                            "recovers first", self.transactional_id, prepared, exc)
                with contextlib.suppress(Exception):
                    yield Rollback()
                return
        self.needs_recovery = False

    def _lock_owned_row(self) -> Steps[None]:
        """Lock the id's row, and check this writer still owns the id (and its lease)."""
        stored = yield from self.table.begin_locked(self.transactional_id)
        if self.lease is not None and stored.lease_owner != self.owner:
            yield Rollback()
            raise ProducerFencedError(f"{self.transactional_id!r}: this process's lease on the id was taken over by "
                                      "another process (it expired): this writer is fenced")
        if stored.owner != self.owner:
            yield Rollback()
            raise ProducerFencedError(f"{self.transactional_id!r} belongs to another writer now (it recovered after "
                                      "this one): this writer is fenced")

    def _decide_again_if_due(self) -> Steps[None]:
        """Between transactions, once the producer's two-phase decision no longer stands (older than
        ``DECISION_STANDS_S``): a recovery, which finds the last transaction completed and initialises a new producer,
        so the writer follows a cluster that gained two-phase commit, or turned it off. Should it fail, the writer
        needs a recovery, as after any other failure."""
        if not self.two_phase_commit or decision_stands(self.decided_at, self._now()):
            return
        log.info("%r: two-phase commit was decided (%s) more than %g s ago: initialising again to follow the "
                 "cluster", self.transactional_id,
                 "in use" if self.producer.two_phase_commit_active else "fallen back", DECISION_STANDS_S)
        self.needs_recovery = True
        yield from self.recover_unfinished(keep_lease=True)

    def _check_block_intact(self) -> Steps[None]:
        """Raise if the application ended the DB transaction inside the block (its commit() or rollback() ends the
        savepoint taken after the lock, and drops the lock with it)."""
        misuse = self.db.block_misuse()
        if misuse is not None:
            raise DualWriteUsageError(f"{self.transactional_id!r}: {misuse}. Both were rolled back")
        if self.db.ended_inside():
            raise self._block_ended_error(RuntimeError("the connection's transaction ended inside the block"))
        try:
            yield self.table.release_block()
        except Exception as exc:
            if self.table.is_failed_transaction(exc) or self.session_lost(exc):
                raise  # a statement in the block failed and the application went on, or the session is gone
            raise self._block_ended_error(exc) from exc

    def session_lost(self, exc: BaseException) -> bool:
        """Whether the database session ended under the block (a lost server, PostgreSQL ending a session idle in
        its transaction for a lease): the database's own error says so, not a usage error."""
        return self.table.session_ended(exc) or self.db.lost()

    def _block_ended_error(self, exc: BaseException, *, session_gone: bool = False) -> DualWriteUsageError:
        # a session the database ended (its own idle_in_transaction_session_timeout, a restart, a pooler) also ends
        # the transaction that took the savepoint, and the block's rows went with it unless the application had
        # committed them inside: from here the two cannot be told apart, and only the second splits
        gone = (" Or the database ended the session while the block ran (the session's own "
                "idle_in_transaction_session_timeout during a long wait, a restart, a pooler): then nothing of the "
                "block was committed, but the two cannot be told apart from here."
                if session_gone else "")
        return DualWriteUsageError(
                f"{self.transactional_id!r}: the connection's transaction was committed or rolled back inside the "
                "transaction() block (by the application, a helper or an ORM). Kafka's transaction is aborted and "
                "the database's open work rolled back; rows committed inside the block before that stay committed "
                f"without their events. Let the block commit.{gone} ({exc!r})")

    def _mark_completed(self) -> Steps[None]:
        """Record in the row, in a DB transaction of its own, that its transaction completed (this writer's only)."""
        stored = yield from self.table.begin_locked(self.transactional_id)
        if stored.owner == self.owner and (self.lease is None or stored.lease_owner == self.owner):
            yield from self.table.write(self.transactional_id, completed=True)
        yield Commit()

    def _commit_database(self, prepared: PreparedTxnState, token: str) -> Steps[None]:
        session = self.db.session()
        try:
            with metrics.RECORD_DECISION_SECONDS.labels(path=metrics.DUAL_WRITE).time():
                yield Commit()
        except Exception as exc:
            read_back = yield from self.table.read_back(self.transactional_id, token, session)
            outcome = judge_failed_commit(read_back, definite_error=self.table.is_definite_failure(exc))
            if outcome is CommitOutcome.COMMITTED:
                log.warning("%r: the database reported %r at commit, yet the commit landed", self.transactional_id,
                            exc)
                return
            if outcome is CommitOutcome.FAILED:
                yield from self._roll_back_both()  # a Kafka abort that fails leaves the writer needing a recovery
                raise
            raise DualWriteOutcomeUnknownError(f"{self.transactional_id!r}: the database commit's outcome is unknown "
                                               f"({exc}); Kafka transaction {prepared} stays prepared until a "
                                               "recovery (the writer's next transaction(), or recover()) settles it "
                                               "by what the database holds") from exc

    def _roll_back_both(self) -> Steps[None]:
        """Roll the database back and abort Kafka's transaction; when the abort fails, the next transaction() (or
        the pool's close) recovers first, which aborts it."""
        interrupted: BaseException | None = None
        try:
            yield Rollback()
        except Exception:
            pass
        except BaseException as exc:  # an interrupt during the DB rollback: Kafka's abort still follows
            interrupted = exc
        try:
            yield from self._abort_kafka()
        finally:
            if interrupted is not None:
                raise interrupted

    def _abort_kafka(self) -> Steps[None]:
        try:
            yield Call(_as_dual_write, (self.producer.abort_transaction,))
            metrics.OPEN_TRANSACTIONS.closed(self.metric_prefix, metrics.DUAL_WRITE, self.transactional_id)
        except TransactionStateError:
            return  # no transaction was begun: nothing to abort
        except Kafka2pcError as exc:
            self.needs_recovery = True
            log.warning("%r: could not abort the Kafka transaction (%s); the writer's next transaction() or "
                        "recover() aborts it", self.transactional_id, exc)
            return
        self.needs_recovery = False

    def close(self) -> Steps[None]:
        """Mark the last transaction complete in the row when it is, and close the producer (see DualWriter.close)."""
        with contextlib.suppress(Exception):
            if not self.needs_recovery and not self.db.in_transaction():
                yield from self._mark_completed()
        yield Call(self.producer.close)
        # a transaction left unfinished is no longer this writer's to know: whoever settles it counts it
        metrics.OPEN_TRANSACTIONS.closed(self.metric_prefix, metrics.DUAL_WRITE, self.transactional_id)
