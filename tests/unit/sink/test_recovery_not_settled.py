"""Recovery when a decided transaction is not settled yet (its markers still being written, an error that says
nothing about it): the rest of recovery goes on, and an operator is never invited to resolve a decision that can
still commit (an adversarial review of the errors change found both)."""

from __future__ import annotations

import logging

import pytest

from kafka2pc._core import codes
from kafka2pc._core.messages import EndTxn, ObservedTransaction, ProducerIdentity
from kafka2pc.errors import (
    AuthorizationError,
    CommandRefusedError,
    RecoveryIncompleteError,
    TransactionLostError,
    TransactionNotSettledError,
)
from kafka2pc.sink.integration import Decision, FileDecisionLog, PreparedTransaction, recover
from kafka2pc.sink.recovery import resolve_as_done
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import NOT_ENOUGH_REPLICAS, CoordinatorModel
from tests.model.scripted import Scripted, fate, prepare

logging.getLogger("kafka2pc").setLevel(logging.CRITICAL)


def test_a_decision_whose_markers_are_stuck_does_not_stop_the_later_decisions_or_listing(tmp_path):
    """Fallback mode: decision 1's transaction was aborted by the broker (timeout) and its abort markers cannot be
    written yet (PrepareAbort). Recovery must still commit decision 2 and abort the lingering transaction in the same
    run; otherwise decision 2 waits until the broker times it out too (a decided checkpoint lost), and the lingering
    one pins the LSO."""
    transport = Scripted(CoordinatorModel(transaction_version=2, two_phase_enabled=False))
    control = TransactionControl(transport)
    first = prepare(transport, "job-0-0", b"d1", two_phase=False)
    second = prepare(transport, "job-1-0", b"d2", two_phase=False)
    lingering = prepare(transport, "job-2-0", b"undecided", two_phase=False)
    log = FileDecisionLog(tmp_path, "job")
    log.record(Decision(1, [PreparedTransaction("job-0-0", first, 0, 1)]))
    log.record(Decision(2, [PreparedTransaction("job-1-0", second, 1, 2)]))
    transport.model.time_out("job-0-0")
    transport.end_codes["job-0-0"] = [codes.INVALID_TXN_STATE]
    transport.looks["job-0-0"] = ObservedTransaction("PrepareAbort", first.producer_id, first.epoch + 1)

    with pytest.raises(TransactionNotSettledError):  # retriable: decision 1 is tried again next time
        recover(control, "job", log)
    assert fate(transport, "job-1-0", second) == "committed"
    assert fate(transport, "job-2-0", lingering) == "aborted"
    assert transport.model.committed_records() == [b"d2"]

    del transport.looks["job-0-0"]  # the partition is back: decision 1's abort is written; it was lost
    with pytest.raises(RecoveryIncompleteError) as incomplete:
        recover(control, "job", log)
    assert list(incomplete.value.stuck) == [1]
    assert isinstance(incomplete.value.stuck[1], TransactionLostError)


def test_a_transaction_that_may_still_commit_is_never_hidden_behind_a_lost_one(tmp_path):
    """Decision 1 holds A (timed out: lost) and B (its EndTxn answered an error three times: not settled, still
    committable). Reporting only A as stuck invites `--resolve`, after which LISTING aborts B, decided. Recovery must
    say B is not settled (retriable), commit B on the next run, and only then report A; and a plain resolve must
    refuse while B is open."""
    transport = Scripted(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    control = TransactionControl(transport)
    a = prepare(transport, "job-0-0", b"a", two_phase=False)
    b = prepare(transport, "job-1-0", b"b")
    log = FileDecisionLog(tmp_path, "job")
    log.record(Decision(1, [PreparedTransaction("job-0-0", a, 0, 1), PreparedTransaction("job-1-0", b, 1, 1)]))
    transport.model.time_out("job-0-0")
    transport.end_codes["job-1-0"] = [NOT_ENOUGH_REPLICAS] * 3

    with pytest.raises(TransactionNotSettledError) as not_settled:
        recover(control, "job", log)
    assert not_settled.value.transactional_id == "job-1-0"
    with pytest.raises(CommandRefusedError, match="'job-1-0' is still open and can still commit"):
        resolve_as_done(control, log, 1, "job-0-0 was lost by timeout")
    assert fate(transport, "job-1-0", b) is None

    with pytest.raises(RecoveryIncompleteError) as incomplete:  # B commits now; A is what is left
        recover(control, "job", log)
    assert fate(transport, "job-1-0", b) == "committed"
    assert isinstance(incomplete.value.stuck[1], TransactionLostError)
    resolve_as_done(control, log, 1, "job-0-0 was lost by timeout")
    assert recover(control, "job", log).checkpoints_rolled_forward == ()
    assert fate(transport, "job-1-0", b) == "committed" and transport.model.committed_records() == [b"b"]
    assert not any(isinstance(c, EndTxn) and not c.commit and c.transaction == ProducerIdentity.of(b)
                   for c in transport.sent)


def test_a_decision_recorded_while_recovery_waits_keeps_its_ids_from_listing(tmp_path):
    """Recovery must not run beside a live committer of the prefix (docs/recovery.md), but waiting on an unsettled
    end makes it long: a decision recorded meanwhile is read again before LISTING, which then leaves it alone."""
    transport = Scripted(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    control = TransactionControl(transport)
    a, b = prepare(transport, "job-0-0", b"a"), prepare(transport, "job-1-0", b"b")
    log = FileDecisionLog(tmp_path, "job")
    log.record(Decision(1, [PreparedTransaction("job-0-0", a, 0, 1)]))
    transport.end_codes["job-0-0"] = [NOT_ENOUGH_REPLICAS] * 3
    later = Decision(2, [PreparedTransaction("job-1-0", b, 1, 2)])
    transport.after[("job-0-0", EndTxn, 1)] = lambda: log.record(later)
    with pytest.raises(TransactionNotSettledError):
        recover(control, "job", log)
    assert fate(transport, "job-1-0", b) is None  # still open, decided: not aborted
    recover(control, "job", log)
    assert fate(transport, "job-0-0", a) == fate(transport, "job-1-0", b) == "committed"


def test_a_fatal_error_of_a_decision_is_not_hidden_behind_a_not_settled_one(tmp_path):
    """Only a lost or unknown transaction gives way to a not-settled one: a missing ACL (AuthorizationError) still
    stops recovery loudly, as it needs an operator."""
    transport = Scripted(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    a, b = prepare(transport, "job-0-0", b"a"), prepare(transport, "job-1-0", b"b")
    log = FileDecisionLog(tmp_path, "job")
    log.record(Decision(1, [PreparedTransaction("job-0-0", a, 0, 1), PreparedTransaction("job-1-0", b, 1, 1)]))
    transport.end_codes["job-0-0"] = [codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED]
    transport.end_codes["job-1-0"] = [NOT_ENOUGH_REPLICAS] * 3
    with pytest.raises(AuthorizationError):
        recover(TransactionControl(transport), "job", log)
