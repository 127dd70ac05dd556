"""The driver's side of the sink: clean up before a batch's tasks run, decide and complete when they are done.

Everything runs in Spark's driver-side Python workers, which keep nothing between calls: all that must be remembered
is in the checkpoint (:mod:`kafka2pc.spark.state`) or on the brokers. The 2PC logic itself is the sink core's
(:class:`~kafka2pc.sink.Committer`, :func:`~kafka2pc.sink.recover`): this module only maps Spark's calls onto it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import attrs

from kafka2pc import metrics
from kafka2pc.errors import StorageUnavailableError, WriteConflictError, WriteDecidedError, WriteOutcomeUnknownError
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.sink.committer import Committer, Settlement
from kafka2pc.sink.decision_log import Decision, FileDecisionLog
from kafka2pc.sink.naming import TransactionalIdGrammar
from kafka2pc.sink.prepared import PreparedTransaction
from kafka2pc.sink.recovery import abort_open_transactions, recover
from kafka2pc.sink.write_keys import (
    METADATA_KEY,
    ORIGINS_KEY,
    Verdict,
    check_origin,
    decided_origins,
    decided_versions,
    verdict,
    with_decided,
    with_origin,
)
from kafka2pc.spark.columns import Columns
from kafka2pc.spark.options import SinkOptions
from kafka2pc.spark.state import SinkState, SinkStore
from kafka2pc.spark.task import TaskMessage, TaskPlan, shared_control
from kafka2pc.spark.window import move_window
from kafka2pc.transaction_control import TransactionControl

log = logging.getLogger(__name__)


@attrs.frozen
class Timings:
    """Where the driver's time of one batch went (seconds): checking that the offered transactions are still open,
    recording the decision (the commit point), completing them (EndTxn each, then marking the decision done), and
    the cleanup that follows."""

    check: float
    record: float
    complete: float
    cleanup: float


class SinkDriver:
    """The driver-side operations for one query (or one batch write) and its checkpoint."""

    def __init__(self, options: SinkOptions):
        self.options = options
        self.store = SinkStore(options.checkpoint_location)
        self._state: SinkState | None = None

    @property
    def control(self) -> TransactionControl:
        """Coordinator operations over the driver worker's client (both shared across calls in one worker
        process)."""
        return shared_control(self.options.producer_config)

    @property
    def state(self) -> SinkState:
        """The checkpoint's sink state (pinned on the first run)."""
        if self._state is None:
            self._state = self.store.open(self.options.prefix, lambda: self.control)
        return self._state

    @property
    def decision_log(self) -> FileDecisionLog:
        """The query's decision log."""
        return self.store.decision_log(self.state.prefix)

    def plan(self, columns: Columns, *, streaming: bool) -> TaskPlan:
        """Before the tasks of a batch run: complete what a crashed run decided, abort everything else open under
        the prefix (no task of this batch has started; earlier ones are done or lost), and say what tasks need."""
        started = time.monotonic()
        log_ = self.decision_log
        opened = time.monotonic()
        window = move_window(self.control, self.state.prefix)  # attempts of earlier batches and runs stop writing
        moved = time.monotonic()
        report = recover(self.control, self.state.prefix, log_, report_known=False)
        log.info("planned a batch in %.1f ms: checkpoint state %.1f ms, window move %.1f ms, recovery %.1f ms "
                 "(%d rolled forward, %d aborted)", 1000 * (time.monotonic() - started), 1000 * (opened - started),
                 1000 * (moved - opened), 1000 * report.seconds, len(report.rolled_forward), len(report.aborted))
        checkpoint = None if streaming else (log_.last_checkpoint() or 0) + 1
        key = self.options.write_key
        skip = key is not None and self.write_key_verdict() is Verdict.ALREADY_DECIDED
        if skip and key is not None:
            log.info("txnAppId %r txnVersion %d is decided already at %s: this write writes nothing", key.app_id,
                     key.version, self.options.checkpoint_location)
        return TaskPlan(self.options.producer_config, self.state.prefix, self.options.naming,
                        self.options.two_phase_commit, self.options.topic, columns, checkpoint, window, skip,
                        self.options.producer_cache_timeout_s)

    def write_key_verdict(self) -> Verdict:
        """Whether a keyed batch write writes (or is a replay of a decided one); a stale version raises
        :class:`~kafka2pc.errors.StaleWriteVersionError`. Unkeyed writes always write."""
        key = self.options.write_key
        if key is None:
            return Verdict.WRITE
        return verdict(self._decided_versions(), key, where=self.options.checkpoint_location)

    def _decided_versions(self) -> dict[str, int]:
        return decided_versions(self.decision_log.newest())

    def commit(self, messages: Sequence[TaskMessage | None], checkpoint: int) -> tuple[Settlement, Timings]:
        """Decide ``checkpoint`` with the authorized attempts' transactions (the record is the commit point), commit
        them, then abort every other transaction open under the prefix (attempts that lost, zombies)."""
        offered = _prepared(messages, checkpoint)
        self._announce_fallback(messages)
        newest, key, origin = self.decision_log.newest(), self.options.write_key, write_origin(messages)
        metadata = {"attempts": [[m.partition, m.attempt, m.task_attempt_id] for m in messages if m is not None],
                    "records": sum(m.records for m in messages if m is not None),
                    "two_phase_active": all(m.two_phase_active for m in messages if m is not None),
                    METADATA_KEY: with_decided(decided_versions(newest), key),
                    ORIGINS_KEY: with_origin(decided_origins(newest), key, origin)}
        settlement = Committer(self.control, self.decision_log).settle(checkpoint, offered, metadata)
        settled = time.monotonic()
        self._move_window()  # an attempt whose transaction is not open yet never opens it
        # another decision of this log may still be completing (a replay or a lost race here; another write on the
        # location deciding a later checkpoint): never abort its ids
        abort_open_transactions(self.control, TransactionalIdGrammar(self.state.prefix), self._undone_ids())
        if not settlement.decided_now:
            log.info("checkpoint %d was already decided (a replay): %d transaction(s) of this run aborted",
                     checkpoint, len(settlement.aborted))
        timings = Timings(settlement.check_seconds, settlement.record_seconds, settlement.complete_seconds,
                          time.monotonic() - settled)
        return settlement, timings

    def commit_write(self, messages: Sequence[TaskMessage | None]) -> Settlement | None:
        """Decide and complete a batch write: all of it, or (on an error before the decision) nothing. The errors
        after the decision say so (:class:`WriteDecidedError`); a checkpoint another write decided meanwhile is a
        :class:`WriteConflictError`, never a silent no-op; a failure whose decision cannot be read back is a
        :class:`WriteOutcomeUnknownError`."""
        checkpoint = batch_checkpoint(messages)
        if checkpoint is None:
            return None  # no task reported: nothing was written
        where = f"checkpoint {checkpoint} of {self.options.checkpoint_location}"
        self._check_origin(messages)  # Spark's abort() then aborts what this write prepared
        try:
            settlement, timings = self.commit(messages, checkpoint)
        except Exception as exc:
            try:
                decided = self.decision_log.decision(checkpoint)
            except Exception as unreadable:  # an outage, expired credentials ...: whether it was decided is unknown
                raise WriteOutcomeUnknownError(
                    f"the write failed at its commit point ({type(exc).__name__}: {exc}), and whether {where} was "
                    f"decided cannot be read now ({unreadable}). Do NOT run it again yet: once the store answers, "
                    f"the next write with this checkpointLocation, or `kafka2pc recover --bootstrap ... "
                    f"--checkpoint-location {self.options.checkpoint_location}`, completes it if it was decided "
                    f"(then its rows are in Kafka) and aborts it if not; `kafka2pc audit` shows which.") from exc
            if decided is None and isinstance(exc, StorageUnavailableError):
                # a create whose answer was lost may still land: in doubt, not "nothing was concluded"
                raise WriteOutcomeUnknownError(
                    f"the write failed at its commit point ({exc}); no decision of {where} can be read, but one may "
                    "still land. Do NOT run it again yet: the next write with this checkpointLocation, or `kafka2pc "
                    f"recover --bootstrap ... --checkpoint-location {self.options.checkpoint_location}`, settles it "
                    "(`kafka2pc audit` shows whether its rows are in Kafka).") from exc
            if decided is None:
                raise
            if not _is_this_write(decided, _prepared(messages, checkpoint)):
                raise self._conflict(checkpoint) from exc
            raise WriteDecidedError(
                f"the write is decided ({where}) but could not be completed ({type(exc).__name__}: {exc}): the next "
                f"write with this checkpointLocation, or `kafka2pc recover --bootstrap ... --checkpoint-location "
                f"{self.options.checkpoint_location}`, completes it. Do NOT run the same write again: it would be "
                "written twice.") from exc
        if not settlement.decided_now:
            raise self._conflict(checkpoint)
        log.info("write of %s: committed %d transaction(s); check %.1f ms, record %.1f ms, complete %.1f ms, "
                 "cleanup %.1f ms", where, len(settlement.committed), 1000 * timings.check, 1000 * timings.record,
                 1000 * timings.complete, 1000 * timings.cleanup)
        return settlement

    def confirm_replay(self, messages: Sequence[TaskMessage | None]) -> None:
        """A keyed write planned as a replay of a decided one wrote nothing: check it came from the query that
        decided it (:func:`~kafka2pc.sink.write_keys.check_origin`)."""
        self._check_origin(messages)

    def _check_origin(self, messages: Sequence[TaskMessage | None]) -> None:
        key = self.options.write_key
        if key is not None:
            check_origin(decided_origins(self.decision_log.newest()), key, write_origin(messages),
                         where=self.options.checkpoint_location)

    def _conflict(self, checkpoint: int) -> WriteConflictError:
        return WriteConflictError(
            f"checkpoint {checkpoint} of {self.options.checkpoint_location} was decided by another write that ran at "
            "the same time: this write's transactions were aborted and none of its rows were written. Run it again, "
            "one write at a time per checkpointLocation.")

    def abort(self, messages: Sequence[TaskMessage | None], checkpoint: int | None) -> None:
        """Spark gave up on the batch (it failed, or the query is stopping): abort its transactions, and every other
        one open under the prefix (attempts cancelled mid-write report nothing) — unless the batch is decided, in
        which case only the offered transactions outside the decision are aborted (a write that lost a race to
        another), and the next run, or ``kafka2pc recover``, completes the decision. When the decision log cannot be
        read, nothing is aborted: the next planning settles it."""
        offered = _prepared(messages, checkpoint)
        try:
            decided = self.decision_log.decision(checkpoint) if checkpoint is not None else None
            keep = self._undone_ids()
        except Exception as exc:  # an outage (StorageUnavailableError), expired credentials ...
            log.warning("not aborting checkpoint %s: whether it is decided cannot be read (%s: %s); the next "
                        "planning, or `kafka2pc recover`, settles it", checkpoint, type(exc).__name__, exc)
            return
        self._move_window()
        if decided is not None:
            offered = [t for t in offered if t not in decided.transactions]
            log.warning("checkpoint %d is decided: not aborting it (the next run completes it)%s", checkpoint,
                        f"; aborting the {len(offered)} transaction(s) of this write outside it" if offered else "")
        self._abort_offered(offered)
        abort_open_transactions(self.control, TransactionalIdGrammar(self.state.prefix), keep)

    def _undone_ids(self) -> set[str]:
        return {t.transactional_id for d in self.decision_log.undone() for t in d.transactions}

    def _abort_offered(self, offered: Sequence[PreparedTransaction]) -> None:
        results = self.control.abort_all([(t.transactional_id, t.state) for t in offered])
        for txn, result in zip(offered, results, strict=True):
            if isinstance(result, Exception):
                log.warning("could not abort %s of %r: %s (the next planning aborts it)", txn.state,
                            txn.transactional_id, result)

    def _move_window(self) -> None:
        """Move the write window before a cleanup; a failure leaves late attempts to the next planning, and never
        stops the cleanup or the batch (the decision, if any, stands)."""
        try:
            move_window(self.control, self.state.prefix)
        except Exception as exc:
            log.warning("could not move the write window of %r (%s: %s): an attempt that starts writing after this "
                        "cleanup may leave a transaction open until the next planning or `kafka2pc recover`",
                        self.state.prefix, type(exc).__name__, exc)

    def _announce_fallback(self, messages: Sequence[TaskMessage | None]) -> None:
        if all(m.two_phase_active for m in messages if m is not None) or not self.options.two_phase_commit:
            return
        metrics.TWO_PHASE_FALLBACKS.labels(reason="sink_batch").inc()
        state = self.state
        if not state.fallback_announced:
            log.warning("kafka2pc sink %r: two-phase commit is NOT active on this cluster: prepared transactions "
                        "are bounded by the broker's transaction.max.timeout.ms; a batch whose commit comes later "
                        "is lost (reported, never silent). Run `kafka2pc doctor` for the broker settings.",
                        state.prefix)
            self._state = attrs.evolve(state, fallback_announced=True)
            self.store.save(self._state)


