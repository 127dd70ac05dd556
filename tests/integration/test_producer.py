"""TwoPhaseProducer against real brokers: the newest release (2PC active) and Apache Kafka 3.9.x (fallback)."""

import logging

import pytest

from kafka2pc import PreparedTxnState, TransactionOutcome
from kafka2pc.errors import (
    InvalidPreparedStateError,
    ProducerFencedError,
    TransactionOutcomeUnknownError,
    TransactionStateError,
)
from kafka2pc.testing.verify import end_offsets, read_records, values
from tests.integration.producer_support import crash_writer, new_txn_id, producer

pytestmark = pytest.mark.integration


@pytest.fixture(params=["newest", "pre2pc"])
def broker(request):
    """Each test runs on the newest release (2PC active) and on 3.9.x (fallback)."""
    return request.getfixturevalue("kafka" if request.param == "newest" else "kafka_pre2pc")


def expect_active(broker) -> bool:
    return broker.settings.knows_two_phase_commit and broker.settings.two_phase_commit


def test_commit_makes_exactly_the_records_visible(broker, topic_factory):
    topic = topic_factory(broker, partitions=3)
    with producer(broker.bootstrap_servers, new_txn_id()) as p:
        p.init_transactions()
        assert p.two_phase_commit_active is expect_active(broker)
        p.begin_transaction()
        singles = [f"single-{i}".encode() for i in range(20)]
        for i, value in enumerate(singles):
            p.produce(topic, value=value, key=f"k{i}".encode(), headers=[("h", b"1")])
        bulk = [f"bulk-{i}".encode() for i in range(5000)]
        p.produce_batch(topic, bulk)
        p.produce_batch(topic, [b"keyed-a", b"keyed-b"], keys=[b"a", b"b"])
        p.commit_transaction()
    seen = values(read_records(broker.bootstrap_servers, topic))
    assert sorted(seen) == sorted([*singles, *bulk, b"keyed-a", b"keyed-b"])


def test_abort_makes_nothing_visible(broker, topic_factory):
    topic = topic_factory(broker)
    with producer(broker.bootstrap_servers, new_txn_id()) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce_batch(topic, [b"x"] * 100)
        p.flush()
        p.abort_transaction()
    assert read_records(broker.bootstrap_servers, topic) == []
    assert len(read_records(broker.bootstrap_servers, topic, isolation="read_uncommitted")) == 100


def test_prepare_then_complete_commits_and_is_idempotent(broker, topic_factory):
    topic = topic_factory(broker)
    txn_id = new_txn_id()
    with producer(broker.bootstrap_servers, txn_id) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce_batch(topic, [b"p1", b"p2"])
        state = p.prepare_transaction()
        assert str(state) == f"{state.producer_id}:{state.epoch}"
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED  # again: reports, does nothing
    with producer(broker.bootstrap_servers, txn_id) as successor:  # and from another producer
        assert successor.init_transactions(keep_prepared_txn=True) is None
        assert successor.complete_transaction(str(state)) is TransactionOutcome.COMMITTED
    assert values(read_records(broker.bootstrap_servers, topic)) == [b"p1", b"p2"]


def test_complete_with_other_state_aborts(broker, topic_factory):
    topic = topic_factory(broker)
    with producer(broker.bootstrap_servers, new_txn_id()) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce_batch(topic, [b"no"])
        state = p.prepare_transaction()
        # a state naming a transaction that never ran (with the protocol recorded, as the sink and dual writer do)
        other = PreparedTxnState(state.producer_id, state.epoch + 1, state.transaction_version)
        assert p.complete_transaction(other) is TransactionOutcome.ABORTED
        p.begin_transaction()
        p.produce_batch(topic, [b"no either"])
        state = p.prepare_transaction()
        bare = PreparedTxnState.parse(f"{state.producer_id}:{state.epoch + 1}")  # KIP-939's string: no protocol
        if state.transaction_version == 1:
            assert p.complete_transaction(bare) is TransactionOutcome.ABORTED  # a v1 cluster: certainly v1
        else:  # under v1 rules "CompleteAbort at that epoch" would be its abort; under v2 it never ran: unknown
            with pytest.raises(TransactionOutcomeUnknownError, match="does not say which"):
                p.complete_transaction(bare)
    assert read_records(broker.bootstrap_servers, topic) == []


