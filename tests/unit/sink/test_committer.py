"""Committer.settle against the coordinator model: a checkpoint's outcome holds however often it is offered (the
replays a Spark driver sees), and nothing is recorded unless every offered transaction is still pending."""

from __future__ import annotations

import logging

import pytest

from kafka2pc import TwoPhaseProducer
from kafka2pc._core.messages import InitProducerId
from kafka2pc.errors import TransactionLostError, TransactionOutcomeUnknownError
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, PreparedTransaction
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport

logging.getLogger("kafka2pc").setLevel(logging.ERROR)


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def world(request, tmp_path):
    transport = ModelTransport(CoordinatorModel(transaction_version=request.param, two_phase_enabled=True), Faults())
    committer = Committer(TransactionControl(transport), FileDecisionLog(tmp_path, "job"))
    return transport, committer


def prepare(transport: ModelTransport, txn_id: str, checkpoint: int, value: bytes) -> PreparedTransaction:
    p = TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": txn_id}, two_phase_commit=True,
                         transport=transport)
    p.init_transactions()
    p.begin_transaction()
    p.produce("t", value, partition=0)
    state = p.prepare_transaction()
    subtask, _ = (int(x) for x in txn_id.split("-")[1:])
    return PreparedTransaction(txn_id, state, subtask, checkpoint)


def test_a_checkpoint_is_decided_once_and_replays_are_aborted(world):
    transport, committer = world
    first = [prepare(transport, "job-0-0", 5, b"a0"), prepare(transport, "job-1-0", 5, b"a1")]
    settled = committer.settle(5, first, {"attempt": 1})
    assert settled.decided_now and settled.committed == tuple(first)
    replay = [prepare(transport, "job-0-1", 5, b"b0"), prepare(transport, "job-1-1", 5, b"b1")]
    again = committer.settle(5, replay, {"attempt": 2})
    assert not again.decided_now and sorted(again.aborted) == ["job-0-1", "job-1-1"]
    assert sorted(transport.model.committed_records()) == [b"a0", b"a1"]
    assert transport.model.open_transactions() == []


def test_a_replay_after_a_crash_between_record_and_completion_completes_the_record(world):
    transport, committer = world
    decided = [prepare(transport, "job-0-0", 3, b"decided")]
    recorded = Decision(3, decided)
    committer.decision_log.record(recorded)  # ... and the driver dies before completing it
    replay = [prepare(transport, "job-0-1", 3, b"replay")]
    settled = committer.settle(3, replay)
    assert settled.committed == recorded.transactions and settled.aborted == ("job-0-1",)
    assert transport.model.committed_records() == [b"decided"]
    assert committer.decision_log.is_done(3)


def test_an_old_checkpoint_whose_record_was_pruned_is_treated_as_decided(world, tmp_path):
    transport, _ = world
    committer = Committer(TransactionControl(transport), FileDecisionLog(tmp_path / "pruned", "job", retain_done=1))
    for checkpoint in (1, 2):
        committer.settle(checkpoint, [prepare(transport, f"job-0-{checkpoint}", checkpoint, f"c{checkpoint}".encode())])
    late = committer.settle(1, [prepare(transport, "job-0-9", 1, b"late replay")])
    assert late.aborted == ("job-0-9",) and late.committed == ()
    assert transport.model.committed_records() == [b"c1", b"c2"]


def test_nothing_is_recorded_when_an_offered_transaction_is_gone(world):
    transport, committer = world
    offered = [prepare(transport, "job-0-0", 8, b"x"), prepare(transport, "job-1-0", 8, b"y")]
    transport.execute("job-1-0", InitProducerId(60_000, enable_2pc=True))  # a zombie's init aborts one of them
    with pytest.raises(TransactionLostError, match="nothing was recorded"):
        committer.settle(8, offered)
    assert committer.decision_log.decision(8) is None
    assert transport.model.committed_records() == [] and transport.model.open_transactions() == []


def test_a_replay_is_aborted_even_when_the_recorded_decision_is_stuck(world):
    """Second review F5: the replay's own transactions are aborted first, so they never linger (pinning the LSO)
    while the recorded decision waits for an operator."""
    transport, committer = world
    recorded = Decision(4, [prepare(transport, "job-0-0", 4, b"decided")])
    committer.decision_log.record(recorded)
    transport.execute("job-0-0", InitProducerId(60_000, enable_2pc=True))  # someone aborts the decided one
    replay = [prepare(transport, "job-0-1", 4, b"replay")]
    with pytest.raises((TransactionLostError, TransactionOutcomeUnknownError)):
        committer.settle(4, replay)
    assert transport.model.open_transactions() == []
