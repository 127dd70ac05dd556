"""The metrics operators alert on (issue 32, part 4), read from prometheus_client's registry as a scrape would see
them, against the coordinator model: the phases' histograms, the oldest open transaction per prefix, fallbacks by
reason, and transactions settled by recovery by reason."""

from __future__ import annotations

import logging
import sqlite3

import attrs
import pytest
from prometheus_client import REGISTRY

from kafka2pc import TwoPhaseProducer, metrics
from kafka2pc._core import codes
from kafka2pc._core.messages import (
    ClusterFacts,
    ConfigValue,
    EndTxn,
    FactsAnswer,
    InitAnswer,
    InitProducerId,
    ReadBrokerConfig,
    ReadClusterFacts,
)
from kafka2pc.dualwrite import DualWriteIncompleteError, DualWriter, DualWriterPool
from kafka2pc.errors import StorageUnavailableError, TransactionNotSettledError
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, PreparedTransaction, recover
from kafka2pc.transaction_control import TransactionControl

from .coordinator import NOT_ENOUGH_REPLICAS, CoordinatorModel, Faults, ModelTransport
from .scripted import Scripted
from .scripted import prepare as scripted_prepare

logging.getLogger("kafka2pc").setLevel(logging.ERROR)
CONFIG = {"bootstrap.servers": "model:9092", "linger.ms": 0}


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def cluster(version: int = 2, *, two_phase: bool = True) -> ModelTransport:
    return ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=two_phase), Faults())


def producer(transport: ModelTransport, txn_id: str) -> TwoPhaseProducer:
    p = TwoPhaseProducer({**CONFIG, "transactional.id": txn_id}, two_phase_commit=True, transport=transport)
    p.init_transactions()
    return p


# -- the phases' histograms ------------------------------------------------------------------------------------------

def test_a_producers_prepare_and_completion_are_timed_under_its_path():
    transport = cluster()
    p = producer(transport, "hist-0")
    before = {phase: value(f"kafka2pc_{phase}_seconds_count", path="producer") for phase in ("prepare", "complete")}
    on_behalf = value("kafka2pc_prepare_seconds_count", path="dual_write")
    p.begin_transaction()
    p.produce("t", b"1", partition=0)
    state = p.prepare_transaction()
    p.complete_transaction(state)
    p.begin_transaction()
    p.produce("t", b"2", partition=0)
    p.abort_transaction()
    assert value("kafka2pc_prepare_seconds_count", path="producer") == before["prepare"] + 1
    assert value("kafka2pc_complete_seconds_count", path="producer") == before["complete"] + 2  # commit and abort
    with metrics.on_behalf_of("dual_write"):  # an engine driving the producer: counted once, under the engine
        p.begin_transaction()
        p.produce("t", b"3", partition=0)
        p.prepare_transaction()
    assert value("kafka2pc_prepare_seconds_count", path="dual_write") == on_behalf + 1
    assert value("kafka2pc_prepare_seconds_count", path="producer") == before["prepare"] + 1
    assert value("kafka2pc_prepare_seconds_bucket", path="producer", le="300.0") >= 1  # the buckets reach minutes


# -- fallbacks, by reason ------------------------------------------------------------------------------------------

class Advertising6(ModelTransport):
    """Brokers that advertise InitProducerId v6 whatever their two-phase config (unstable.api.versions.enable)."""

    def cluster_facts(self) -> ClusterFacts:
        return ClusterFacts(6, self.model.transaction_version)


class ConfigUnreadable(Advertising6):
    """... whose configs this principal cannot read (no DESCRIBE_CONFIGS on the cluster)."""

    def execute(self, transactional_id, command):
        if isinstance(command, ReadBrokerConfig):
            self.sent.append(command)
            return ConfigValue(None)
        return super().execute(transactional_id, command)


class V6Gone(Advertising6):
    """The client learnt v6; the brokers no longer speak it (two-phase commit turned off under it)."""

    def execute(self, transactional_id, command):
        if isinstance(command, InitProducerId) and command.enable_2pc:
            self.sent.append(command)
            return InitAnswer(codes.UNSUPPORTED_VERSION)
        if isinstance(command, ReadClusterFacts):
            self.sent.append(command)
            return FactsAnswer(ClusterFacts(5, self.model.transaction_version))
        return super().execute(transactional_id, command)


