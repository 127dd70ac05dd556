"""What one Spark task attempt does on an executor: write its partition's rows in one transaction on its own
transactional id, prepare it, and hand the prepared state to the driver in its commit message."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import attrs

from kafka2pc import metrics
from kafka2pc.cluster import ClusterClient
from kafka2pc.config.keys import redacted_repr
from kafka2pc.errors import IdInUseError
from kafka2pc.producer import State, TwoPhaseProducer
from kafka2pc.sink.naming import TransactionalIdGrammar, TransactionNamingStrategy
from kafka2pc.sink.producer_cache import DEFAULT_IDLE_TIMEOUT_S, ProducerCache
from kafka2pc.spark.columns import Columns, RecordBatch, records
from kafka2pc.spark.window import check_observed_window, check_window, window_id
from kafka2pc.transaction_control import IN_FLUX, OPEN_STATES, ObservedTransaction, TransactionControl

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: a Python worker runs many tasks one after another: they share its clients, and the producers they hand over
_CACHE = ProducerCache()
#: how long a task waits for the id's previous transaction to finish writing its markers
_SETTLE_S = 10.0


@attrs.frozen
class TaskPlan:
    """What every task of one write needs, shipped to executors inside the pickled writer."""

    producer_config: Mapping[str, Any] = attrs.field(repr=redacted_repr)
    prefix: str
    naming: TransactionNamingStrategy
    two_phase_commit: bool
    topic: str | None
    columns: Columns
    #: batch writes: the checkpoint number the driver assigned; streaming: None (the batch id is the checkpoint)
    checkpoint: int | None
    #: the write window the driver opened for this batch (:mod:`kafka2pc.spark.window`); "" checks none
    window: str = ""
    #: a keyed batch write whose key is decided already (a replay): tasks write nothing
    skip: bool = False
    #: option producerCacheTimeout: how long a worker keeps an unused producer (0: none)
    producer_cache_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S


@attrs.frozen
class TaskMessage:
    """What a task attempt hands to the driver (inside a pyspark ``WriterCommitMessage``)."""

    partition: int
    attempt: int
    task_attempt_id: int
    checkpoint: int
    transactional_id: str
    #: ``"pid:epoch"``, or ``""`` when the partition had no rows (nothing is handed over)
    state: str
    transaction_version: int | None
    records: int
    two_phase_active: bool
    #: the attempt went on with its worker's cached producer, without an InitProducerId
    continued: bool = False
    #: the streaming query the write runs in (Spark's persistent query id; a batch write inside foreachBatch has
    #: its query's), None outside one: tells a keyed write's replay from another query reusing its txnAppId
    query_id: str | None = None


def shared_client(config: Mapping[str, Any]) -> ClusterClient:
    """The worker's client for a cluster (created on first use)."""
    return _CACHE.client(config)


def shared_control(config: Mapping[str, Any]) -> TransactionControl:
    """Coordinator operations over :func:`shared_client` (one per client, so what it reads of the cluster, such as
    its transaction protocol, is read once per worker, not once per call)."""
    return _CACHE.control(config)


@attrs.frozen
class TaskAttempt:
    """Which task attempt runs, as its Spark ``TaskContext`` says."""

    partition: int
    attempt: int
    task_attempt_id: int
    checkpoint: int
    query_id: str | None = None


#: the local property Spark's stream execution sets to the query's persistent id (tasks of a foreachBatch's writes
#: see it too)
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def task_attempt(checkpoint: int | None) -> TaskAttempt:
    """This Spark task's attempt, as its ``TaskContext`` says (a streaming write's checkpoint is its batch id)."""
    from pyspark import TaskContext  # noqa: PLC0415 - executors only

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("a kafka2pc writer runs in a Spark task")
    if checkpoint is None:
        checkpoint = int(context.getLocalProperty("streaming.sql.batchId") or 0)
    return TaskAttempt(context.partitionId(), context.attemptNumber(), context.taskAttemptId(), checkpoint,
                       context.getLocalProperty(QUERY_ID_PROPERTY) or None)


def skipped_partition(plan: TaskPlan) -> TaskMessage:
    """What a task of a keyed write that is a replay hands over: nothing written, and where it came from."""
    task = task_attempt(plan.checkpoint)
    return TaskMessage(task.partition, task.attempt, task.task_attempt_id, task.checkpoint, "", "", None, 0,
                       plan.two_phase_commit, query_id=task.query_id)


