"""The Spark driver under storage faults and races, without a broker (issue 28): Spark's abort() after a commit that
recorded its decision never aborts that decision because a look at the log failed (scenario A); the loser of a
race to record a checkpoint is told WriteConflictError and its transactions are aborted (defect 4)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from kafka2pc import PreparedTxnState
from kafka2pc.errors import BrokerUnavailableError, OutcomeUnknownError, WriteConflictError
from kafka2pc.sink.integration import Decision, FileDecisionLog, PreparedTransaction
from kafka2pc.spark.driver import SinkDriver
from kafka2pc.spark.options import SinkOptions
from kafka2pc.spark.state import SinkState, SinkStore
from kafka2pc.spark.task import TaskMessage
from tests.unit.sink.outage_store import outage_folder

LOCATION = "hdfs://namenode/checkpoints/orders"


def message(partition: int, producer_id: int, checkpoint: int = 4) -> TaskMessage:
    return TaskMessage(partition=partition, attempt=0, task_attempt_id=partition, checkpoint=checkpoint,
                       transactional_id=f"pfx-{partition}-0", state=f"{producer_id}:0", transaction_version=2,
                       records=1, two_phase_active=True)


def prepared(m: TaskMessage) -> PreparedTransaction:
    return PreparedTransaction(m.transactional_id, PreparedTxnState.parse(m.state, transaction_version=2),
                               m.partition, m.checkpoint)


class Control:
    """What the driver asks of the coordinators, recorded; nothing is open on the cluster."""

    def __init__(self) -> None:
        self.aborted: list[tuple[str, str]] = []

    def abort_all(self, items):
        self.aborted += [(txn_id, str(state)) for txn_id, state in items]
        return [Exception("not reached in this test") for _ in items]

    def list(self, **_kwargs):
        return []

    def abort_all_ongoing(self, items):
        return [None for _ in items]


@pytest.fixture
def world(tmp_path, monkeypatch):
    fs, folder = outage_folder(str(tmp_path))
    monkeypatch.setattr("kafka2pc.spark.state.open_folder", lambda _location: folder)
    SinkStore(LOCATION).save(SinkState("pfx"))
    control = Control()
    monkeypatch.setattr(SinkDriver, "control", property(lambda _self: control))
    monkeypatch.setattr("kafka2pc.spark.driver.move_window", lambda *_args: "window")
    options = SinkOptions.from_options({"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t",
                                        "checkpointLocation": LOCATION}, streaming=False)
    return fs, control, lambda: SinkDriver(options)


def test_an_abort_whose_look_at_the_decision_fails_aborts_nothing(world):
    """Scenario A: commit(N) recorded the decision and then failed (a lost EndTxn answer); Spark calls abort(N) while
    the NameNode does not answer. Before, the failed look read as "no decision" and the decided transactions were
    aborted (their rows lost once recovery rolled the decision forward)."""
    fs, control, driver = world
    messages = [message(0, 70), message(1, 71)]
    driver().decision_log.record(Decision(4, [prepared(m) for m in messages]))
    fs.outage(r"decision\.json", times=1)
    driver().abort(messages, 4)
    assert control.aborted == []
    assert fs.failed, "the outage was never hit"


def test_the_loser_of_a_race_to_record_is_told_write_conflict_and_its_transactions_are_aborted(world):
    """Defect 4: another write on the same location recorded checkpoint 4 first; this write's commit failed. Before,
    any failure followed by a recorded decision was WriteDecidedError ("do NOT run it again") and abort() left this
    write's prepared transactions open."""
    _, control, driver = world
    mine = [message(0, 80), message(1, 81)]
    rival = Decision(4, [prepared(message(0, 90)), prepared(message(1, 91))])

    def commit(_messages, _checkpoint):
        driver().decision_log.record(rival)  # the other write got there first
        raise BrokerUnavailableError("the record lost the race")

    loser = driver()
    loser.commit = commit
    with pytest.raises(WriteConflictError, match="none of its rows were written"):
        loser.commit_write(mine)
    driver().abort(mine, 4)  # what Spark calls after a failed commit
    assert sorted(control.aborted) == [("pfx-0-0", "80:0"), ("pfx-1-0", "81:0")]