@pytest.mark.parametrize(("transport_class", "two_phase", "reason"), [
    (ModelTransport, False, "no_v6"),        # a broker before KIP-939
    (Advertising6, False, "config_off"),     # transaction.two.phase.commit.enable=false
    (ConfigUnreadable, False, "acl"),        # refused, and the config cannot be read: TWO_PHASE_COMMIT missing?
    (V6Gone, True, "turned_off"),            # v6 gone under a running client
])
def test_each_fallback_is_counted_under_its_reason(transport_class, two_phase, reason):
    transport = transport_class(CoordinatorModel(transaction_version=2, two_phase_enabled=two_phase), Faults())
    before = {r: value("kafka2pc_two_phase_commit_fallbacks_total", reason=r) for r in metrics.FALLBACK_REASONS}
    p = producer(transport, f"fallback-{reason}")
    assert not p.two_phase_commit_active
    after = {r: value("kafka2pc_two_phase_commit_fallbacks_total", reason=r) for r in metrics.FALLBACK_REASONS}
    assert {r: after[r] - before[r] for r in after if after[r] != before[r]} == {reason: 1.0}


def test_a_producer_with_two_phase_commit_counts_no_fallback():
    before = sum(value("kafka2pc_two_phase_commit_fallbacks_total", reason=r) for r in metrics.FALLBACK_REASONS)
    assert producer(cluster(), "no-fallback").two_phase_commit_active
    assert sum(value("kafka2pc_two_phase_commit_fallbacks_total", reason=r) for r in metrics.FALLBACK_REASONS) == before


# -- the dual writer: phases, its open transactions, recovery ---------------------------------------------------------

class Clock:
    """The wall clock of the open-transaction table, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(metrics.OPEN_TRANSACTIONS, "_clock", fake)
    return fake


class Started(ModelTransport):
    """The model, whose DescribeTransactions gives each open transaction a start time (``started_ms``)."""

    started_ms = 0

    def _description(self, transactional_id):
        found = super()._description(transactional_id)
        return None if found is None else attrs.evolve(found, start_time_ms=self.started_ms)


def oldest(prefix: str) -> float:
    return value("kafka2pc_oldest_open_transaction_seconds", prefix=prefix)


def dual_writer(transport: ModelTransport, path, txn_id: str) -> DualWriter:
    return DualWriter(sqlite3.connect(path), {**CONFIG, "transactional.id": txn_id}, transport=transport)


def test_a_dual_write_is_timed_per_phase_and_its_transaction_counted_open_until_kafka_completes_it(tmp_path, clock):
    transport, txn_id = cluster(), "dw-phases"
    writer = dual_writer(transport, tmp_path / "db", txn_id)
    phases = ("prepare", "record_decision", "complete")
    before = {phase: value(f"kafka2pc_{phase}_seconds_count", path="dual_write") for phase in phases}
    producers = value("kafka2pc_prepare_seconds_count", path="producer")
    with writer.transaction() as tx:
        tx.produce("t", b"1", partition=0)
        clock.now += 7
        assert oldest(txn_id) == 7  # a bare writer's prefix label is its transactional.id
    assert oldest(txn_id) == 0
    assert {phase: value(f"kafka2pc_{phase}_seconds_count", path="dual_write") - before[phase]
            for phase in phases} == dict.fromkeys(phases, 1)
    assert value("kafka2pc_prepare_seconds_count", path="producer") == producers  # counted once, as dual_write
    writer.close()


def test_a_dual_writes_unfinished_transaction_is_counted_until_its_recovery_commits_it(tmp_path, clock):
    transport, txn_id = cluster(), "dw-unfinished"
    writer = dual_writer(transport, tmp_path / "db", txn_id)
    settled = value("kafka2pc_recovery_settled_transactions_total", prefix=txn_id, path="dual_write",
                    reason="committed_decided")
    runs = value("kafka2pc_recovery_seconds_count", path="dual_write")
    # the database commits; Kafka's completion is lost
    with pytest.raises(DualWriteIncompleteError), writer.transaction() as tx:
        tx.produce("t", b"1", partition=0)
        transport.faults.dropped_requests.extend([True] * 5)
    transport.faults.dropped_requests.clear()
    clock.now += 30
    assert oldest(txn_id) == 30  # prepared, decided, and holding read_committed consumers back
    writer.recover_unfinished()
    assert oldest(txn_id) == 0
    assert transport.model.committed_records() == [b"1"]
    assert value("kafka2pc_recovery_settled_transactions_total", prefix=txn_id, path="dual_write",
                 reason="committed_decided") == settled + 1
    assert value("kafka2pc_recovery_seconds_count", path="dual_write") >= runs + 1
    writer.close()


def test_a_transaction_a_dead_writer_left_is_counted_from_its_start_until_a_recovery_settles_it(tmp_path, clock):
    """Another process's transaction is known here only once this process's recovery finds it: from then on it is
    counted from DescribeTransactions' start time until settled; a recovery that fails leaves it counted."""
    transport = Started(CoordinatorModel(transaction_version=2, two_phase_enabled=True), Faults())
    txn_id, path = "dw-dead", tmp_path / "db"
    dead = dual_writer(transport, path, txn_id)
    # a Kafka transaction the database never committed; its abort is lost
    with pytest.raises(RuntimeError), dead.transaction() as tx:
        tx.produce("t", b"never", partition=0)
        transport.faults.dropped_requests.extend([True] * 5)
        raise RuntimeError("the application failed")
    transport.faults.dropped_requests.clear()
    dead.close()  # "killed": its process no longer counts it, and nothing else knows of it yet
    assert oldest(txn_id) == 0 and len(transport.model.open_transactions()) == 1
    transport.started_ms = int((clock.now - 90) * 1000)
    successor = dual_writer(transport, path, txn_id)
    aborted = value("kafka2pc_recovery_settled_transactions_total", prefix=txn_id, path="dual_write",
                    reason="aborted_undecided")
    transport.faults.dropped_requests.extend([True] * 20)  # its recovery finds it, and cannot abort it yet
    with pytest.raises(Exception):  # noqa: B017 - whatever the lost requests raise
        successor.recover()
    transport.faults.dropped_requests.clear()
    assert oldest(txn_id) == 90
    successor.recover()
    assert oldest(txn_id) == 0
    assert transport.model.open_transactions() == []
    assert value("kafka2pc_recovery_settled_transactions_total", prefix=txn_id, path="dual_write",
                 reason="aborted_undecided") == aborted + 1
    successor.close()


