"""recover() and abort_open_transactions() against the coordinator model: roll every undone decision forward, then
abort what is open under the prefix and nothing else — engine-neutral, no broker needed."""

from __future__ import annotations

import logging

import attrs
import pytest

from kafka2pc import TwoPhaseProducer
from kafka2pc._core.messages import PREPARE_COMMIT, InitProducerId, TransactionListing
from kafka2pc.errors import CommandRefusedError, DecisionLogCorruptError, RecoveryIncompleteError
from kafka2pc.sink.integration import Decision, FileDecisionLog, PreparedTransaction, recover
from kafka2pc.sink.naming import TransactionalIdGrammar
from kafka2pc.sink.recovery import abort_open_transactions, resolve_for_replay
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport

logging.getLogger("kafka2pc").setLevel(logging.ERROR)


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def transport(request):
    return ModelTransport(CoordinatorModel(transaction_version=request.param, two_phase_enabled=True), Faults())


def broker_times_out(transport, txn: PreparedTransaction) -> None:
    """The coordinator's timeout aborts ``txn`` (fenced, as a broker without two-phase commit does)."""
    transport.model.fence_and_abort(transport.model.ids[txn.transactional_id])


def prepare(transport, txn_id: str, value: bytes, checkpoint: int = 1) -> PreparedTransaction:
    producer = TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": txn_id}, two_phase_commit=True,
                                transport=transport)
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("t", value, partition=0)
    subtask = int(txn_id.split("-")[-2]) if txn_id.count("-") >= 2 else 0
    return PreparedTransaction(txn_id, producer.prepare_transaction(), subtask, checkpoint)


def test_recovery_rolls_decisions_forward_and_aborts_the_rest_of_the_prefix(transport, tmp_path):
    log = FileDecisionLog(tmp_path, "job")
    decided = prepare(transport, "job-0-0", b"decided")
    log.record(Decision(1, [decided]))                      # recorded; the committer died before completing it
    prepare(transport, "job-1-0", b"undecided", checkpoint=2)  # prepared, never decided
    prepare(transport, "other-0-0", b"someone else's")         # another prefix: never touched
    prepare(transport, "job-10-0-0", b"a look-alike")          # not in the grammar of "job"
    report = recover(TransactionControl(transport), "job", log)
    assert report.checkpoints_rolled_forward == (1,) and report.rolled_forward == ("job-0-0",)
    assert report.aborted == ("job-1-0",)
    assert set(report.known_ids) == {"job-0-0", "job-1-0"}
    assert transport.model.committed_records() == [b"decided"]
    assert sorted(t.transactional_id for t in transport.model.open_transactions()) == ["job-10-0-0", "other-0-0"]
    assert log.is_done(1)


def test_a_decision_that_cannot_complete_is_reported_and_the_rest_still_recovers(transport, tmp_path):
    log = FileDecisionLog(tmp_path, "job")
    lost = prepare(transport, "job-0-0", b"lost")
    log.record(Decision(1, [lost]))
    transport.execute("job-0-0", InitProducerId(60_000, enable_2pc=True))  # a fresh init aborts the decided one
    prepare(transport, "job-1-0", b"lingering", checkpoint=2)
    with pytest.raises(RecoveryIncompleteError) as info:
        recover(TransactionControl(transport), "job", log)
    assert set(info.value.stuck) == {1} and info.value.report.aborted == ("job-1-0",)
    assert not log.is_done(1) and transport.model.open_transactions() == []


def test_a_corrupt_record_stops_recovery_before_anything_is_touched(transport, tmp_path):
    log = FileDecisionLog(tmp_path, "job")
    prepare(transport, "job-1-0", b"open")
    (tmp_path / f"{1:020d}.decision.json").write_text("{not json")
    with pytest.raises(DecisionLogCorruptError):
        recover(TransactionControl(transport), "job", log)
    assert [t.transactional_id for t in transport.model.open_transactions()] == ["job-1-0"]


