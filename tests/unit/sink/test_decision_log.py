import json

import pytest

from kafka2pc import PreparedTxnState
from kafka2pc.errors import DecisionConflictError, DecisionLogCorruptError
from kafka2pc.sink.integration import Decision, FileDecisionLog, PreparedTransaction


def decision(checkpoint: int, prefix: str = "job") -> Decision:
    txns = [PreparedTransaction(f"{prefix}-{s}-{checkpoint % 3}", PreparedTxnState(10 + s, checkpoint), s, checkpoint)
            for s in range(2)]
    return Decision(checkpoint, txns, {"attempt": "a1"})


def test_record_undone_done(tmp_path):
    log = FileDecisionLog(tmp_path, "job")
    assert log.undone() == [] and log.last_checkpoint() is None
    log.record(decision(1))
    log.record(decision(2))
    assert [d.checkpoint for d in log.undone()] == [1, 2]
    assert log.undone()[0] == decision(1)
    log.mark_done(1)
    assert [d.checkpoint for d in log.undone()] == [2]
    assert log.last_checkpoint() == 2
    assert log.decision(1).metadata == {"attempt": "a1"}
    assert not list(tmp_path.glob(".tmp-*"))  # atomic writes leave no temporaries


def test_corrupt_record_names_the_file(tmp_path):
    log = FileDecisionLog(tmp_path, "job")
    log.record(decision(1))
    path = tmp_path / f"{1:020d}.decision.json"
    path.write_text('{"format": "kafka2pc.decision/1", "prefix": "job", "checkp')
    with pytest.raises(DecisionLogCorruptError, match=str(path)):
        log.undone()


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda body: body.update(prefix="other"), "foreign record"),
    (lambda body: body.update(format="something/9"), "not a kafka2pc decision record"),
    (lambda body: body.update(checkpoint=7), "records checkpoint 7"),
    (lambda body: body["transactions"][0].update(state="garbage"), "unreadable"),
    (lambda body: body["transactions"][0].update(transactional_id="job-10-0-1"), "not an id of prefix"),
    (lambda body: body.pop("transactions"), "unreadable"),
])
def test_foreign_or_malformed_records_are_errors(tmp_path, mutate, message):
    log = FileDecisionLog(tmp_path, "job")
    log.record(decision(1))
    path = tmp_path / f"{1:020d}.decision.json"
    body = json.loads(path.read_text())
    mutate(body)
    path.write_text(json.dumps(body))
    with pytest.raises(DecisionLogCorruptError, match=message):
        log.undone()


def test_recording_an_id_of_another_prefix_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not an id of prefix"):
        FileDecisionLog(tmp_path, "job-1").record(decision(1, prefix="job-10"))


def test_prune_keeps_the_newest_done(tmp_path):
    log = FileDecisionLog(tmp_path, "job", retain_done=2)
    for checkpoint in range(1, 6):
        log.record(decision(checkpoint))
        log.mark_done(checkpoint)
    assert sorted(p.name for p in tmp_path.glob("*.decision.json")) == [f"{4:020d}.decision.json",
                                                                        f"{5:020d}.decision.json"]
    assert log.last_checkpoint() == 5
    with pytest.raises(ValueError):
        FileDecisionLog(tmp_path, "job", retain_done=0)


def test_unrelated_files_are_ignored(tmp_path):
    (tmp_path / "README").write_text("notes")
    (tmp_path / ".tmp-abc").write_text("half written")
    assert FileDecisionLog(tmp_path, "job").undone() == []


def test_a_recorded_decision_is_never_replaced(tmp_path):
    """Reproduced on Kafka 4.4.0: record(N) for a done N overwrote the decision while N.done stayed, so undone()
    omitted the new decision and recovery aborted its transactions. Now the same decision again is a no-op, and a
    different one is refused, done or not."""
    log = FileDecisionLog(tmp_path, "job")
    log.record(decision(1))
    log.record(decision(1))  # a replay of the same decision: nothing changes
    assert [d.checkpoint for d in log.undone()] == [1]
    replayed = Decision(1, decision(1).transactions, {"attempt": "a2"})
    with pytest.raises(DecisionConflictError, match="already recorded"):
        log.record(replayed)
    log.mark_done(1)
    with pytest.raises(DecisionConflictError, match="already recorded"):
        log.record(replayed)
    assert log.decision(1) == decision(1)
    assert log.undone() == []


