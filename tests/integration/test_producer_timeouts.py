"""A prepared transaction outlives transaction.max.timeout.ms only with 2PC; without it the commit is refused
loudly with TransactionLostError."""

import time

import pytest

from kafka2pc import PreparedTxnState, TransactionOutcome
from kafka2pc.errors import TransactionLostError
from kafka2pc.testing import PRE_2PC_KAFKA_VERSION, BrokerSettings
from kafka2pc.testing.verify import create_topic, read_records, values
from tests.integration.producer_support import crash_writer, new_txn_id, producer

pytestmark = pytest.mark.integration

MAX_TIMEOUT_MS = 4_000
# The coordinator looks for expired transactions every cleanup interval; wait past the timeout plus one interval
# and the abort's markers. Each test waits once, for a live producer's transaction and a crashed one's together.
SHORT_TIMEOUTS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}
WAIT_S = MAX_TIMEOUT_MS / 1000 + 4


def short_timeout_broker(kafka_factory, **settings):
    return kafka_factory(BrokerSettings(transaction_max_timeout_ms=MAX_TIMEOUT_MS, extra=SHORT_TIMEOUTS, **settings))


def test_two_phase_prepared_transaction_outlives_the_max_timeout(kafka_factory):
    broker = short_timeout_broker(kafka_factory)
    topic = create_topic(broker.bootstrap_servers)
    txn_id, crashed_id = new_txn_id("outlive"), new_txn_id("outlive-crashed")
    with producer(broker.bootstrap_servers, txn_id) as p:
        p.init_transactions()
        assert p.two_phase_commit_active
        p.begin_transaction()
        p.produce_batch(topic, [b"slow-1", b"slow-2"])
        state = p.prepare_transaction()
        # and across a crash: the successor commits it after the timeout has long passed
        report = crash_writer(broker.bootstrap_servers, crashed_id, topic, stage="after-prepare", count=3)
        time.sleep(WAIT_S)
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
    assert values(read_records(broker.bootstrap_servers, topic)) == [b"slow-1", b"slow-2"]
    with producer(broker.bootstrap_servers, crashed_id) as successor:
        assert str(successor.init_transactions(keep_prepared_txn=True)) == report["state"]
        assert successor.complete_transaction(report["state"]) is TransactionOutcome.COMMITTED
    assert len(read_records(broker.bootstrap_servers, topic)) == 5


@pytest.mark.parametrize("settings", [
    {"two_phase_commit": False},
    {"version": PRE_2PC_KAFKA_VERSION},
], ids=["newest-2pc-off", "pre2pc"])
def test_without_2pc_a_timed_out_commit_raises_transaction_lost(kafka_factory, settings):
    broker = short_timeout_broker(kafka_factory, **settings)
    topic = create_topic(broker.bootstrap_servers)
    txn_id, crashed_id = new_txn_id("lost"), new_txn_id("lost-crashed")
    with producer(broker.bootstrap_servers, txn_id) as p:
        p.init_transactions()
        assert not p.two_phase_commit_active
        p.begin_transaction()
        p.produce_batch(topic, [b"doomed"])
        state = p.prepare_transaction()
        # a successor holding a crashed writer's stored state must learn the same, not a silent success
        report = crash_writer(broker.bootstrap_servers, crashed_id, topic, stage="after-prepare", count=2,
                              two_phase_commit=True)
        time.sleep(WAIT_S)
        with pytest.raises(TransactionLostError) as info:
            p.complete_transaction(state)
        assert info.value.transactional_id == txn_id
        assert (info.value.producer_id, info.value.epoch) == (state.producer_id, state.epoch)
        assert txn_id in str(info.value) and str(state) in str(info.value)
    with producer(broker.bootstrap_servers, crashed_id) as successor:
        assert successor.init_transactions(keep_prepared_txn=True) is None
        with pytest.raises(TransactionLostError):
            successor.complete_transaction(PreparedTxnState.parse(report["state"]))
    assert read_records(broker.bootstrap_servers, topic) == []