def write_partition(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> TaskMessage:
    """Write the rows of this task's partition in one transaction and prepare it; abort it on any failure."""
    return write_attempt(plan, batches, task_attempt(plan.checkpoint))


def write_attempt(plan: TaskPlan, batches: Iterator[pa.RecordBatch], task: TaskAttempt) -> TaskMessage:
    """:func:`write_partition` of a known attempt: its transaction prepared and handed over in the message."""
    transactional_id = TransactionalIdGrammar(plan.prefix).format(
        task.partition, plan.naming.attempt_counter(task.checkpoint, task.attempt))
    who = f"attempt {task.attempt} of partition {task.partition} in checkpoint {task.checkpoint}"
    _CACHE.idle_timeout_s = plan.producer_cache_timeout_s
    rows = (batch for batch in batches if batch.num_rows)
    pending = next(rows, None)
    if pending is None:  # an empty partition opens nothing and hands nothing over
        return TaskMessage(task.partition, task.attempt, task.task_attempt_id, task.checkpoint, transactional_id,
                           "", None, 0, plan.two_phase_commit, query_id=task.query_id)
    producer, continued = _open(plan, transactional_id, who)
    written, checked = 0, False
    try:
        while pending is not None:
            _produce(producer, plan, pending)
            written += pending.num_rows
            pending = next(rows, None)
            if pending is not None and not checked:
                # acknowledged, the transaction is known to its coordinator: a later move's cleanup lists it.
                # (A partition of one batch is checked once, after its prepare, which acknowledges the same.)
                producer.flush()
                _check_window(plan, who)
                checked = True
        with metrics.on_behalf_of(metrics.SINK):
            state = producer.prepare_transaction()
        _check_window(plan, who)
    except BaseException:
        _abort_quietly(producer)
        raise
    # the prepared transaction stays open for the driver's decision
    _CACHE.keep(plan.producer_config, producer, two_phase_commit=plan.two_phase_commit)
    return TaskMessage(task.partition, task.attempt, task.task_attempt_id, task.checkpoint, transactional_id,
                       str(state), state.transaction_version, written, producer.two_phase_commit_active, continued,
                       task.query_id)


def _produce(producer: TwoPhaseProducer, plan: TaskPlan, batch: pa.RecordBatch) -> None:
    for item in records(batch, plan.columns, plan.topic):
        if isinstance(item, RecordBatch):
            producer.produce_batch(item.topic, item.values, item.keys)
        else:
            producer.produce(item.topic, item.value, item.key, item.partition, item.headers)


def _open(plan: TaskPlan, transactional_id: str, who: str) -> tuple[TwoPhaseProducer, bool]:
    """A producer with a transaction begun on ``transactional_id``, after one look at the id and at the window, and
    whether it is the worker's cached one, gone on without an InitProducerId.

    Refuses an id with an open transaction (it belongs to another live attempt, or to one the next planning cleans
    up) and waits, bounded, for an ending one to write its markers; stops when the window moved (before any
    InitProducerId, which would fence the id's holder)."""
    client = _CACHE.client(plan.producer_config)
    control = _CACHE.control(plan.producer_config)
    ids = [transactional_id, window_id(plan.prefix)] if plan.window else [transactional_id]
    looks = control.describe_all(ids)
    for look in looks:
        if isinstance(look, Exception):
            raise look
    seen = cast("ObservedTransaction | None", looks[0])
    window = cast("ObservedTransaction | None", looks[-1]) if plan.window else None
    if seen is not None and seen.state in IN_FLUX:
        seen = control.wait_until_settled(transactional_id, within_s=_SETTLE_S)
        window = control.describe(window_id(plan.prefix)) if plan.window else None
    if seen is not None and seen.state in OPEN_STATES:
        raise IdInUseError(f"transactional id {transactional_id!r} has an open transaction ({seen}); this "
                           "attempt leaves it alone and stops, to be retried on another id")
    check_observed_window(window, plan.window, who)
    producer = _CACHE.take(plan.producer_config, transactional_id, seen, two_phase_commit=plan.two_phase_commit)
    continued = producer is not None
    if producer is None:
        producer = TwoPhaseProducer({**plan.producer_config, "transactional.id": transactional_id},
                                    two_phase_commit=plan.two_phase_commit, cluster=client)
    try:
        if producer.state is State.UNINITIALIZED:
            producer.init_transactions()
        producer.begin_transaction()
    except BaseException:
        producer.close()
        raise
    return producer, continued


def _check_window(plan: TaskPlan, who: str) -> None:
    check_window(shared_control(plan.producer_config), plan.prefix, plan.window, who)


def _abort_quietly(producer: TwoPhaseProducer) -> None:
    try:
        producer.abort_transaction()
    except Exception as exc:  # the driver's cleanup (LISTING) aborts what this could not
        log.warning("could not abort the transaction of %r: %s", producer.transactional_id, exc)
    finally:
        producer.close()
