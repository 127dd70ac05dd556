"""What one task attempt does (kafka2pc.spark.task), against the coordinator model: write its partition in one
transaction on its own id, prepare it, and stop — aborting what it opened — when the id is busy or the batch is over.
Spark itself is replaced by a TaskContext that says which partition and attempt this is."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from kafka2pc._core.messages import InitProducerId  # noqa: E402
from kafka2pc.errors import BatchOverError, IdInUseError, ProducerFencedError  # noqa: E402
from kafka2pc.prepared_state import PreparedTxnState  # noqa: E402
from kafka2pc.sink import producer_cache  # noqa: E402
from kafka2pc.sink.naming import TransactionNamingStrategy  # noqa: E402
from kafka2pc.sink.producer_cache import ProducerCache  # noqa: E402
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

    def getLocalProperty(self, _key):
        return None  # a batch write outside a streaming query


@pytest.fixture
def cluster(monkeypatch):
    transport = ModelTransport(CoordinatorModel(transaction_version=2, two_phase_enabled=True), Faults(),
                               topics={"out": 2})
    cache = ProducerCache()
    monkeypatch.setattr(cache, "client", lambda config: transport)
    monkeypatch.setattr(task, "_CACHE", cache)
    return transport


def attempt(monkeypatch, partition=0, attempt=0):
    import pyspark  # noqa: PLC0415

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: Context(partition, attempt)))


def plan(window: str = "", checkpoint: int = 7) -> task.TaskPlan:
    return task.TaskPlan({"bootstrap.servers": "m:1"}, "job", TransactionNamingStrategy.POOLING, True, "out",
                         Columns(), checkpoint, window)


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
    (before it writes more rows), so a cleanup that listed the prefix before the move cannot miss its transaction."""
    attempt(monkeypatch)
    control = TransactionControl(cluster)
    planned = move_window(control, "job")
    send_produce = cluster.send_produce

    def moving_send(calls):
        move_window(control, "job")
        return send_produce(calls)

    monkeypatch.setattr(cluster, "send_produce", moving_send)

    def rows():
        yield batch(b"first")
        yield batch(b"second")
        yield batch(b"third")

    with pytest.raises(BatchOverError):
        task.write_partition(plan(planned), rows())
    assert cluster.model.open_transactions() == []
    assert [txn.records for txn in cluster.model.txns] == [[b"first"]]  # nothing after the first write was sent


def test_a_partition_of_one_batch_is_checked_once_after_its_prepare(monkeypatch, cluster):
    attempt(monkeypatch)
    control = TransactionControl(cluster)
    planned = move_window(control, "job")
    looks = []
    check = task.check_window
    monkeypatch.setattr(task, "check_window", lambda *args: looks.append(args[-1]) or check(*args))
    task.write_partition(plan(planned), iter([batch(b"only")]))
    assert len(looks) == 1  # plus the one look before it began, taken with the id's in one round


def test_a_tasks_cluster_client_waits_for_the_brokers_as_long_as_kafka_max_block_ms_says(monkeypatch):
    made = []
    monkeypatch.setattr(producer_cache, "ClusterClient", lambda config, **kwargs: made.append(kwargs) or object())
    monkeypatch.setattr(task, "_CACHE", ProducerCache())
    task.shared_client({"bootstrap.servers": "h:1", "max.block.ms": 2500, "linger.ms": 5})
    task.shared_client({"bootstrap.servers": "h:2"})
    assert [kwargs["bootstrap_timeout_s"] for kwargs in made] == [2.5, 60.0]


# -- the worker's producer cache ---------------------------------------------------------------------------------------

def _inits(transport) -> list:
    """Record every InitProducerId the transport is asked to send."""
    sent: list = []
    execute, execute_all = transport.execute, transport.execute_all

    def one(txn_id, command):
        if isinstance(command, InitProducerId):
            sent.append(txn_id)
        return execute(txn_id, command)

    def many(commands):
        sent.extend(txn_id for txn_id, command in commands if isinstance(command, InitProducerId))
        return execute_all(commands)

    transport.execute, transport.execute_all = one, many
    return sent


def _commit(cluster, message):
    TransactionControl(cluster).commit(message.transactional_id, PreparedTxnState.parse(message.state))


def test_a_cached_producer_goes_on_without_an_init_producer_id_after_the_driver_committed(monkeypatch, cluster):
    attempt(monkeypatch)
    first = task.write_partition(plan(checkpoint=7), iter([batch(b"a")]))
    _commit(cluster, first)  # the driver's EndTxn: v2 bumps the epoch
    inits = _inits(cluster)
    second = task.write_partition(plan(checkpoint=9), iter([batch(b"b")]))  # POOLING: the same id two batches on
    assert second.transactional_id == first.transactional_id == "job-0-4"
    assert inits == []
    (pid, epoch), (pid2, epoch2) = (map(int, m.state.split(":")) for m in (first, second))
    assert pid2 == pid and epoch2 == epoch + 1
    _commit(cluster, second)
    assert cluster.model.committed_records() == [b"a", b"b"]