def _prepared(messages: Sequence[TaskMessage | None], checkpoint: int | None) -> list[PreparedTransaction]:
    prepared = []
    for message in messages:
        if message is None or not message.state:
            continue  # an unfinished task, or an empty partition: nothing handed over
        if checkpoint is not None and message.checkpoint != checkpoint:
            raise ValueError(f"a message of checkpoint {message.checkpoint} offered for checkpoint {checkpoint}")
        state = PreparedTxnState.parse(message.state, transaction_version=message.transaction_version)
        prepared.append(PreparedTransaction(message.transactional_id, state, message.partition,
                                            message.checkpoint))
    return prepared


def write_origin(messages: Sequence[TaskMessage | None]) -> str | None:
    """The streaming query the tasks of a write ran in (None outside one, or when no task reported)."""
    origins = {m.query_id for m in messages if m is not None}
    if len(origins) > 1:
        raise ValueError(f"tasks of one write report several streaming queries: {sorted(map(str, origins))}")
    return origins.pop() if origins else None


def _is_this_write(decision: Decision, offered: Sequence[PreparedTransaction]) -> bool:
    return set(decision.transactions) == set(offered)


def batch_checkpoint(messages: Sequence[Any]) -> int | None:
    """The checkpoint a batch write's messages name (all the same), None when no task reported."""
    numbers = {m.checkpoint for m in messages if m is not None}
    if len(numbers) > 1:
        raise ValueError(f"messages of several checkpoints in one batch write: {sorted(numbers)}")
    return numbers.pop() if numbers else None