def test_prepared_transaction_survives_writer_crash(broker, topic_factory):
    topic = topic_factory(broker)
    txn_id = new_txn_id("crash")
    report = crash_writer(broker.bootstrap_servers, txn_id, topic, stage="after-prepare", count=500)
    stored = report["state"]
    assert read_records(broker.bootstrap_servers, topic, settle_s=0) == []  # prepared, not committed

    with producer(broker.bootstrap_servers, txn_id) as recovering:
        kept = recovering.init_transactions(keep_prepared_txn=True)
        assert str(kept) == stored
        assert recovering.two_phase_commit_active is expect_active(broker)
        assert recovering.complete_transaction(PreparedTxnState.parse(stored)) is TransactionOutcome.COMMITTED
        recovering.begin_transaction()  # and the recovering producer carries on with its own transactions
        recovering.produce(topic, value=b"after-recovery")
        recovering.commit_transaction()
    seen = values(read_records(broker.bootstrap_servers, topic))
    assert seen == [f"crash-{i}".encode() for i in range(500)] + [b"after-recovery"]

    with producer(broker.bootstrap_servers, txn_id) as again:  # a second recovery with the same state: no-op
        assert again.init_transactions(keep_prepared_txn=True) is None
        # a later transaction has ended since: the coordinator no longer says how this one ended, and kafka2pc
        # says so instead of guessing (it did commit, above)
        with pytest.raises(TransactionOutcomeUnknownError, match="the id has moved on since"):
            again.complete_transaction(stored)
    assert len(read_records(broker.bootstrap_servers, topic)) == 501


def test_recovery_with_mismatching_state_aborts_and_lso_advances(broker, topic_factory):
    topic = topic_factory(broker)
    txn_id = new_txn_id("mismatch")
    report = crash_writer(broker.bootstrap_servers, txn_id, topic, stage="after-prepare", count=50)
    producer_id, epoch = report["producer"]
    assert end_offsets(broker.bootstrap_servers, topic) == {0: 0}  # the open transaction pins the LSO

    with producer(broker.bootstrap_servers, txn_id) as recovering:
        assert str(recovering.init_transactions(keep_prepared_txn=True)) == report["state"]
        wrong = PreparedTxnState(producer_id, epoch + 2)
        assert recovering.complete_transaction(wrong) is TransactionOutcome.ABORTED
        recovering.begin_transaction()
        recovering.produce(topic, value=b"later")
        recovering.commit_transaction()
    assert values(read_records(broker.bootstrap_servers, topic)) == [b"later"]
    committed_end = end_offsets(broker.bootstrap_servers, topic)
    assert committed_end == end_offsets(broker.bootstrap_servers, topic, isolation="read_uncommitted")


def test_crash_before_prepare_leaves_nothing_visible(broker, topic_factory):
    topic = topic_factory(broker)
    txn_id = new_txn_id("early")
    report = crash_writer(broker.bootstrap_servers, txn_id, topic, stage="before-prepare", count=80)
    assert report["state"] is None
    assert len(read_records(broker.bootstrap_servers, topic, isolation="read_uncommitted")) == 80

    with producer(broker.bootstrap_servers, txn_id) as recovering:
        kept = recovering.init_transactions(keep_prepared_txn=True)
        assert kept is not None  # the crashed writer's transaction is still open on the broker
        # the application's store has no prepared state for it: "" means "no transaction"
        assert recovering.complete_transaction("") is TransactionOutcome.ABORTED
        recovering.begin_transaction()
        recovering.produce(topic, value=b"fresh")
        recovering.commit_transaction()
    assert values(read_records(broker.bootstrap_servers, topic)) == [b"fresh"]


