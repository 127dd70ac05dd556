"""Fencing against the coordinator model: an aborted transaction's writer can never reopen it, and a fence never
lands on a newer transaction."""

from __future__ import annotations

import logging

import pytest

from kafka2pc import PreparedTxnState, TransactionOutcome, TwoPhaseProducer
from kafka2pc._core import codes
from kafka2pc._core.completion import Completion, Goal
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import InitProducerId, ProducerIdentity
from kafka2pc.errors import (
    BrokerUnavailableError,
    ProducerFencedError,
    TransactionAbortableError,
)
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport
from tests.model.support import TXN_ID, cluster, prepared, producer


def _writer_carries_on(writer: TwoPhaseProducer, partition: int) -> None:
    """The aborted transaction's writer, alive and unaware, writes on: to a partition it added before, or a new one
    (which on protocol v1 sends AddPartitionsToTxn at its epoch)."""
    try:
        writer.produce("t", b"after-abort", partition=partition)
        writer.flush()
    except (ProducerFencedError, TransactionAbortableError):
        pass


def test_a_fenced_v1_producer_never_aborts_its_successors_decided_transaction():
    """Review 1. A commits (its two bumps are due before its next transaction). B takes the id over, prepares, and the
    decision is recorded. A (a zombie) begins: its bump would be an InitProducerId that Kafka answers by aborting B's
    transaction (only the producer id is checked while one is Ongoing). A looks first, and sends nothing."""
    transport = cluster(1)
    a = producer(transport)
    a.init_transactions()
    a.begin_transaction()
    a.produce("t", b"a", partition=0)
    a.commit_transaction()
    b = producer(transport)
    b.init_transactions(keep_prepared_txn=True)
    b.begin_transaction()
    b.produce("t", b"b", partition=0)
    decided = b.prepare_transaction()
    with pytest.raises(ProducerFencedError, match="no bump was sent"):
        a.begin_transaction()
    assert b.complete_transaction(decided) is TransactionOutcome.COMMITTED
    assert transport.model.committed_records() == [b"a", b"b"]


def test_the_v1_fence_after_an_abort_never_lands_on_a_newer_transaction():
    """Review 2."""
    transport = cluster(1)
    lingering = prepared(transport, b"lingering")
    completion = Completion(TXN_ID, lingering, Goal.ABORT, 1, fence_after_abort=True)
    step = completion.start()
    step = completion.on_answer(transport.execute(TXN_ID, step))  # the abort; the fence comes next
    writer = producer(transport)  # meanwhile a new writer takes the id over and prepares a decided transaction
    writer.init_transactions()
    writer.begin_transaction()
    writer.produce("t", b"decided", partition=0)
    decided = writer.prepare_transaction()
    while not isinstance(step, Finished):
        step = completion.on_answer(transport.execute(TXN_ID, step))
    settled = step.result
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is True  # fenced by the new owner's init
    assert not any(isinstance(c, InitProducerId) and c.expected == ProducerIdentity.of(lingering)
                   for c in transport.sent)
    assert writer.complete_transaction(decided) is TransactionOutcome.COMMITTED
    assert transport.model.committed_records() == [b"decided"]


def test_a_v1_fence_that_failed_is_reported_not_hidden():
    """Review 3."""
    transport = cluster(1)
    lingering = prepared(transport, b"lingering")
    transport.faults.dropped_requests.extend([False, True])  # the abort arrives; the fence does not
    transport.faults.failed_describes.extend([False] + [True] * 100)  # and no look after it gets an answer
    settled = TransactionControl(transport).abort(TXN_ID, lingering)
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is False


def test_a_resumed_v1_abort_whose_fence_look_is_lost_looks_again_and_fences():
    """Review 4. Review finding: after a resumed v1 abort (EndTxn v4, no bump), ONE lost DescribeTransactions answer
    before the fence settled it as aborted-but-not-fenced, silently, and the writer reopened a transaction at the
    aborted epoch. Now it looks again (bounded) and fences; were every look to fail, the producer logs a warning."""
    transport = cluster(1)
    held = prepared(transport, b"w1")  # its writer lives on, unaware
    recovering = producer(transport)
    assert recovering.init_transactions(keep_prepared_txn=True) == held
    transport.faults.failed_describes.append(True)  # the fence's look gets no answer
    assert recovering.complete_transaction(PreparedTxnState.empty()) is TransactionOutcome.ABORTED
    identity = ProducerIdentity.of(held)
    assert transport.model.add_partitions(TXN_ID, identity, {("t", 1)}) != codes.NONE
    assert transport.model.ids[TXN_ID].epoch > identity.epoch


