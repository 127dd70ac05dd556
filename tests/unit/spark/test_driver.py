"""The driver's batch-write outcome errors, without a broker: a failure after the decision says the write is decided
(and must not be run again); a failure before it is the failure itself."""

import attrs
import pytest

pytest.importorskip("pyspark")

from kafka2pc.errors import BrokerUnavailableError, StaleWriteVersionError, WriteDecidedError
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.sink.integration import Decision, PreparedTransaction
from kafka2pc.sink.write_keys import METADATA_KEY, Verdict
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
    mine = PreparedTransaction(MESSAGE.transactional_id, PreparedTxnState.parse(MESSAGE.state, transaction_version=2),
                               MESSAGE.partition, MESSAGE.checkpoint)
    driver.decision_log.record(Decision(1, (mine,)))
    with pytest.raises(WriteDecidedError, match="Do NOT run the same write again") as raised:
        driver.commit_write([MESSAGE])
    assert isinstance(raised.value.__cause__, BrokerUnavailableError)


def test_a_failure_before_the_decision_is_itself(driver):
    with pytest.raises(BrokerUnavailableError):
        driver.commit_write([MESSAGE])


def test_no_task_reported_nothing_to_decide(driver):
    assert driver.commit_write([None, None]) is None


def keyed_driver(location, version):
    options = SinkOptions.from_options({"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t",
                                        "checkpointLocation": str(location), "txnAppId": "job",
                                        "txnVersion": str(version)}, streaming=False)
    return SinkDriver(options)


def test_a_keyed_write_is_judged_against_the_newest_decision(tmp_path):
    SinkStore(str(tmp_path)).save(SinkState("pfx"))
    log = keyed_driver(tmp_path, 0).decision_log
    log.record(Decision(1, (), {METADATA_KEY: {"job": 5, "other": 9}}))
    log.mark_done(1)
    log.record(Decision(2, (), {METADATA_KEY: {"job": 6, "other": 9}}))  # what the newest says wins
    assert keyed_driver(tmp_path, 6).write_key_verdict() is Verdict.ALREADY_DECIDED
    assert keyed_driver(tmp_path, 7).write_key_verdict() is Verdict.WRITE
    with pytest.raises(StaleWriteVersionError):
        keyed_driver(tmp_path, 5).write_key_verdict()


def test_a_decision_carries_the_keys_forward(tmp_path, monkeypatch):
    SinkStore(str(tmp_path)).save(SinkState("pfx"))
    driver = keyed_driver(tmp_path, 3)
    driver.decision_log.record(Decision(1, (), {METADATA_KEY: {"other": 9}}))
    recorded = {}

    class Committer:
        def __init__(self, _control, _log):
            pass

        def settle(self, _checkpoint, _offered, metadata):
            recorded.update(metadata)
            raise BrokerUnavailableError("stop here")

    monkeypatch.setattr(SinkDriver, "control", None)  # no cluster: the committer is replaced
    monkeypatch.setattr("kafka2pc.spark.driver.Committer", Committer)
    with pytest.raises(BrokerUnavailableError):
        driver.commit([attrs.evolve(MESSAGE, checkpoint=2)], 2)
    assert recorded[METADATA_KEY] == {"other": 9, "job": 3}
