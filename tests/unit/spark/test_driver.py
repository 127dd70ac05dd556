"""The driver's batch-write outcome errors, without a broker: a failure after the decision says the write is decided
(and must not be run again); a failure before it is the failure itself."""

import pytest

pytest.importorskip("pyspark")

from kafka2pc.errors import BrokerUnavailableError, WriteDecidedError
from kafka2pc.sink import Decision
from kafka2pc.spark.driver import SinkDriver
from kafka2pc.spark.options import SinkOptions
from kafka2pc.spark.state import SinkState, SinkStore
from kafka2pc.spark.task import TaskMessage

MESSAGE = TaskMessage(partition=0, attempt=0, task_attempt_id=0, checkpoint=1, transactional_id="pfx-0-4",
                      state="7:0", transaction_version=2, records=1, two_phase_active=True)


@pytest.fixture
def driver(tmp_path, monkeypatch):
    SinkStore(str(tmp_path)).save(SinkState("pfx"))
    options = SinkOptions.from_options({"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t",
                                        "checkpointLocation": str(tmp_path)}, streaming=False)
    sink_driver = SinkDriver(options)

    def fails(*_args):
        raise BrokerUnavailableError("coordinator unreachable")

    monkeypatch.setattr(sink_driver, "commit", fails)
    return sink_driver


def test_a_failure_after_the_decision_says_the_write_is_decided(driver):
    driver.decision_log.record(Decision(1, ()))
    with pytest.raises(WriteDecidedError, match="Do NOT run the same write again") as raised:
        driver.commit_write([MESSAGE])
    assert isinstance(raised.value.__cause__, BrokerUnavailableError)


def test_a_failure_before_the_decision_is_itself(driver):
    with pytest.raises(BrokerUnavailableError):
        driver.commit_write([MESSAGE])


def test_no_task_reported_nothing_to_decide(driver):
    assert driver.commit_write([None, None]) is None