def test_a_pools_keeper_writes_the_ages_as_they_grow(tmp_path, clock):
    """Under prometheus_client's multiprocess mode the gauge is what was last written: the keeper writes it every
    round, so a stuck transaction's age grows there too."""
    metrics.OPEN_TRANSACTIONS.opened("pool-ages", "dual_write", "pool-ages-0")
    written = metrics.OLDEST_OPEN_TRANSACTION.labels(prefix="pool-ages")._value
    assert written.get() == 0
    clock.now += 12
    transport = cluster()
    path = tmp_path / "db"
    connection = sqlite3.connect(path, check_same_thread=False)
    pool = DualWriterPool(lambda: sqlite3.connect(path, check_same_thread=False),
                          {**CONFIG, "transactional.id": "pool-ages-keeper"}, size=1,
                          transport_for=lambda _: transport)
    try:
        pool._keeper.tick()
        assert written.get() == 12
    finally:
        pool.close()
        connection.close()
        metrics.OPEN_TRANSACTIONS.closed("pool-ages", "dual_write", "pool-ages-0")


# -- the sink: committer, recovery ------------------------------------------------------------------------------------

class StartedScripted(Scripted):
    """:class:`Scripted`, whose DescribeTransactions gives each open transaction a start time (``started_ms``)."""

    started_ms = 0

    def _description(self, transactional_id):
        found = super()._description(transactional_id)
        return None if found is None else attrs.evolve(found, start_time_ms=self.started_ms)


class StoreDown(FileDecisionLog):
    """A decision log whose store cannot be written now."""

    def record(self, decision: Decision) -> None:
        raise StorageUnavailableError("the decision log's store is down (test)")


def sink_prepared(transport: ModelTransport, txn_id: str, checkpoint: int = 1) -> PreparedTransaction:
    state = scripted_prepare(transport, txn_id, f"{txn_id}@{checkpoint}".encode())
    return PreparedTransaction(txn_id, state, int(txn_id.split("-")[-2]), checkpoint)


