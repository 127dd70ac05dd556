"""Adversarial review of f7fc1b3 (issue 32, part 4): the oldest-open gauge's start times, read by LISTING.

``abort_open_transactions`` (recovery's LISTING and the Spark driver's cleanup after every batch and every abort)
now calls ``sink.recovery.open_since`` for every id it leaves open that the process did not know yet: one
``TransactionControl.describe_full`` each, one after the other, each under the control's whole resend budget
(``timeout_s``, 60 s by default). Its ids are exactly the ones whose abort just failed (the coordinator did not
answer) and the ones kept for an undone decision. Each failed on f7fc1b3; the fix counts what a listing finds from
when it found it, with no DescribeTransactions."""

from __future__ import annotations

import logging

import pytest

from kafka2pc._core.messages import DescribeTransaction
from kafka2pc.errors import BrokerUnavailableError
from kafka2pc.sink.naming import TransactionalIdGrammar
from kafka2pc.sink.recovery import abort_open_transactions
from kafka2pc.transaction_control import TransactionControl

from .coordinator import GIVE_UP_S, CoordinatorModel, Faults, ModelTransport
from .scripted import prepare as scripted_prepare

logging.getLogger("kafka2pc").setLevel(logging.CRITICAL)


class Counting(ModelTransport):
    """The model, telling DescribeTransactions sent on their own (``serial``) from those sent in a concurrent round."""

    def __init__(self, model: CoordinatorModel, faults: Faults | None = None):
        super().__init__(model, faults)
        self.serial = 0
        self._in_round = False

    def execute(self, transactional_id, command):
        if isinstance(command, DescribeTransaction) and not self._in_round:
            self.serial += 1
        return super().execute(transactional_id, command)

    def execute_all(self, commands):
        self._in_round = True
        try:
            return super().execute_all(commands)
        finally:
            self._in_round = False


def open_ids(transport: ModelTransport, prefix: str, n: int) -> list[str]:
    ids = [f"{prefix}-{i}-0" for i in range(n)]
    for txn_id in ids:
        scripted_prepare(transport, txn_id, txn_id.encode())  # prepared, never decided: the writer died
    return ids


def test_a_listing_whose_aborts_got_no_answer_fails_without_a_describe_per_id_first():
    """Scenario: the coordinator of a prefix's ids stops answering (a broker killed, a partition without leader) while
    recovery, or the driver's cleanup after a batch, aborts what LISTING found. abort_all_ongoing's one round of
    DescribeTransactions gets no answer within the budget (real: timeout_s, 60 s, concurrently for all ids). Then,
    before raising, the gauge asks DescribeTransactions again for each of those ids, one after the other, each
    waiting the whole budget: N ids add N x 60 s (the model's clock: GIVE_UP_S each) before recovery can report.
    Before f7fc1b3 it raised after the round."""
    transport = Counting(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    ids = open_ids(transport, "gone", 3)
    transport.faults.failed_describes = [True] * 6  # nothing answers DescribeTransactions now
    control = TransactionControl(transport)
    sent_before = sum(isinstance(c, DescribeTransaction) for c in transport.sent)
    start = transport.clock
    with pytest.raises(BrokerUnavailableError):
        abort_open_transactions(control, TransactionalIdGrammar("gone"))
    describes = sum(isinstance(c, DescribeTransaction) for c in transport.sent) - sent_before
    waited = transport.clock - start
    assert describes == len(ids), f"{describes} DescribeTransactions for {len(ids)} unanswered aborts"
    assert waited <= len(ids) * GIVE_UP_S, f"the listing waited {waited / GIVE_UP_S:g} budgets before reporting"


def test_the_start_times_of_kept_ids_are_read_in_one_round_not_one_request_each():
    """Recovery keeps every id of an undone decision (a crashed committer's, or one stuck) out of LISTING; the first
    LISTING that meets them (recovery at planning, on the Spark driver's critical path) now sends one
    DescribeTransactions per id, one after the other: a 200-partition decision is 200 round trips in a row (at 20 ms
    between regions, 4 s), where abort_all_ongoing describes its ids in one concurrent round."""
    transport = Counting(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    ids = open_ids(transport, "kept", 4)
    control = TransactionControl(transport)
    assert abort_open_transactions(control, TransactionalIdGrammar("kept"), keep=ids) == []
    assert transport.model.open_transactions() != []  # kept: still open, for the decision's roll-forward
    assert transport.serial <= 0, f"{transport.serial} DescribeTransactions sent one after the other for the gauge"
