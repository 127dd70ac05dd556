"""What one Spark task attempt does on an executor: write its partition's rows in one transaction on its own
transactional id, prepare it, and hand the prepared state to the driver in its commit message."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from kafka2pc.cluster import ClusterClient
from kafka2pc.config import PRODUCER_KEYS, ClientConfig, max_block_ms
from kafka2pc.config.keys import redacted_repr
from kafka2pc.errors import IdInUseError
from kafka2pc.producer import TwoPhaseProducer
from kafka2pc.sink.naming import TransactionalIdGrammar, TransactionNamingStrategy
from kafka2pc.spark.columns import Columns, RecordBatch, records
from kafka2pc.spark.window import check_window
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: a Python worker runs many tasks: they share connections to the cluster
_CLIENTS: dict[tuple[tuple[str, str], ...], ClusterClient] = {}
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


def shared_client(config: Mapping[str, Any]) -> ClusterClient:
    """The worker's client for a cluster (created on first use)."""
    key = tuple(sorted((str(k), str(v)) for k, v in config.items()))
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = ClusterClient(ClientConfig.from_dict(dict(config), consumed_elsewhere=PRODUCER_KEYS),
                                               bootstrap_timeout_s=max_block_ms(config) / 1000)
    return client


def _wait_until_free(control: TransactionControl, transactional_id: str) -> None:
    """Refuse to start on an id with an open transaction (it belongs to another live attempt, or to one the next
    planning cleans up); wait, bounded, for an ending one to write its markers."""
    observed = control.wait_until_settled(transactional_id, within_s=_SETTLE_S)
    if observed is not None and observed.state in OPEN_STATES:
        raise IdInUseError(f"transactional id {transactional_id!r} has an open transaction ({observed}); this "
                           "attempt leaves it alone and stops, to be retried on another id")


def write_partition(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> TaskMessage:
    """Write the rows of this task's partition in one transaction and prepare it; abort it on any failure."""
    from pyspark import TaskContext  # noqa: PLC0415 - executors only

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("write_partition runs in a Spark task")
    partition, attempt = context.partitionId(), context.attemptNumber()
    checkpoint = plan.checkpoint
    if checkpoint is None:
        checkpoint = int(context.getLocalProperty("streaming.sql.batchId") or 0)
    transactional_id = TransactionalIdGrammar(plan.prefix).format(partition,
                                                                  plan.naming.attempt_counter(checkpoint, attempt))
    who = f"attempt {attempt} of partition {partition} in checkpoint {checkpoint}"
    producer: TwoPhaseProducer | None = None
    written = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            first = producer is None
            if producer is None:
                producer = _open(plan, transactional_id, who)
            for item in records(batch, plan.columns, plan.topic):
                if isinstance(item, RecordBatch):
                    producer.produce_batch(item.topic, item.values, item.keys)
                else:
                    producer.produce(item.topic, item.value, item.key, item.partition, item.headers)
            written += batch.num_rows
            if first:  # acknowledged, the transaction is known to its coordinator: a later move's cleanup lists it
                producer.flush()
                _check_window(plan, who)
        state = producer.prepare_transaction() if producer is not None else None
        if producer is not None:
            _check_window(plan, who)
    except BaseException:
        if producer is not None:
            _abort_quietly(producer)
        raise
    if producer is not None:
        producer.close()  # the prepared transaction stays open on the broker for the driver's decision
    return TaskMessage(partition, attempt, context.taskAttemptId(), checkpoint, transactional_id,
                       str(state) if state is not None else "", state.transaction_version if state else None,
                       written, producer.two_phase_commit_active if producer is not None else plan.two_phase_commit)


def _open(plan: TaskPlan, transactional_id: str, who: str) -> TwoPhaseProducer:
    client = shared_client(plan.producer_config)
    control = TransactionControl(client)
    _wait_until_free(control, transactional_id)
    check_window(control, plan.prefix, plan.window, who)  # before InitProducerId, which fences the id's holder
    producer = TwoPhaseProducer({**plan.producer_config, "transactional.id": transactional_id},
                                two_phase_commit=plan.two_phase_commit, cluster=client)
    try:
        producer.init_transactions()
        producer.begin_transaction()
    except BaseException:
        producer.close()
        raise
    return producer


def _check_window(plan: TaskPlan, who: str) -> None:
    check_window(TransactionControl(shared_client(plan.producer_config)), plan.prefix, plan.window, who)


def _abort_quietly(producer: TwoPhaseProducer) -> None:
    try:
        producer.abort_transaction()
    except Exception as exc:  # the driver's cleanup (LISTING) aborts what this could not
        log.warning("could not abort the transaction of %r: %s", producer.transactional_id, exc)
    finally:
        producer.close()
