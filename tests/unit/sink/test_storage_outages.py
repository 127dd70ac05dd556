"""A store that does not answer is never read as "absent", nor as "corrupt": the decision log, the sink state and the
folders raise a retriable error, and nothing is concluded from the outage (issue 28, defect 1 and the transient-error
gap). HDFS's replace keeps its methods agreeing after a crash in the middle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from kafka2pc import PreparedTxnState
from kafka2pc.errors import DecisionLogCorruptError, RetriableError
from kafka2pc.sink.integration import Decision, FileDecisionLog, PreparedTransaction
from kafka2pc.sink.storage import HdfsFolder
from kafka2pc.spark.state import SinkState, SinkStore
from tests.unit.sink.outage_store import outage_folder


def decision(checkpoint: int) -> Decision:
    return Decision(checkpoint, [PreparedTransaction(f"job-0-{checkpoint % 2}", PreparedTxnState(7, checkpoint), 0,
                                                     checkpoint)])


def test_a_file_the_store_cannot_look_at_is_not_absent(tmp_path):
    fs, folder = outage_folder(str(tmp_path))
    folder.replace("sink.json", b"{}")
    fs.outage("sink.json|never-written")
    with pytest.raises(RetriableError, match="nothing was concluded"):
        folder.exists("sink.json")
    with pytest.raises(RetriableError):
        folder.exists("never-written")
    fs.end_outage()
    assert folder.exists("sink.json") and not folder.exists("never-written")


def test_a_decision_the_store_cannot_read_is_not_undecided(tmp_path):
    fs, folder = outage_folder(str(tmp_path))
    log = FileDecisionLog(folder, "job")
    log.record(decision(3))
    fs.outage(r"decision\.json")
    with pytest.raises(RetriableError) as raised:
        log.decision(3)
    assert raised.value.retriable() and not isinstance(raised.value, DecisionLogCorruptError)
    with pytest.raises(RetriableError):
        log.is_done(3)
    fs.end_outage()
    assert log.decision(3) == decision(3)


def test_a_transient_read_error_is_retriable_not_corrupt(tmp_path):
    fs, folder = outage_folder(str(tmp_path))
    log = FileDecisionLog(folder, "job")
    log.record(decision(1))
    fs.outage(r"decision\.json", times=1)  # the listing works, the read of the record times out once
    with pytest.raises(RetriableError) as raised:
        log.undone()
    assert not isinstance(raised.value, DecisionLogCorruptError)
    assert log.undone() == [decision(1)]  # the next call reads it


def test_a_listing_the_store_cannot_answer_is_not_empty(tmp_path):
    fs, folder = outage_folder(str(tmp_path))
    log = FileDecisionLog(folder, "job")
    log.record(decision(1))
    fs.outage(str(tmp_path))
    with pytest.raises(RetriableError):
        log.undone()
    with pytest.raises(RetriableError):
        log.last_checkpoint()


def state_store(tmp_path, monkeypatch):
    fs, folder = outage_folder(str(tmp_path))
    monkeypatch.setattr("kafka2pc.spark.state.open_folder", lambda _location: folder)
    return fs, SinkStore("hdfs://namenode/checkpoint")


def test_sink_state_the_store_cannot_read_is_not_a_first_run(tmp_path, monkeypatch):
    """Scenario B: the look at sink.json fails once; before, load() said "first run", and open() pinned a new prefix
    over the old one, whose prepared transactions then pinned the LSO for good."""
    fs, store = state_store(tmp_path, monkeypatch)
    store.save(SinkState("old-prefix"))
    fs.outage("sink.json", times=1)

    def no_cluster():
        raise AssertionError("the first-run path asked the cluster")

    with pytest.raises(RetriableError):
        store.open(None, no_cluster)
    assert json.loads((tmp_path / "kafka2pc" / "sink.json").read_text())["prefix"] == "old-prefix"
    assert store.open(None, no_cluster).prefix == "old-prefix"  # once the store answers


def test_two_first_runs_pin_one_prefix(tmp_path, monkeypatch):
    """sink.json is created exclusively: a first run that finds it created meanwhile takes the winner's state."""
    _, store = state_store(tmp_path, monkeypatch)
    listed = []

    def cluster():
        listed.append(1)
        store.save(SinkState("winner"))  # another first run pins its state while this one checks the cluster
        return type("Control", (), {"list": lambda self, **kw: []})()

    assert store.open(None, cluster).prefix == "winner" and listed
    assert json.loads((tmp_path / "kafka2pc" / "sink.json").read_text())["prefix"] == "winner"


def test_an_hdfs_replace_cut_short_leaves_every_method_agreeing(tmp_path):
    """A crash after the old N.done was moved aside (N.done.old), before the new one was renamed in: is_done(N) and
    undone() must agree (before, undone() listed N while is_done(N) was true)."""
    FileDecisionLog(tmp_path, "job").record(decision(1))
    folder = HdfsFolder(LocalFileSystem(), str(tmp_path), f"hdfs://namenode{tmp_path}")
    log = FileDecisionLog(folder, "job")
    name = f"{1:020d}.done"
    Path(tmp_path, f"{name}.old").write_bytes(b"")  # the state the crash left
    assert log.is_done(1)
    assert log.undone() == []
    assert name in folder.names() and f"{name}.old" not in folder.names()
    folder.delete(name)  # pruning removes the file moved aside too
    assert not log.is_done(1) and name not in folder.names()


def test_a_decision_whose_create_gets_no_definite_answer_is_sent_again_until_it_does(tmp_path):
    """Found by the adversarial review: a create whose answer was lost, then a look that found nothing (the write
    still in flight), raised at once; Spark's abort() then aborted the transactions, and the create landed after:
    a decided checkpoint whose transactions were aborted. The create is sent again until the store answers."""
    fs, folder = outage_folder(str(tmp_path))
    log = FileDecisionLog(folder, "job")
    fs.outage(r"decision\.json", times=3, calls=("pipe_file",))  # three creates fail, then the store answers
    log.record(decision(1))
    assert log.decision(1) == decision(1) and fs.failed


def test_a_create_that_landed_with_its_answer_lost_is_recorded_once(tmp_path):
    fs, folder = outage_folder(str(tmp_path))
    log = FileDecisionLog(folder, "job")
    fs.lose_answers = True
    fs.outage(r"00001\.decision\.json", times=1, calls=("pipe_file",))  # it lands; its answer is lost
    log.record(decision(1))
    assert log.decision(1) == decision(1) and fs.failed[:1] == ["pipe_file 00000000000000000001.decision.json"]


def test_a_create_without_a_definite_answer_for_the_whole_window_raises_retriable(tmp_path, monkeypatch):
    monkeypatch.setattr("kafka2pc.sink.decision_log.CREATE_RETRY_S", 1.0)
    fs, folder = outage_folder(str(tmp_path))
    log = FileDecisionLog(folder, "job")
    fs.outage(r"decision\.json", calls=("pipe_file",))
    with pytest.raises(RetriableError):
        log.record(decision(1))
    assert len(fs.failed) == 3  # sent again within the window (after 0.2 and 0.4 s), then given up
    assert log.decision(1) is None