def test_an_unfenced_abort_is_logged_by_the_producer(caplog):
    """Review 4."""
    transport = cluster(1)
    held = prepared(transport, b"w1")
    recovering = producer(transport)
    assert recovering.init_transactions(keep_prepared_txn=True) == held
    transport.faults.failed_describes.extend([True] * 100)
    with caplog.at_level(logging.WARNING, logger="kafka2pc"):
        assert recovering.complete_transaction(PreparedTxnState.empty()) is TransactionOutcome.ABORTED
    assert "could not be fenced" in caplog.text


@pytest.mark.parametrize("fault", ["dropped_requests", "lost_answers"])
def test_a_v1_fence_without_an_answer_is_looked_up_and_completed(fault):
    transport = cluster(1)
    lingering = prepared(transport, b"lingering")
    getattr(transport.faults, fault).extend([False, True])  # the fence never arrives / its answer is lost
    settled = TransactionControl(transport).abort(TXN_ID, lingering)
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is True
    assert transport.model.ids[TXN_ID].epoch > lingering.epoch


def test_aborting_a_resumed_v1_transaction_fences_its_old_writer():
    """Second review, F4."""
    transport = cluster(1)
    writer = producer(transport)
    writer.init_transactions()
    writer.begin_transaction()
    writer.produce("t", b"part-1", partition=0)
    writer.flush()
    successor = producer(transport)
    assert successor.init_transactions(keep_prepared_txn=True) is not None
    assert successor.complete_transaction("") is TransactionOutcome.ABORTED  # nothing of it was decided
    with pytest.raises((ProducerFencedError, TransactionAbortableError)):  # the old writer cannot reopen it
        writer.produce("t", b"part-2", partition=1)
        writer.flush()
        writer.commit_transaction()
    assert transport.model.committed_records() == []


@pytest.mark.parametrize("partition", [0, 1])
@pytest.mark.parametrize("version", [1, 2])
def test_a_resumed_abort_whose_answer_is_lost_still_fences_its_writer(version, partition):
    """The model-based counterexample (v2, no 2PC): B resumes at the protocol level and aborts the writer A's open
    transaction; the abort's answer is lost. Before: B stopped there, with a v4 abort (no epoch bump) and no fence, so
    A's next write reopened a transaction at the aborted epoch: two transactions under one producer id and epoch, the
    second missing what A wrote before it, and A could commit it."""
    transport = ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=False), Faults())
    a = producer(transport)
    a.init_transactions()
    a.begin_transaction()
    a.produce("t", b"before-abort", partition=0)
    a.flush()
    open_identity = ProducerIdentity(*a.producer_id_and_epoch)
    b = producer(transport)
    assert b.init_transactions(keep_prepared_txn=True) == open_identity.state()
    transport.faults.lost_answers.append(True)
    try:
        assert b.complete_transaction(PreparedTxnState.empty()) is TransactionOutcome.ABORTED
    except BrokerUnavailableError:
        assert version == 2  # v5's abort bumps the epoch as it ends the transaction: nothing more to send
    _writer_carries_on(a, partition)
    identities = [t.identity for t in transport.model.txns]
    assert identities.count(open_identity) == 1, transport.model.txns
    with pytest.raises((ProducerFencedError, TransactionAbortableError)):
        a.commit_transaction()
    assert transport.model.committed_records() == []


@pytest.mark.parametrize("partition", [0, 1])
@pytest.mark.parametrize("version", [1, 2])
def test_a_listing_abort_whose_answer_is_lost_still_fences_the_writer(version, partition):
    transport = ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=False), Faults())
    a = producer(transport)
    a.init_transactions()
    a.begin_transaction()
    a.produce("t", b"before-abort", partition=0)
    a.flush()
    listed = ProducerIdentity(*a.producer_id_and_epoch)
    transport.faults.lost_answers.append(True)
    control = TransactionControl(transport)
    try:
        assert control.abort(TXN_ID, listed.state()).outcome is TransactionOutcome.ABORTED
    except BrokerUnavailableError:
        assert version == 2
    _writer_carries_on(a, partition)
    assert [t.identity for t in transport.model.txns].count(listed) == 1, transport.model.txns
    assert [t.fate for t in transport.model.txns] == ["aborted"]