def test_a_cached_producer_whose_id_another_worker_took_over_is_dropped(monkeypatch, cluster):
    attempt(monkeypatch)
    mine = task._CACHE
    _commit(cluster, task.write_partition(plan(checkpoint=7), iter([batch(b"a")])))
    other = ProducerCache()
    monkeypatch.setattr(other, "client", lambda config: cluster)
    monkeypatch.setattr(task, "_CACHE", other)  # checkpoint 9 of this partition runs in another Python worker
    _commit(cluster, task.write_partition(plan(checkpoint=9), iter([batch(b"b")])))
    monkeypatch.setattr(task, "_CACHE", mine)
    inits = _inits(cluster)
    _commit(cluster, task.write_partition(plan(checkpoint=11), iter([batch(b"c")])))
    assert inits == ["job-0-4"]  # its cached producer may not go on: a new one took the id over
    assert cluster.model.committed_records() == [b"a", b"b", b"c"]


def test_a_continued_producer_is_fenced_by_an_attempt_that_takes_its_id_over(monkeypatch, cluster):
    """A zombie: the cached producer went on (its look showed its own transaction's end) and, before it writes,
    another attempt on the same id starts in another worker: the newcomer's InitProducerId fences it, and nothing the
    zombie writes commits."""
    attempt(monkeypatch)
    mine = task._CACHE
    _commit(cluster, task.write_partition(plan(checkpoint=7), iter([batch(b"a")])))
    other = ProducerCache()
    monkeypatch.setattr(other, "client", lambda config: cluster)
    outcome = {}
    take = mine.take

    def take_then_newcomer(*args, **kwargs):
        producer = take(*args, **kwargs)
        assert producer is not None  # it goes on
        monkeypatch.setattr(task, "_CACHE", other)
        outcome["newcomer"] = task.write_partition(plan(checkpoint=9), iter([batch(b"newcomer")]))
        monkeypatch.setattr(task, "_CACHE", mine)
        return producer

    monkeypatch.setattr(mine, "take", take_then_newcomer)
    with pytest.raises(ProducerFencedError):
        task.write_partition(plan(checkpoint=9), iter([batch(b"zombie-1"), batch(b"zombie-2")]))
    _commit(cluster, outcome["newcomer"])
    assert cluster.model.committed_records() == [b"a", b"newcomer"]
    assert cluster.model.open_transactions() == []


def test_a_replayed_batch_goes_on_after_its_first_try_was_aborted_and_commits_once(monkeypatch, cluster):
    attempt(monkeypatch)
    task.write_partition(plan(checkpoint=7), iter([batch(b"a")]))  # the driver died before deciding
    (aborted,) = TransactionControl(cluster).abort_all_ongoing([("job-0-4", None)])  # the next planning's cleanup
    assert aborted is not None
    inits = _inits(cluster)
    replay = task.write_partition(plan(checkpoint=7), iter([batch(b"a")]))
    assert inits == []  # the abort's end bumped the epoch: the cached producer goes on from there
    _commit(cluster, replay)
    assert cluster.model.committed_records() == [b"a"]


def test_a_speculative_attempt_and_its_original_each_go_on_with_their_own_cached_producer(monkeypatch, cluster):
    """Attempts 0 and 1 of one partition run at once in two workers, each of which cached the producer of its own
    id two batches before: both go on without an InitProducerId, on different ids; the driver commits the winner
    and its cleanup aborts the loser; the next time, both producers go on again (after a commit and an abort)."""
    workers = {}
    for number in (0, 1):
        workers[number] = ProducerCache()
        monkeypatch.setattr(workers[number], "client", lambda config: cluster)

    def run(number, checkpoint, value):
        attempt(monkeypatch, attempt=number)
        monkeypatch.setattr(task, "_CACHE", workers[number])
        return task.write_partition(plan(checkpoint=checkpoint), iter([batch(value)]))

    control = TransactionControl(cluster)
    inits = _inits(cluster)
    for checkpoint in (7, 9, 11):
        original, speculative = run(0, checkpoint, b"o%d" % checkpoint), run(1, checkpoint, b"s%d" % checkpoint)
        assert (original.transactional_id, speculative.transactional_id) == ("job-0-4", "job-0-5")
        assert original.continued == speculative.continued == (checkpoint > 7)
        _commit(cluster, original)  # the winner
        control.abort_all_ongoing([(speculative.transactional_id, None)])  # the commit's cleanup
    assert sorted(inits) == ["job-0-4", "job-0-5"]  # one InitProducerId per id, at the first checkpoint only
    assert cluster.model.committed_records() == [b"o7", b"o9", b"o11"]
    assert cluster.model.open_transactions() == []


def test_a_late_attempt_with_a_cached_producer_stops_before_writing(monkeypatch, cluster):
    """A cached producer that may go on fences nobody: the window look before it is what stops a late attempt."""
    attempt(monkeypatch)
    control = TransactionControl(cluster)
    _commit(cluster, task.write_partition(plan(move_window(control, "job"), checkpoint=7), iter([batch(b"a")])))
    planned = move_window(control, "job")
    move_window(control, "job")  # the batch this attempt was planned for is over before it starts
    with pytest.raises(BatchOverError):
        task.write_partition(plan(planned, checkpoint=9), iter([batch(b"late")]))
    assert cluster.model.committed_records() == [b"a"] and cluster.model.open_transactions() == []
    assert [txn.records for txn in cluster.model.txns] == [[b"a"]]  # nothing of it was sent
