"""What the Spark driver tells operators, without a broker: one INFO line per batch write with its 2PC timings
(streaming batches get theirs from the stream writer), and a batch whose tasks fell back counted as a fallback."""

import logging

import attrs
import pytest

pytest.importorskip("pyspark")

from prometheus_client import REGISTRY

from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.sink.committer import Settlement
from kafka2pc.sink.integration import PreparedTransaction
from kafka2pc.spark.driver import SinkDriver, Timings
from kafka2pc.spark.options import SinkOptions
from kafka2pc.spark.state import SinkState, SinkStore
from kafka2pc.spark.task import TaskMessage

MESSAGE = TaskMessage(partition=0, attempt=0, task_attempt_id=0, checkpoint=1, transactional_id="obs-0-4",
                      state="7:0", transaction_version=2, records=1, two_phase_active=True)


@pytest.fixture
def driver(tmp_path):
    SinkStore(str(tmp_path)).save(SinkState("obs"))
    return SinkDriver(SinkOptions.from_options({"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t",
                                                "checkpointLocation": str(tmp_path)}, streaming=False))


def test_a_batch_write_logs_its_timings_at_info(driver, monkeypatch, caplog):
    mine = PreparedTransaction(MESSAGE.transactional_id, PreparedTxnState.parse(MESSAGE.state, transaction_version=2),
                               MESSAGE.partition, MESSAGE.checkpoint)
    settled = Settlement(1, True, (mine,), ())
    monkeypatch.setattr(driver, "commit", lambda *_: (settled, Timings(0.0012, 0.0034, 0.0056, 0.0007)))
    with caplog.at_level(logging.INFO, logger="kafka2pc.spark.driver"):
        assert driver.commit_write([MESSAGE]) is settled
    lines = [r.getMessage() for r in caplog.records if r.name == "kafka2pc.spark.driver" and r.levelno == logging.INFO]
    assert len(lines) == 1
    assert lines[0].endswith("committed 1 transaction(s); check 1.2 ms, record 3.4 ms, complete 5.6 ms, "
                             "cleanup 0.7 ms")
    assert lines[0].startswith("write of checkpoint 1 of ")


def sink_batch_fallbacks() -> float:
    return REGISTRY.get_sample_value("kafka2pc_two_phase_commit_fallbacks_total", {"reason": "sink_batch"}) or 0.0


def test_a_batch_whose_tasks_fell_back_counts_as_a_fallback_of_the_sink(driver):
    before = sink_batch_fallbacks()
    driver._announce_fallback([attrs.evolve(MESSAGE, two_phase_active=False)])
    driver._announce_fallback([MESSAGE])
    assert sink_batch_fallbacks() == before + 1