def test_a_failed_commit_whose_decision_cannot_be_read_is_outcome_unknown(world):
    fs, _, driver = world

    def commit(_messages, _checkpoint):
        fs.outage(r"decision\.json")
        raise BrokerUnavailableError("coordinator unreachable")

    writer = driver()
    writer.commit = commit
    with pytest.raises(OutcomeUnknownError, match="Do NOT run it again yet"):
        writer.commit_write([message(0, 70)])


def test_a_committer_that_loses_the_record_race_aborts_what_it_offered(tmp_path):
    """The race inside Committer.settle: the look found checkpoint 4 undecided, another writer recorded it before
    this one's record. Before, DecisionConflictError escaped and this write's transactions stayed prepared."""
    from kafka2pc.sink.integration import Committer  # noqa: PLC0415

    control = Control()
    rival = Decision(4, [prepared(message(0, 90))])

    class RacedLog(FileDecisionLog):
        def record(self, decision):
            if decision != rival:
                FileDecisionLog(self.folder, "pfx").record(rival)
            super().record(decision)

    control.describe_all = lambda ids: [type("Seen", (), {"state": "Ongoing", "identity": _identity(i)})()
                                        for i in ids]
    mine = [prepared(message(0, 80)), prepared(message(1, 81))]
    settlement = Committer(control, RacedLog(tmp_path, "pfx")).settle(4, mine, {})
    assert not settlement.decided_now and settlement.committed == rival.transactions
    assert sorted(control.aborted) == [("pfx-0-0", "80:0"), ("pfx-1-0", "81:0")]


def _identity(transactional_id: str):
    from kafka2pc.transaction_control import ProducerIdentity  # noqa: PLC0415

    return ProducerIdentity(80 if transactional_id == "pfx-0-0" else 81, 0)


def keyed(version: int) -> SinkOptions:
    return SinkOptions.from_options({"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t",
                                     "checkpointLocation": LOCATION, "txnAppId": "enrich",
                                     "txnVersion": str(version)}, streaming=False)


@pytest.mark.usefixtures("world")
def test_a_second_query_reusing_a_txn_app_id_is_refused_not_skipped(monkeypatch):
    """Query A decided version 3 of txnAppId 'enrich'; query B (another streaming query id) writes its own version 3
    with the same key and location. Before, B's write was taken as a replay and skipped: its rows silently dropped.
    A's own replay of version 3 still writes nothing, without an error."""
    from kafka2pc.errors import UsageError  # noqa: PLC0415
    from kafka2pc.sink.write_keys import Verdict  # noqa: PLC0415

    settle_without_a_cluster(monkeypatch)
    SinkDriver(keyed(3)).commit_write([attrs_evolve(message(0, 70, checkpoint=1), query_id="query-A")])
    assert SinkDriver(keyed(3)).write_key_verdict() is Verdict.ALREADY_DECIDED
    SinkDriver(keyed(3)).confirm_replay([attrs_evolve(message(0, 0, checkpoint=2), state="", query_id="query-A")])
    with pytest.raises(UsageError, match="comes from query query-B"):
        SinkDriver(keyed(3)).confirm_replay([attrs_evolve(message(0, 0, checkpoint=2), state="",
                                                          query_id="query-B")])
    with pytest.raises(UsageError, match="Two queries share one txnAppId"):  # a higher version from B too
        SinkDriver(keyed(4)).commit_write([attrs_evolve(message(0, 71, checkpoint=2), query_id="query-B")])


def attrs_evolve(m: TaskMessage, **changes) -> TaskMessage:
    import attrs  # noqa: PLC0415

    return attrs.evolve(m, **changes)


def settle_without_a_cluster(monkeypatch):
    """The committer's settle records the decision and takes every offered transaction as committed."""
    from kafka2pc.sink.committer import Settlement  # noqa: PLC0415
    from kafka2pc.sink.integration import Committer  # noqa: PLC0415

    def settle(self, checkpoint, offered, metadata=None):
        self.decision_log.record(Decision(checkpoint, offered, metadata or {}))
        self.decision_log.mark_done(checkpoint)
        return Settlement(checkpoint, True, tuple(offered), ())

    monkeypatch.setattr(Committer, "settle", settle)