def test_a_committers_record_and_completion_are_timed_and_its_transactions_counted_until_completed(tmp_path, clock):
    transport = Scripted(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    committer = Committer(TransactionControl(transport), FileDecisionLog(tmp_path, "phased"))
    before = {phase: value(f"kafka2pc_{phase}_seconds_count", path="sink") for phase in ("record_decision", "complete")}
    seen: list[float] = []
    transport.after[("phased-0-0", EndTxn, 1)] = lambda: seen.append(oldest("phased"))  # while it completes

    def recorded_late(decision, record=committer.decision_log.record):
        clock.now += 3  # the record takes 3 s: the offered transactions wait, prepared
        record(decision)
    committer.decision_log.record = recorded_late
    committer.settle(1, [sink_prepared(transport, "phased-0-0"), sink_prepared(transport, "phased-1-0")])
    assert seen == [3]  # counted from the hand-over, while it was recorded and completed
    assert oldest("phased") == 0
    assert {phase: value(f"kafka2pc_{phase}_seconds_count", path="sink") - before[phase]
            for phase in before} == {"record_decision": 1, "complete": 1}
    assert transport.model.open_transactions() == []


def test_transactions_a_committer_could_not_decide_are_counted_until_recovery_aborts_them(tmp_path, clock):
    """The writer that prepared them is gone; the committer cannot record its decision (the store is down): the
    prepared transactions hold read_committed consumers back, and the gauge says so until a recovery settles them."""
    transport = Scripted(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    control = TransactionControl(transport)
    offered = [sink_prepared(transport, "undecided-0-0"), sink_prepared(transport, "undecided-1-0")]
    with pytest.raises(StorageUnavailableError):
        Committer(control, StoreDown(tmp_path, "undecided")).settle(1, offered)
    clock.now += 45
    assert oldest("undecided") == 45
    aborted = value("kafka2pc_recovery_settled_transactions_total", prefix="undecided", path="sink",
                    reason="aborted_undecided")
    runs = value("kafka2pc_recovery_seconds_count", path="sink")
    recover(control, "undecided", FileDecisionLog(tmp_path, "undecided"))
    assert oldest("undecided") == 0
    assert transport.model.open_transactions() == []
    assert value("kafka2pc_recovery_settled_transactions_total", prefix="undecided", path="sink",
                 reason="aborted_undecided") == aborted + 2
    assert value("kafka2pc_recovery_seconds_count", path="sink") == runs + 1


def test_a_decision_recovery_cannot_complete_yet_is_counted_from_when_it_was_found_until_a_later_recovery_does(
        tmp_path, clock):
    """A crashed committer's decision whose EndTxn cannot be settled now: recovery leaves it open (kept from LISTING),
    and this process counts it from when its listing found it (not from DescribeTransactions' start time: a look per
    id on the recovery's path, review 32b) until a recovery commits it."""
    transport = StartedScripted(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    control, log = TransactionControl(transport), FileDecisionLog(tmp_path, "stuck")
    decided = sink_prepared(transport, "stuck-0-0")
    log.record(Decision(1, [decided]))  # and the committer died
    transport.started_ms = int((clock.now - 120) * 1000)
    transport.end_codes["stuck-0-0"] = [NOT_ENOUGH_REPLICAS] * 3
    committed = value("kafka2pc_recovery_settled_transactions_total", prefix="stuck", path="sink",
                      reason="committed_decided")
    with pytest.raises(TransactionNotSettledError):
        recover(control, "stuck", log)
    clock.now += 30
    assert oldest("stuck") == 30  # a lower bound of its age (120 s): no DescribeTransactions was asked for it
    recover(control, "stuck", log)
    assert oldest("stuck") == 0
    assert transport.model.committed_records() == [b"stuck-0-0@1"]
    assert value("kafka2pc_recovery_settled_transactions_total", prefix="stuck", path="sink",
                 reason="committed_decided") == committed + 1


def test_a_sink_subtasks_prepare_is_timed_under_the_sink_path():
    from kafka2pc.sink.writer import SubtaskWriter  # noqa: PLC0415 - the engine-facing writer, not public API

    writer = SubtaskWriter(CONFIG, "sinkprep", 0, cluster=cluster())
    before = {path: value("kafka2pc_prepare_seconds_count", path=path) for path in ("sink", "producer")}
    writer.produce("t", b"v", partition=0)
    assert writer.prepare(0) is not None
    assert {path: value("kafka2pc_prepare_seconds_count", path=path) - before[path] for path in before} == {
        "sink": 1, "producer": 0}
