"""What one task attempt does (kafka2pc.spark.task), against the coordinator model: write its partition in one
transaction on its own id, prepare it, and stop — aborting what it opened — when the id is busy or the batch is over.
Spark itself is replaced by a TaskContext that says which partition and attempt this is."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from kafka2pc.errors import BatchOverError, IdInUseError  # noqa: E402
from kafka2pc.sink.naming import TransactionNamingStrategy  # noqa: E402
from kafka2pc.spark import task  # noqa: E402
from kafka2pc.spark.columns import Columns  # noqa: E402
from kafka2pc.spark.window import move_window  # noqa: E402
from kafka2pc.transaction_control import TransactionControl  # noqa: E402
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport  # noqa: E402

logging.getLogger("kafka2pc").setLevel(logging.ERROR)


class Context:
    def __init__(self, partition: int, attempt: int):
        self._partition, self._attempt = partition, attempt

    def partitionId(self):
        return self._partition

    def attemptNumber(self):
        return self._attempt

    def taskAttemptId(self):
        return 100 + self._attempt


@pytest.fixture
def cluster(monkeypatch):
    transport = ModelTransport(CoordinatorModel(transaction_version=2, two_phase_enabled=True), Faults(),
                               topics={"out": 2})
    monkeypatch.setattr(task, "shared_client", lambda config: transport)
    return transport


def attempt(monkeypatch, partition=0, attempt=0):
    import pyspark  # noqa: PLC0415

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: Context(partition, attempt)))


def plan(window: str = "") -> task.TaskPlan:
    return task.TaskPlan({"bootstrap.servers": "m:1"}, "job", TransactionNamingStrategy.POOLING, True, "out",
                         Columns(), 7, window)


def batch(*values: bytes):
    return pa.RecordBatch.from_pydict({"value": list(values)})


def test_an_attempt_writes_its_rows_in_one_prepared_transaction(monkeypatch, cluster):
    attempt(monkeypatch, partition=1, attempt=2)
    message = task.write_partition(plan(), iter([batch(b"a", b"b"), batch(b"c")]))
    assert (message.partition, message.attempt, message.checkpoint, message.records) == (1, 2, 7, 3)
    assert message.transactional_id == "job-1-6" and message.state != "" and message.two_phase_active
    (open_txn,) = cluster.model.open_transactions()
    assert open_txn.transactional_id == "job-1-6" and open_txn.records == [b"a", b"b", b"c"]


def test_a_partition_without_rows_hands_over_nothing(monkeypatch, cluster):
    attempt(monkeypatch)
    message = task.write_partition(plan(), iter([batch()]))
    assert message.state == "" and message.records == 0 and cluster.model.open_transactions() == []


def test_an_id_with_another_attempts_open_transaction_is_left_alone(monkeypatch, cluster):
    attempt(monkeypatch)
    task.write_partition(plan(), iter([batch(b"first")]))
    with pytest.raises(IdInUseError, match="job-0-4"):
        task.write_partition(plan(), iter([batch(b"second")]))  # the same partition, attempt and checkpoint
    assert len(cluster.model.open_transactions()) == 1


def test_an_attempt_whose_batch_is_over_stops_and_aborts_what_it_opened(monkeypatch, cluster):
    attempt(monkeypatch)
    control = TransactionControl(cluster)
    planned = move_window(control, "job")

    def rows():
        yield batch(b"early")
        move_window(control, "job")  # the driver decided the batch (or planned the next) meanwhile
        yield batch(b"late")

    with pytest.raises(BatchOverError):
        task.write_partition(plan(planned), rows())
    assert cluster.model.open_transactions() == [] and cluster.model.committed_records() == []


def test_an_attempt_checks_the_window_once_its_first_write_is_acknowledged(monkeypatch, cluster):
    """The window moves while the first batch is being sent: the attempt stops as soon as that write is acknowledged
    (before it reads more rows), so a cleanup that listed the prefix before the move cannot miss its transaction."""
    attempt(monkeypatch)
    control = TransactionControl(cluster)
    planned = move_window(control, "job")
    send_produce = cluster.send_produce

    def moving_send(calls):
        move_window(control, "job")
        return send_produce(calls)

    monkeypatch.setattr(cluster, "send_produce", moving_send)
    read = []

    def rows():
        yield batch(b"first")
        read.append("second")
        yield batch(b"second")

    with pytest.raises(BatchOverError):
        task.write_partition(plan(planned), rows())
    assert read == [] and cluster.model.open_transactions() == []


def test_a_tasks_cluster_client_waits_for_the_brokers_as_long_as_kafka_max_block_ms_says(monkeypatch):
    made = []
    monkeypatch.setattr(task, "ClusterClient", lambda config, **kwargs: made.append(kwargs) or object())
    monkeypatch.setattr(task, "_CLIENTS", {})
    task.shared_client({"bootstrap.servers": "h:1", "max.block.ms": 2500, "linger.ms": 5})
    task.shared_client({"bootstrap.servers": "h:2"})
    assert [kwargs["bootstrap_timeout_s"] for kwargs in made] == [2.5, 60.0]