def test_the_loser_of_a_record_race_never_aborts_the_winners_decided_transactions(tmp_path, monkeypatch):
    """Found by the adversarial review: after a lost race the loser's cleanup listed the prefix and aborted every open
    transaction, the winner's decided ones (not yet committed) included; the winner's completion then found them
    lost. The cleanup keeps the ids of every undone decision."""
    from kafka2pc import TwoPhaseProducer  # noqa: PLC0415
    from kafka2pc.sink.integration import Committer  # noqa: PLC0415
    from kafka2pc.transaction_control import TransactionControl  # noqa: PLC0415
    from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport  # noqa: PLC0415

    transport = ModelTransport(CoordinatorModel(transaction_version=2, two_phase_enabled=True), Faults())

    def prepare(txn_id: str, value: bytes) -> PreparedTransaction:
        producer = TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": txn_id}, two_phase_commit=True,
                                    transport=transport)
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("t", value, partition=0)
        return PreparedTransaction(txn_id, producer.prepare_transaction(), 0, 4)

    SinkStore(str(tmp_path)).save(SinkState("pfx"))
    monkeypatch.setattr(SinkDriver, "control", property(lambda _self: TransactionControl(transport)))
    monkeypatch.setattr("kafka2pc.spark.driver.move_window", lambda *_args: "window")
    options = SinkOptions.from_options({"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t",
                                        "checkpointLocation": str(tmp_path)}, streaming=False)
    winner, loser = Decision(4, [prepare("pfx-0-0", b"winner")]), prepare("pfx-0-1", b"loser")
    record = FileDecisionLog.record

    def racing_record(self, decision):
        if decision.transactions == (loser,):
            record(self, winner)  # the winner's record lands between the loser's look and its record
        record(self, decision)

    monkeypatch.setattr(FileDecisionLog, "record", racing_record)
    with pytest.raises(WriteConflictError):
        SinkDriver(options).commit_write([TaskMessage(0, 1, 1, 4, "pfx-0-1", str(loser.state), 2, 1, True)])
    monkeypatch.setattr(FileDecisionLog, "record", record)
    Committer(TransactionControl(transport), SinkDriver(options).decision_log).roll_forward(winner)
    assert transport.model.committed_records() == [b"winner"] and transport.model.open_transactions() == []


def test_a_write_deciding_its_own_checkpoint_never_aborts_another_writes_recorded_decision(tmp_path, monkeypatch):
    """Found by the second adversarial review: the cleanup after a decision recorded now kept nothing, so a second
    write on the location that recorded a later checkpoint meanwhile had its decided transaction aborted."""
    from kafka2pc import TwoPhaseProducer  # noqa: PLC0415
    from kafka2pc.sink.integration import Committer  # noqa: PLC0415
    from kafka2pc.transaction_control import TransactionControl  # noqa: PLC0415
    from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport  # noqa: PLC0415

    transport = ModelTransport(CoordinatorModel(transaction_version=2, two_phase_enabled=True), Faults())
    control = TransactionControl(transport)

    def prepare(txn_id: str, checkpoint: int) -> PreparedTransaction:
        producer = TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": txn_id}, two_phase_commit=True,
                                    transport=transport)
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("t", txn_id.encode(), partition=0)
        return PreparedTransaction(txn_id, producer.prepare_transaction(), int(txn_id.split("-")[1]), checkpoint)

    monkeypatch.setattr(SinkDriver, "control", property(lambda _self: control))
    SinkStore(str(tmp_path)).save(SinkState("pfx"))
    options = SinkOptions.from_options({"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t",
                                        "checkpointLocation": str(tmp_path)}, streaming=False)
    first, second = SinkDriver(options), SinkDriver(options)
    mine, theirs = prepare("pfx-0-0", 5), Decision(6, [prepare("pfx-1-0", 6)])
    move = SinkDriver._move_window

    def the_other_write_records_meanwhile(self):
        if self is first and second.decision_log.decision(6) is None:
            second.decision_log.record(theirs)
        move(self)

    monkeypatch.setattr(SinkDriver, "_move_window", the_other_write_records_meanwhile)
    assert first.commit_write([TaskMessage(0, 0, 0, 5, "pfx-0-0", str(mine.state), 2, 1, True)]).decided_now
    Committer(control, second.decision_log).roll_forward(theirs)
    assert sorted(transport.model.committed_records()) == [b"pfx-0-0", b"pfx-1-0"]