def test_abort_open_transactions_keeps_what_it_is_told_to(transport):
    prepare(transport, "job-0-0", b"kept")
    prepare(transport, "job-1-0", b"aborted")
    aborted = abort_open_transactions(TransactionControl(transport), TransactionalIdGrammar("job"), keep=["job-0-0"])
    assert aborted == ["job-1-0"]
    assert [t.transactional_id for t in transport.model.open_transactions()] == ["job-0-0"]


def test_a_listed_transaction_that_is_completing_is_neither_looked_at_nor_aborted(transport):
    """A cleanup right after a commit lists the transactions it committed while their markers are being written
    (PrepareCommit): they are ending on their coordinator already, so no look and no abort is spent on them. The
    listing here says PrepareCommit of one that is still ongoing, to show it is taken at its word."""
    prepare(transport, "job-0-0", b"completing")
    prepare(transport, "job-1-0", b"open")
    listed = TransactionControl(transport).list(states=OPEN_STATES)
    looked_at: list[list[str]] = []

    class ListedAsCompleting(TransactionControl):
        def list(self, **_: object) -> list[TransactionListing]:
            return [attrs.evolve(entry, state=PREPARE_COMMIT) if entry.transactional_id == "job-0-0" else entry
                    for entry in listed]

        def describe_all(self, transactional_ids):
            looked_at.append(list(transactional_ids))
            return super().describe_all(transactional_ids)

    aborted = abort_open_transactions(ListedAsCompleting(transport), TransactionalIdGrammar("job"))
    assert aborted == ["job-1-0"] and looked_at == [["job-1-0"]]


@pytest.mark.parametrize("replay", [False, True], ids=["resolved-done", "resolved-for-replay"])
def test_a_lost_checkpoint_resolved_for_replay_is_written_by_its_replay(transport, tmp_path, replay):
    """The documented way out of a lost decision: resolve it, then replay the batch. Resolved as done, the replay is
    recognised as decided and aborted (its rows never written); resolved with replay=True (kafka2pc recover
    --resolve N --replay), the checkpoint is undecided again and the replay commits."""
    from kafka2pc.sink.integration import Committer  # noqa: PLC0415

    control = TransactionControl(transport)
    log = FileDecisionLog(tmp_path, "job")
    lost = prepare(transport, "job-0-0", b"first", checkpoint=2)
    log.record(Decision(2, [lost], {"write_versions": {"app": 2}}))
    broker_times_out(transport, lost)
    with pytest.raises(RecoveryIncompleteError):
        recover(control, "job", log)
    if replay:
        resolve_for_replay(control, log, 2, "its rows were lost; replaying batch 2")
    else:
        log.resolve(2, "its rows were lost")
    assert recover(control, "job", log).stuck == ()
    replayed = Committer(control, log).settle(2, [prepare(transport, "job-0-1", b"replayed", checkpoint=2)])
    assert replayed.decided_now is replay
    assert transport.model.committed_records() == ([b"replayed"] if replay else [])
    assert transport.model.open_transactions() == []
    assert (log.newest().checkpoint, dict(log.newest().metadata)) == ((2, {}) if replay else
                                                                      (2, {"write_versions": {"app": 2}}))


def test_a_checkpoint_with_a_committed_transaction_is_never_resolved_for_replay(transport, tmp_path):
    control = TransactionControl(transport)
    log = FileDecisionLog(tmp_path, "job")
    committed, lost = prepare(transport, "job-0-0", b"in", checkpoint=2), prepare(transport, "job-1-0", b"out", 2)
    log.record(Decision(2, [committed, lost]))
    broker_times_out(transport, lost)
    with pytest.raises(RecoveryIncompleteError):
        recover(control, "job", log)  # commits job-0-0, finds job-1-0 lost
    with pytest.raises(CommandRefusedError, match=r"job-0-0 [0-9:]+: committed"):
        resolve_for_replay(control, log, 2, "replay it")
    assert [d.checkpoint for d in log.undone()] == [2]  # nothing resolved: the replay would write b"in" twice


