"""The three sink-core failures reproduced on Apache Kafka 4.4.0 before the "core correctness" fixes, now passing:
an empty subtask in a checkpoint, LISTING on a broker whose transaction.max.timeout.ms is below 60 s, and a replayed
checkpoint that re-records a done decision."""

import subprocess
import sys
import time
import uuid

import pytest

from kafka2pc import TwoPhaseProducer
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import DecisionConflictError
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, SubtaskWriter, recover
from kafka2pc.testing import BrokerSettings
from kafka2pc.testing.verify import create_topic, end_offsets, read_records, values
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl
from tests.integration.sink_support import PLAIN_WRITER

pytestmark = pytest.mark.integration


def open_ids(control: TransactionControl, prefix: str, settle_s: float = 10.0) -> list[str]:
    """Ids of ``prefix`` with an open transaction, after waiting (bounded) for ending ones to write their markers."""
    deadline = time.monotonic() + settle_s
    while True:
        listed = [t for t in control.list(states=OPEN_STATES) if t.transactional_id.startswith(f"{prefix}-")]
        if all(t.state == "Ongoing" for t in listed) or time.monotonic() > deadline:
            return sorted(t.transactional_id for t in listed)
        time.sleep(0.05)


def test_an_empty_subtask_hands_over_nothing(kafka, topic_factory, tmp_path):
    """Before: write(topic, []) opened and prepared an empty transaction; the committer then raised
    TransactionLostError and so did every later recovery."""
    prefix = f"empty{uuid.uuid4().hex[:6]}"
    topic = topic_factory(kafka, partitions=2)
    log = FileDecisionLog(tmp_path, prefix)
    with ClusterClient(ClientConfig.for_bootstrap(kafka.bootstrap_servers)) as client:
        control = TransactionControl(client)
        writers = [SubtaskWriter({"bootstrap.servers": kafka.bootstrap_servers}, prefix, s, cluster=client)
                   for s in range(3)]
        writers[0].write(topic, [b"s0-a", b"s0-b"])
        writers[1].write(topic, [])  # an empty Spark partition
        writers[2].write(topic, [b"s2-a"])
        prepared = [w.prepare(1) for w in writers]
        assert prepared[1] is None
        handed_over = [p for p in prepared if p is not None]
        Committer(control, log).commit(Decision(1, handed_over))
        assert log.undone() == []
        report = recover(control, prefix, log)  # and recovery afterwards has nothing to do
        assert report.aborted == () and report.checkpoints_rolled_forward == ()
        assert open_ids(control, prefix) == []
    assert sorted(values(read_records(kafka.bootstrap_servers, topic))) == [b"s0-a", b"s0-b", b"s2-a"]


def test_a_transaction_that_wrote_nothing_prepares_as_the_empty_state(kafka):
    with TwoPhaseProducer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"e-{uuid.uuid4().hex}"},
                          two_phase_commit=True) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        state = producer.prepare_transaction()
        assert str(state) == ""
        producer.complete_transaction(state)  # nothing on the broker to complete
        producer.begin_transaction()          # and the producer carries on
        producer.abort_transaction()


def test_listing_on_a_broker_with_a_short_max_timeout(kafka_factory, tmp_path):
    """Before: the abort's InitProducerId asked for 60 000 ms and the broker (max 10 000) refused it with
    INVALID_TRANSACTION_TIMEOUT, so nothing lingering could be aborted. Now the abort is an EndTxn under the listed
    producer id and epoch."""
    broker = kafka_factory(BrokerSettings(transaction_max_timeout_ms=10_000))
    prefix = f"short{uuid.uuid4().hex[:6]}"
    topic = create_topic(broker.bootstrap_servers)
    plain = [f"{prefix}-0-0", f"{prefix}-1-0"]
    writer = PLAIN_WRITER.replace('"transactional.id": txn_id}', '"transactional.id": txn_id, '
                                                                 '"transaction.timeout.ms": 9000}')
    proc = subprocess.Popen([sys.executable, "-c", writer, broker.bootstrap_servers, topic, *plain],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    two_phase = TwoPhaseProducer({"bootstrap.servers": broker.bootstrap_servers,
                                  "transactional.id": f"{prefix}-2-0"}, two_phase_commit=True)
    two_phase.init_transactions()
    two_phase.begin_transaction()
    two_phase.produce(topic, b"prepared, never decided")
    two_phase.prepare_transaction()
    two_phase.close()  # a 2PC transaction: it never times out
    assert end_offsets(broker.bootstrap_servers, topic) == {0: 0}
    with ClusterClient(ClientConfig.for_bootstrap(broker.bootstrap_servers)) as client:
        control = TransactionControl(client)
        report = recover(control, prefix, FileDecisionLog(tmp_path, prefix))
        assert sorted(report.aborted) == sorted([*plain, f"{prefix}-2-0"])
        assert open_ids(control, prefix) == []
    assert end_offsets(broker.bootstrap_servers, topic) == end_offsets(broker.bootstrap_servers, topic,
                                                                       isolation="read_uncommitted")
    assert read_records(broker.bootstrap_servers, topic) == []


def test_a_replayed_checkpoint_never_hides_its_decision(kafka, topic_factory, tmp_path):
    """Before: record(N) for a done N overwrote the decision while N.done stayed; undone() then omitted the new one
    and recovery aborted its transactions silently. A replayed batch does exactly this."""
    prefix = f"replay{uuid.uuid4().hex[:6]}"
    topic = topic_factory(kafka)
    log = FileDecisionLog(tmp_path, prefix)
    with ClusterClient(ClientConfig.for_bootstrap(kafka.bootstrap_servers)) as client:
        control = TransactionControl(client)
        committer = Committer(control, log)
        first = SubtaskWriter({"bootstrap.servers": kafka.bootstrap_servers}, prefix, 0, cluster=client)
        first.write(topic, [b"attempt-1"])
        original = Decision(7, [first.prepare(7)], {"attempt": "1"})
        first.release(committer.commit(original))

        replay = SubtaskWriter({"bootstrap.servers": kafka.bootstrap_servers}, prefix, 0, cluster=client,
                               pool=first.pool)
        replay.write(topic, [b"attempt-2"])
        replayed = Decision(7, [replay.prepare(7)], {"attempt": "2"})
        with pytest.raises(DecisionConflictError, match="already recorded"):
            committer.commit(replayed)
        committer.commit(original)  # recording the same decision again is a no-op
        assert log.decision(7) == original and log.undone() == []
        report = recover(control, prefix, log)  # the replay's transaction is undecided: aborted
        assert report.aborted == (replayed.transactions[0].transactional_id,)
    assert values(read_records(kafka.bootstrap_servers, topic)) == [b"attempt-1"]