def test_checkpoints_never_go_back(tmp_path):
    log = FileDecisionLog(tmp_path, "job", retain_done=1)
    for checkpoint in (1, 2, 3):
        log.record(decision(checkpoint))
        log.mark_done(checkpoint)
    assert log.decision(1) is None  # pruned: it cannot be told from a checkpoint never decided
    with pytest.raises(DecisionConflictError, match="below the last recorded checkpoint 3"):
        log.record(decision(1))
    log.record(decision(5))  # going forward, with gaps, is fine
    assert [d.checkpoint for d in log.undone()] == [5]


def test_transaction_version_round_trips(tmp_path):
    log = FileDecisionLog(tmp_path, "job")
    txn = PreparedTransaction("job-0-0", PreparedTxnState(4, 7, transaction_version=1), 0, 9)
    log.record(Decision(9, [txn]))
    assert log.decision(9).transactions[0].state.transaction_version == 1


def test_an_empty_transaction_is_never_handed_over():
    with pytest.raises(ValueError, match="never handed over"):
        PreparedTransaction("job-0-0", PreparedTxnState.empty(), 0, 1)


def test_an_operator_resolution_marks_a_stuck_decision_done_with_its_reason(tmp_path):
    log = FileDecisionLog(tmp_path, "job")
    log.record(decision(4))
    with pytest.raises(ValueError, match="needs a reason"):
        log.resolve(4, "  ")
    log.resolve(4, "transactions timed out without 2PC; input replayed by hand")
    assert log.undone() == [] and log.is_done(4)
    assert json.loads((tmp_path / f"{4:020d}.resolved.json").read_text())["resolutions"][0]["reason"].startswith(
        "transactions timed")


def test_resolving_for_replay_is_refused_where_a_replay_would_write_twice_or_never(tmp_path):
    """Found by the user-level review: replay=True was accepted on a checkpoint done by a normal commit (its rows
    would be written twice), and below the last checkpoint (its replay could never be recorded)."""
    from kafka2pc.errors import CommandRefusedError  # noqa: PLC0415

    log = FileDecisionLog(tmp_path, "job")
    log.record(decision(3))
    log.mark_done(3)
    with pytest.raises(CommandRefusedError, match="is done"):
        log.resolve(3, "wrong checkpoint", replay=True)
    log.record(decision(4))
    log.record(decision(5))
    with pytest.raises(CommandRefusedError, match="below the last recorded checkpoint 5"):
        log.resolve(4, "stuck", replay=True)
    assert [d.checkpoint for d in log.undone()] == [4, 5] and log.is_done(3)


def test_every_resolution_is_kept(tmp_path):
    log = FileDecisionLog(tmp_path, "job")
    log.record(decision(6))
    log.resolve(6, "lost: replaying", replay=True)
    log.record(decision(6))  # the replay's decision
    log.resolve(6, "stuck again")
    kept = json.loads((tmp_path / f"{6:020d}.resolved.json").read_text())["resolutions"]
    assert [(r["reason"], r["replay"], "abandoned" in r) for r in kept] == [("lost: replaying", True, True),
                                                                          ("stuck again", False, False)]


def test_an_empty_transaction_recorded_by_an_older_release_is_skipped(tmp_path):
    log = FileDecisionLog(tmp_path, "job")
    log.record(decision(2))
    path = tmp_path / f"{2:020d}.decision.json"
    body = json.loads(path.read_text())
    body["transactions"].append({"transactional_id": "job-5-0", "state": "", "subtask": 5, "checkpoint": 2})
    path.write_text(json.dumps(body))
    assert log.decision(2).transactions == decision(2).transactions


def test_two_committers_racing_to_record_one_checkpoint_never_both_win(tmp_path):
    """Second review F6: a zombie driver and its replacement recording the same checkpoint: one record wins, the
    other committer learns of it (DecisionConflictError), never a silent overwrite."""
    import threading  # noqa: PLC0415

    log = FileDecisionLog(tmp_path, "job")
    mine = decision(9)
    theirs = Decision(9, decision(9).transactions, {"attempt": "zombie"})
    barrier, outcomes = threading.Barrier(2), []

    def record(candidate):
        barrier.wait()
        try:
            log.record(candidate)
            outcomes.append("recorded")
        except DecisionConflictError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=record, args=(d,)) for d in (mine, theirs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(outcomes) == ["conflict", "recorded"]
    assert log.decision(9) in (mine, theirs)
