"""Recovery against the coordinator model: LISTING aborts only what it listed, a stuck decision does not stop the
rest, and a look that got no answer decides nothing."""

from __future__ import annotations

import pytest

from kafka2pc import TransactionOutcome, TwoPhaseProducer
from kafka2pc._core.messages import ProducerIdentity
from kafka2pc.errors import (
    BrokerUnavailableError,
    RecoveryIncompleteError,
    TransactionOutcomeUnknownError,
)
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, PreparedTransaction, recover
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport
from tests.model.support import TXN_ID, cluster, fate, prepared, producer


@pytest.mark.parametrize("version", [1, 2])
def test_listing_abort_is_conditional_on_what_was_listed(version):
    """Finding 4 of the core-correctness review. LISTING finds a lingering transaction; before its abort, a live writer
    takes the id over and prepares a transaction that gets decided. The abort, conditional on the listed producer id and
    epoch, must leave it be."""
    transport = cluster(version)
    control = TransactionControl(transport)
    lingering = prepared(transport, b"lingering")
    listed = control.describe(TXN_ID)
    assert listed is not None and listed.identity == ProducerIdentity.of(lingering)
    writer = producer(transport)
    writer.init_transactions()  # aborts the lingering one itself, and fences it
    writer.begin_transaction()
    writer.produce("t", b"decided", partition=0)
    decided = writer.prepare_transaction()
    assert control.abort_ongoing(TXN_ID, producer_id=listed.producer_id + 1) is None  # another producer id listed
    with pytest.raises(TransactionOutcomeUnknownError) as info:  # the abort of the listed (pid, epoch)
        control.abort(TXN_ID, lingering)
    assert info.value.other_pending == str(decided)  # seen, and left alone: the EndTxn named the listed epoch
    assert fate(transport, lingering) == "aborted"   # (the writer's own InitProducerId aborted it)
    assert fate(transport, decided) is None           # still open, untouched
    assert control.commit(TXN_ID, decided).outcome is TransactionOutcome.COMMITTED
    assert transport.model.committed_records() == [b"decided"]


def test_a_stuck_decision_does_not_stop_the_rest_of_recovery(tmp_path):
    """Review 8. A decided transaction the broker timed out (no 2PC) can never commit: recovery still rolls the other
    decisions forward and aborts what lingers, then says which checkpoint is stuck; an operator's resolution (recorded
    with its reason) unsticks it."""
    transport = ModelTransport(CoordinatorModel(transaction_version=2, two_phase_enabled=False), Faults())
    control = TransactionControl(transport)
    states = {}
    for txn_id in ("job-0-0", "job-1-0", "job-2-0"):
        p = TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": txn_id}, transport=transport)
        p.init_transactions()
        p.begin_transaction()
        p.produce("t", txn_id.encode(), partition=0)
        states[txn_id] = p.prepare_transaction()
    log = FileDecisionLog(tmp_path, "job")
    log.record(Decision(1, [PreparedTransaction("job-0-0", states["job-0-0"], 0, 1)]))
    log.record(Decision(2, [PreparedTransaction("job-1-0", states["job-1-0"], 1, 2)]))
    transport.model.time_out("job-0-0")  # decided, then lost: fallback mode, past transaction.timeout.ms
    with pytest.raises(RecoveryIncompleteError, match="checkpoint 1") as info:
        recover(control, "job", log)
    assert info.value.report.checkpoints_rolled_forward == (2,)
    assert info.value.report.aborted == ("job-2-0",)  # the undecided one, lingering: aborted all the same
    assert [d.checkpoint for d in log.undone()] == [1]
    log.resolve(1, "lost by timeout; replayed upstream")
    assert recover(control, "job", log).stuck == ()
    assert transport.model.committed_records() == [b"job-1-0"]


def test_a_lost_look_before_recording_decides_nothing_and_aborts_nothing(tmp_path):
    """Second review, F7."""
    transport = cluster(2)
    offered = [PreparedTransaction(TXN_ID, prepared(transport, b"x"), 0, 1)]
    transport.faults.failed_describes.append(True)
    with pytest.raises(BrokerUnavailableError, match="nothing was recorded"):
        Committer(TransactionControl(transport), FileDecisionLog(tmp_path, "app")).settle(1, offered)
    assert transport.model.open_transactions()  # still open, to be decided by a retry