def test_second_producer_fences_the_first(broker, topic_factory):
    topic = topic_factory(broker)
    txn_id = new_txn_id("fence")
    first = producer(broker.bootstrap_servers, txn_id)
    first.init_transactions()
    first.begin_transaction()
    first.produce(topic, value=b"zombie")
    first.flush()
    with producer(broker.bootstrap_servers, txn_id) as second:
        second.init_transactions()
        with pytest.raises(ProducerFencedError):
            first.commit_transaction()
        with pytest.raises(ProducerFencedError):  # and every later call says so too
            first.begin_transaction()
        second.begin_transaction()
        second.produce(topic, value=b"winner")
        second.commit_transaction()
    first.close()
    assert values(read_records(broker.bootstrap_servers, topic)) == [b"winner"]


def test_misuse_gives_specific_errors(broker, topic_factory):
    topic = topic_factory(broker)
    with producer(broker.bootstrap_servers, new_txn_id()) as p:
        with pytest.raises(TransactionStateError, match="init_transactions"):
            p.begin_transaction()
        p.init_transactions()
        with pytest.raises(TransactionStateError, match=r"produce\(\) is not allowed in state READY"):
            p.produce(topic, value=b"x")
        p.begin_transaction()
        with pytest.raises(TypeError, match="value must be bytes"):
            p.produce(topic, value="text")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="partition 7 does not exist"):
            p.produce(topic, value=b"x", partition=7)
        p.produce(topic, value=b"x")
        p.prepare_transaction()
        with pytest.raises(TransactionStateError, match=r"produce\(\) is not allowed in state PREPARED"):
            p.produce(topic, value=b"y")
        with pytest.raises(TransactionStateError, match="PREPARED"):
            p.begin_transaction()
        with pytest.raises(InvalidPreparedStateError):
            p.complete_transaction("not-a-state")
        p.abort_transaction()


def test_fallback_is_announced_once(broker, topic_factory, caplog):
    with caplog.at_level(logging.WARNING, logger="kafka2pc"), producer(broker.bootstrap_servers, new_txn_id()) as p:
        p.init_transactions()
        for _ in range(2):
            p.begin_transaction()
            p.commit_transaction()
    warnings = [r for r in caplog.records if "two-phase commit is NOT active" in r.getMessage()]
    if expect_active(broker):
        assert p.two_phase_commit_active and warnings == []
    else:
        assert not p.two_phase_commit_active
        assert len(warnings) == 1
        assert "transaction.two.phase.commit.enable=true" in warnings[0].getMessage()
        assert "transaction.timeout.ms=900000" in warnings[0].getMessage()


def test_standard_mode_never_uses_2pc(kafka, topic_factory):
    with producer(kafka.bootstrap_servers, new_txn_id(), two_phase_commit=False) as p:
        p.init_transactions()
        assert p.two_phase_commit_active is False


def test_large_transaction_spans_many_batches(broker, topic_factory):
    topic = topic_factory(broker, partitions=2)
    singles = [f"{i:08d}".encode() * 12 for i in range(12_000)]  # ~1.2 MB one record at a time
    bulk = [f"{i:08d}".encode() * 25 for i in range(12_000)]     # ~2.5 MB in one call
    with producer(broker.bootstrap_servers, new_txn_id(), **{"batch.size": 200_000}) as p:
        p.init_transactions()
        p.begin_transaction()
        for value in singles:
            p.produce(topic, value=value, partition=0)
        p.produce_batch(topic, bulk, partition=1)
        p.commit_transaction()
    records = read_records(broker.bootstrap_servers, topic, timeout_s=60)
    assert [r.value for r in records if r.partition == 0] == singles
    assert [r.value for r in records if r.partition == 1] == bulk