def test_resolving_for_replay_fences_a_committer_still_rolling_the_decision_forward(transport, tmp_path):
    """The operator abandons checkpoint 2 (one transaction lost, one still prepared) while a live driver is about to
    roll it forward (found by the adversarial review: the abandoned transaction committed, then its replay wrote the
    rows a second time): the still prepared one is aborted, and the late roll-forward commits nothing."""
    from kafka2pc.errors import TransactionLostError, TransactionOutcomeUnknownError  # noqa: PLC0415
    from kafka2pc.sink.integration import Committer  # noqa: PLC0415

    control = TransactionControl(transport)
    log = FileDecisionLog(tmp_path, "job")
    lost, pending = prepare(transport, "job-0-0", b"lost", 2), prepare(transport, "job-1-0", b"abandoned", 2)
    decision = Decision(2, [lost, pending])
    log.record(decision)
    broker_times_out(transport, lost)
    resolve_for_replay(control, log, 2, "replay it")
    with pytest.raises((TransactionLostError, TransactionOutcomeUnknownError)):  # v1: the abort's fence moved it on
        Committer(control, FileDecisionLog(tmp_path, "job")).roll_forward(decision)  # the live driver, too late
    replayed = Committer(control, log).settle(2, [prepare(transport, "job-0-1", b"replayed", checkpoint=2)])
    assert replayed.decided_now and transport.model.committed_records() == [b"replayed"]


def test_a_refused_replay_resolution_ends_nothing(transport, tmp_path):
    """Found by the second adversarial review: the transactions were aborted before the checks that then refused,
    leaving a decision half committed and half aborted (or a completable one aborted). Every refusal comes first."""
    control = TransactionControl(transport)
    log = FileDecisionLog(tmp_path, "job")
    done, open_ = prepare(transport, "job-0-0", b"a", 2), prepare(transport, "job-1-0", b"b", 2)
    log.record(Decision(2, [done, open_]))
    control.commit(done.transactional_id, done.state)  # the committer got this far, then died
    with pytest.raises(CommandRefusedError, match="committed"):
        resolve_for_replay(control, log, 2, "replay it")
    all_open = prepare(transport, "job-2-0", b"c", 3)
    log.record(Decision(3, [all_open]))
    with pytest.raises(CommandRefusedError, match="below the last recorded checkpoint 3"):
        resolve_for_replay(control, log, 2, "replay it")
    with pytest.raises(CommandRefusedError, match="is not lost"):
        resolve_for_replay(control, log, 3, "replay it")
    report = recover(control, "job", log)  # nothing was ended: both decisions still complete
    assert report.checkpoints_rolled_forward == (2, 3) and report.stuck == ()
    assert sorted(transport.model.committed_records()) == [b"a", b"b", b"c"]


def test_a_replay_resolution_interrupted_after_its_aborts_is_finished_by_running_it_again(transport, tmp_path,
                                                                                           monkeypatch):
    """Found by the second adversarial review: on protocol v1 the aborts' fence leaves the transactions' fate
    unreadable, so a rerun after an interruption refused for good. The pending note taken before the aborts lets
    the rerun finish."""
    from kafka2pc.errors import StorageUnavailableError  # noqa: PLC0415

    control = TransactionControl(transport)
    log = FileDecisionLog(tmp_path, "job")
    lost, pending = prepare(transport, "job-0-0", b"lost", 2), prepare(transport, "job-1-0", b"open", 2)
    log.record(Decision(2, [lost, pending]))
    broker_times_out(transport, lost)
    resolve = FileDecisionLog.resolve

    def interrupted(self, *args, **kwargs):
        monkeypatch.setattr(FileDecisionLog, "resolve", resolve)
        raise StorageUnavailableError("the store did not answer (test)")

    monkeypatch.setattr(FileDecisionLog, "resolve", interrupted)
    with pytest.raises(StorageUnavailableError):
        resolve_for_replay(control, log, 2, "replay it")
    resolve_for_replay(control, log, 2, "replay it, again")
    assert log.decision(2) is None and transport.model.open_transactions() == []
