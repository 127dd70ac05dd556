"""DualWriter: one database transaction and one Kafka transaction, committed atomically (docs/dual-write.md).

Per transaction: lock the id's state row, write the application's rows and produce, prepare Kafka, store the
prepared state in the row, commit the database (the commit point), complete Kafka. Recovery reads the row and
commits what the database committed, aborts what it did not (:mod:`kafka2pc.dualwrite.recovery`)."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from kafka2pc import metrics
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig, ProducerConfig
from kafka2pc.config.keys import PRODUCER_KEYS
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import Lease
from kafka2pc.dualwrite.outcome import CommitOutcome, judge_failed_commit
from kafka2pc.dualwrite.recovery import plan_recovery
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import (
    ConfigError,
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
from kafka2pc.producer import DECISION_STANDS_S, Transport, TwoPhaseProducer, decision_stands
from kafka2pc.sink.recovery import open_since
from kafka2pc.transaction_control import ONGOING, ControlTransport, TransactionControl

log = logging.getLogger(__name__)

#: the clock of two-phase decisions (monotonic)
_now = time.monotonic
#: the state row's owner after DualWriter.resolve: no writer, yet the row has been owned (see plan_recovery)
RESOLVED_BY_OPERATOR = "resolved-by-operator"


class ClusterTransport(Transport, ControlTransport, Protocol):
    """What a dual writer needs of a cluster when it is not given a real one (a coordinator model, in tests)."""


class DualWriteTransaction:
    """The inside of ``with writer.transaction() as tx``: ``tx.cursor`` (a DB-API cursor) or ``tx.connection`` (the
    writer's connection: a SQLAlchemy ``Connection`` when it was given one or an ``Engine``) for the database,
    ``tx.produce`` for Kafka."""

    def __init__(self, cursor: Any, producer: TwoPhaseProducer, connection: Any):
        self.cursor = cursor
        self.connection = connection
        self._producer = producer

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
                headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None = None) -> None:
        """Add a record to the Kafka transaction (TwoPhaseProducer.produce's arguments)."""
        self._producer.produce(topic, value, key, partition, headers)


class DualWriter:
    """Commits a DB-API connection's transaction and a Kafka transaction atomically, under one transactional id.

    ``config`` is a TwoPhaseProducer configuration (``bootstrap.servers``, ``transactional.id``, ...). One writer
    per transactional id at a time: a second one with the same id fences the first (in Kafka, and in the database
    through the state row's owner). ``transport`` replaces the network (a coordinator model, in tests). ``lease``
    and ``lease_s`` are set by DualWriterPool: the writer then uses the id only while its lease holds."""

    def __init__(self, connection: Any, config: Mapping[str, object], *, two_phase_commit: bool = True,
                 state_table: str = "kafka2pc_dual_write_state", create_state_table: bool = True,
                 transport: ClusterTransport | None = None, lease: Lease | None = None, lease_s: float = 15.0):
        self.transactional_id = str(config.get("transactional.id") or "")
        if not self.transactional_id:
            raise ConfigError("transactional.id", "is required: one writer instance = one transactional id")
        self._db = adapt(connection)
        self._table = StateTable(self._db, state_table, create=create_state_table)
        self._config, self._two_phase_commit = dict(config), two_phase_commit
        producer_config = ProducerConfig.from_dict(config, two_phase_commit=two_phase_commit)
        self._client: ClusterClient | None = None
        if transport is None:
            self._client = ClusterClient(ClientConfig.from_dict(dict(config), consumed_elsewhere=PRODUCER_KEYS),
                                         bootstrap_timeout_s=producer_config.max_block_ms / 1000,
                                         client_id=f"kafka2pc-{self.transactional_id}")
        self._transport = transport
        self._producer = self._new_producer()
        self._owner = lease.token if lease is not None else uuid.uuid4().hex
        #: (its token, its length in seconds) for a pool's writer: every write of the row renews it, conditionally
        self._lease = (lease.token, lease_s) if lease is not None else None
        #: a leased writer's transactions end themselves when left idle in the database for a lease (a frozen
        #: process: its row frees for a claim); a recovery's waits on Kafka (up to max.block.ms) get that long more
        self._recovery_idle_limit_ms: int | None = None
        if lease is not None:
            self._table.idle_limit_ms = int(lease_s * 1000)
            self._recovery_idle_limit_ms = max(int(lease_s * 1000), producer_config.max_block_ms + 5000)
        #: True until a recovery has settled the id, and again from a database commit until Kafka's completion
        self._needs_recovery = True
        #: True once a recovery made this writer the id's owner: from then on another owner means it is fenced
        self._owned = False
        self._in_block = False
        #: when the producer decided on two-phase commit (its init_transactions, in the last recovery)
        self._decided_at: float | None = None
        #: the metrics' prefix label: a pool's (its ids are <prefix>-<n>), else this writer's id
        self._metric_prefix = self.transactional_id.rsplit("-", 1)[0] if lease is not None else self.transactional_id

    def _new_producer(self) -> TwoPhaseProducer:
        if self._client is not None:
            return TwoPhaseProducer(self._config, two_phase_commit=self._two_phase_commit, cluster=self._client)
        return TwoPhaseProducer(self._config, two_phase_commit=self._two_phase_commit, transport=self._transport)

    def _control(self) -> TransactionControl:
        if self._client is not None:
            return TransactionControl(self._client)
        assert self._transport is not None
        return TransactionControl(self._transport)

    @property
    def connection(self) -> Any:
        """The connection the writer works through: the DB-API or SQLAlchemy connection it was given, or the one it
        checked out of a SQLAlchemy Engine."""
        return self._db.given

    @property
    def lease_token(self) -> str | None:
        """The token of the lease this writer holds its id by (a pool's writer), else None."""
        return None if self._lease is None else self._lease[0]

    @property
    def two_phase_commit_active(self) -> bool:
        """Whether Kafka prepared transactions are free of the broker's timeout (see TwoPhaseProducer)."""
        return self._producer.two_phase_commit_active

    def recover(self) -> None:
        """Settle what a crashed predecessor (or this writer's own unfinished transaction) left on this
        transactional id, then own the id, fencing any other writer with it. Holds the state row while it runs: a
        live predecessor's transaction finishes first. ``transaction()`` runs it whenever it is needed (and then
        never takes the id back from a writer that took it over: ProducerFencedError)."""
        with metrics.RECOVERY_RUN_SECONDS.labels(path=metrics.DUAL_WRITE).time():
            self._recover(take_over=True)

    @property
    def unfinished(self) -> bool:
        """Whether a transaction of this writer may be left open in Kafka until a recovery settles it."""
        return self._needs_recovery

    def recover_unfinished(self, *, keep_lease: bool = False) -> None:
        """What ``transaction()`` does first when needed: settle this writer's unfinished transaction (a writer that
        never recovered: the id's); ProducerFencedError rather than take the id back from a later writer. With
        ``keep_lease`` (a caller that keeps the id: a request, a pool's keeper), a recovery that fails renews this
        writer's lease before it lets the id's row go."""
        if self._needs_recovery:
            with metrics.RECOVERY_RUN_SECONDS.labels(path=metrics.DUAL_WRITE).time():
                self._recover(take_over=not self._owned, keep_lease=keep_lease)

    def _recover(self, *, take_over: bool, keep_lease: bool = False) -> None:
        table, control = self._table, self._control()
        self._producer.close()  # in whatever state: a prepared transaction stays open for the decision below
        self._producer = self._new_producer()
        stored = table.begin_locked(self.transactional_id, idle_limit_ms=self._recovery_idle_limit_ms)
        try:
            if self._lease is not None and stored.lease_owner != self._owner:
                raise ProducerFencedError(f"{self.transactional_id!r}: this process's lease on the id was taken over "
                                          "by another process (it expired): this writer is fenced; the new holder "
                                          "settles its unfinished transaction")
            if not take_over and stored.owner not in (None, self._owner):
                raise ProducerFencedError(f"{self.transactional_id!r} belongs to another writer now (it recovered "
                                          "after this one): this writer is fenced; its unfinished transaction is "
                                          "the new owner's to settle")
            observed = control.describe(self.transactional_id)
            if observed is not None and observed.state == ONGOING:  # open until settled: the gauge counts it
                metrics.OPEN_TRANSACTIONS.found(self._metric_prefix, metrics.DUAL_WRITE, self.transactional_id,
                                                lambda: open_since(control, self.transactional_id))
            plan = plan_recovery(stored.prepared, stored.completed, observed, two_phase_active=stored.two_phase,
                                 ever_owned=stored.owner is not None)
            if plan.problem is not None:
                raise DualWriteRecoveryError(f"{self.transactional_id!r}: {plan.problem}. Nothing was changed; after "
                                             "checking the topic, DualWriter.resolve(reason) clears the row")
            if plan.abort is not None:
                if control.abort_ongoing(self.transactional_id, producer_id=plan.abort.producer_id) is not None:
                    self._count_settled(metrics.ABORTED_UNDECIDED)
                log.info("%r: aborted %s, which the database never committed", self.transactional_id, plan.abort)
            if plan.commit is not None:
                self._commit_stored(control, plan.commit, unknown_means_committed=plan.unknown_means_committed)
            self._producer.init_transactions()
        except BaseException as exc:  # a fence, or an interrupt, never keeps the lease
            self._end_failed_recovery(keep_lease=keep_lease and isinstance(exc, Exception)
                                      and not isinstance(exc, ProducerFencedError))
            raise
        try:
            self._decided_at = _now()
            table.write(self.transactional_id, owner=self._owner, completed=True, lease=self._lease)
            self._db.commit()
        except BaseException:
            self._end_failed_recovery(keep_lease=False)
            raise
        self._needs_recovery = False
        self._owned = True
        metrics.OPEN_TRANSACTIONS.closed(self._metric_prefix, metrics.DUAL_WRITE, self.transactional_id)

    def _end_failed_recovery(self, *, keep_lease: bool) -> None:
        """Roll back a recovery that wrote nothing. Its row was locked while it waited for Kafka, and the keeper's
        renewals skip a locked row: with ``keep_lease`` the lease, if still this writer's, is renewed before the lock
        is let go, or another process could claim the id in between (and do no better). Paths that give the id up
        (a reap, a retirement, a failed start) do not keep it."""
        if keep_lease and self._lease is not None:
            with contextlib.suppress(Exception):
                self._table.extend_lease(self.transactional_id, self._lease)
                self._db.commit()
                return
        with contextlib.suppress(Exception):
            self._db.rollback()

    def _count_settled(self, reason: str) -> None:
        metrics.RECOVERY_SETTLED.labels(prefix=self._metric_prefix, path=metrics.DUAL_WRITE, reason=reason).inc()

    def _commit_stored(self, control: TransactionControl, stored: PreparedTxnState, *,
                       unknown_means_committed: bool) -> None:
        try:
            if control.commit(self.transactional_id, stored).ended_now:
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

    def resolve(self, reason: str) -> None:
        """Operator action after a DualWriteRecoveryError: mark the stored transaction handled (``reason`` logged)."""
        if not reason.strip():
            raise ValueError("a resolution needs a reason")
        self._table.begin_locked(self.transactional_id)
        # the operator's mark owns the id (a recovery then acts on whatever Kafka holds open) until a writer recovers
        self._table.write(self.transactional_id, owner=RESOLVED_BY_OPERATOR, completed=True, clear_problem=True)
        self._db.commit()
        self._needs_recovery, self._owned = True, False
        log.warning("%r: stored transaction marked handled by an operator: %s", self.transactional_id, reason)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[DualWriteTransaction]:
        """One DB transaction and one Kafka transaction, committed together on leaving the block; an exception
        inside rolls both back and is re-raised."""
        if self._in_block:
            raise DualWriteUsageError(f"{self.transactional_id!r}: transaction() inside another transaction() block "
                                      "of the same writer; one block is one DB transaction (use a second writer, "
                                      "or a DualWriterPool, for concurrent work)")
        self._in_block = True
        try:
            yield from self._transaction()
        finally:
            self._in_block = False

    def _transaction(self) -> Iterator[DualWriteTransaction]:
        self.recover_unfinished(keep_lease=True)
        self._decide_again_if_due()
        table, producer = self._table, self._producer
        stored = table.begin_locked(self.transactional_id)
        if self._lease is not None and stored.lease_owner != self._owner:
            self._db.rollback()
            raise ProducerFencedError(f"{self.transactional_id!r}: this process's lease on the id was taken over by "
                                      "another process (it expired): this writer is fenced")
        if stored.owner != self._owner:
            self._db.rollback()
            raise ProducerFencedError(f"{self.transactional_id!r} belongs to another writer now (it recovered after "
                                      "this one): this writer is fenced")
        token = uuid.uuid4().hex
        savepoint_held = False
        try:
            table.mark_block()
            savepoint_held = True
            producer.begin_transaction()
            metrics.OPEN_TRANSACTIONS.opened(self._metric_prefix, metrics.DUAL_WRITE, self.transactional_id)
            yield DualWriteTransaction(self._db.cursor(), producer, self._db.given)
            self._check_block_intact()
            savepoint_held = False
            with metrics.on_behalf_of(metrics.DUAL_WRITE):
                prepared = producer.prepare_transaction()
            table.write(self.transactional_id, prepared=prepared, two_phase=producer.two_phase_commit_active,
                        token=token, completed=False, lease=self._lease)
        except Exception as exc:
            ended = (savepoint_held and not isinstance(exc, DualWriteUsageError) and not self._session_lost(exc)
                     and table.block_ended())
            self._roll_back_both()
            if ended:
                raise self._block_ended_error(exc, session_gone=self._session_lost(exc)) from exc
            raise
        except BaseException:
            self._roll_back_both()
            raise
        self._needs_recovery = True  # from here only the database's answer (or a recovery) decides
        self._commit_database(prepared, token)
        try:
            with metrics.on_behalf_of(metrics.DUAL_WRITE):
                producer.complete_transaction(prepared)
            metrics.OPEN_TRANSACTIONS.closed(self._metric_prefix, metrics.DUAL_WRITE, self.transactional_id)
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
                self._mark_completed()
            except Exception as exc:
                log.warning("%r: could not record in the database that %s completed (%r); the next transaction() "
                            "recovers first", self.transactional_id, prepared, exc)
                with contextlib.suppress(Exception):
                    self._db.rollback()
                return
        self._needs_recovery = False

    def _decide_again_if_due(self) -> None:
        """Between transactions, once the producer's two-phase decision no longer stands (older than
        ``DECISION_STANDS_S``): a recovery, which finds the last transaction completed and initialises a new producer,
        so the writer follows a cluster that gained two-phase commit, or turned it off. Should it fail, the writer
        needs a recovery, as after any other failure."""
        if not self._two_phase_commit or decision_stands(self._decided_at, _now()):
            return
        log.info("%r: two-phase commit was decided (%s) more than %g s ago: initialising again to follow the "
                 "cluster", self.transactional_id,
                 "in use" if self._producer.two_phase_commit_active else "fallen back", DECISION_STANDS_S)
        self._needs_recovery = True
        self.recover_unfinished(keep_lease=True)

    def _check_block_intact(self) -> None:
        """Raise if the application ended the DB transaction inside the block (its commit() or rollback() ends the
        savepoint taken after the lock, and drops the lock with it)."""
        try:
            self._table.release_block()
        except Exception as exc:
            if self._table.is_failed_transaction(exc) or self._session_lost(exc):
                raise  # a statement in the block failed and the application went on, or the session is gone
            raise self._block_ended_error(exc) from exc

    def _session_lost(self, exc: BaseException) -> bool:
        """Whether the database session ended under the block (a lost server, PostgreSQL ending a session idle in
        its transaction for a lease): the database's own error says so, not a usage error."""
        return self._table.session_ended(exc) or bool(getattr(self._db.given, "closed", False))

    def ended_by_lease_limit(self, exc: BaseException) -> bool:
        """Whether ``exc`` is PostgreSQL ending this writer's transaction for the idle limit its lease sets (so
        nothing of the block was committed), as opposed to any other limit."""
        return self._lease is not None and self._table.ended_by_own_limit(exc)

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

    def _mark_completed(self) -> None:
        """Record in the row, in a DB transaction of its own, that its transaction completed (this writer's only)."""
        stored = self._table.begin_locked(self.transactional_id)
        if stored.owner == self._owner and (self._lease is None or stored.lease_owner == self._owner):
            self._table.write(self.transactional_id, completed=True)
        self._db.commit()

    def _commit_database(self, prepared: PreparedTxnState, token: str) -> None:
        session = self._db.session()
        try:
            with metrics.RECORD_DECISION_SECONDS.labels(path=metrics.DUAL_WRITE).time():
                self._db.commit()
        except Exception as exc:
            outcome = judge_failed_commit(self._table.read_back(self.transactional_id, token, session),
                                          definite_error=self._table.is_definite_failure(exc))
            if outcome is CommitOutcome.COMMITTED:
                log.warning("%r: the database reported %r at commit, yet the commit landed", self.transactional_id,
                            exc)
                return
            if outcome is CommitOutcome.FAILED:
                self._roll_back_both()  # a Kafka abort that fails leaves the writer needing a recovery
                raise
            raise DualWriteOutcomeUnknownError(f"{self.transactional_id!r}: the database commit's outcome is unknown "
                                               f"({exc}); Kafka transaction {prepared} stays prepared until a "
                                               "recovery (the writer's next transaction(), or recover()) settles it "
                                               "by what the database holds") from exc

    def _roll_back_both(self) -> None:
        """Roll the database back and abort Kafka's transaction; when the abort fails, the next transaction() (or
        the pool's close) recovers first, which aborts it."""
        with contextlib.suppress(Exception):
            self._db.rollback()
        try:
            with metrics.on_behalf_of(metrics.DUAL_WRITE):
                self._producer.abort_transaction()
            metrics.OPEN_TRANSACTIONS.closed(self._metric_prefix, metrics.DUAL_WRITE, self.transactional_id)
        except TransactionStateError:
            return  # no transaction was begun: nothing to abort
        except Kafka2pcError as exc:
            self._needs_recovery = True
            log.warning("%r: could not abort the Kafka transaction (%s); the writer's next transaction() or "
                        "recover() aborts it", self.transactional_id, exc)
            return
        self._needs_recovery = False

    def close(self) -> None:
        """Mark the last transaction complete in the row when it is (so an id the broker expires after a long idle
        time recovers cleanly), and release the producer and the Kafka connections (not the DB connection, which
        the caller owns). An unfinished transaction is left to the next recovery."""
        with contextlib.suppress(Exception):
            if not self._needs_recovery and not self._db.in_transaction():
                self._mark_completed()
        self._producer.close()
        # a transaction left unfinished is no longer this writer's to know: whoever settles it counts it
        metrics.OPEN_TRANSACTIONS.closed(self._metric_prefix, metrics.DUAL_WRITE, self.transactional_id)
        if self._client is not None:
            self._client.close()
        self._db.close()

    def __enter__(self) -> DualWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
