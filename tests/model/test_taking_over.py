"""Taking a transactional id over against the coordinator model: a successor's transactions never share an
identity with a predecessor's, and a producer without an identity never aborts a successor's decided transaction."""

from __future__ import annotations

import pytest

from kafka2pc import PreparedTxnState, TransactionOutcome
from kafka2pc._core.messages import DescribeTransaction, InitProducerId
from kafka2pc.errors import (
    ProducerFencedError,
    TransactionOutcomeUnknownError,
)
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport
from tests.model.support import TXN_ID, cluster, committed, fate, prepared, producer


class _AfterFirstLook(ModelTransport):
    """A transport that runs ``meanwhile`` (once set) once, right after the next DescribeTransactions it answers."""

    def __init__(self, model: CoordinatorModel):
        super().__init__(model, Faults())
        self.meanwhile = None

    def execute(self, transactional_id, command):
        answer = super().execute(transactional_id, command)
        if isinstance(command, DescribeTransaction) and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
        return answer


def test_v1_successor_transactions_never_reuse_a_predecessor_epoch():
    """Finding 2 of the core-correctness review. Before: the successor's single InitProducerId bump put its first
    transaction at e + 1, where its abort (CompleteAbort at e + 1) made the predecessor's committed transaction e look
    aborted: TransactionLostError, and an application resending on "lost" duplicates."""
    transport = cluster(1)
    first = producer(transport)
    first.init_transactions()
    first.begin_transaction()
    first.produce("t", b"committed-once", partition=0)
    committed = first.prepare_transaction()
    assert first.complete_transaction(committed) is TransactionOutcome.COMMITTED
    successor = producer(transport)
    successor.init_transactions(keep_prepared_txn=True)
    successor.begin_transaction()
    successor.produce("t", b"aborted", partition=0)
    successor.abort_transaction()
    assert successor.producer_id_and_epoch[1] >= committed.epoch + 2
    late = producer(transport)
    late.init_transactions(keep_prepared_txn=True)
    with pytest.raises(TransactionOutcomeUnknownError):  # never "lost", never "aborted": it did commit
        late.complete_transaction(committed)
    assert fate(transport, committed) == "committed"


def test_epoch_exhaustion_never_hides_a_commit():
    """Finding 3 of the core-correctness review. Before: an EndTxn at epoch 32766 rotated the producer id and the
    committed transaction was reported as nothing pending / lost. Every transaction here is confirmed committed right
    after, across the rotation."""
    transport = cluster(2, first_epoch=32758)
    control = TransactionControl(transport)
    p = producer(transport)
    p.init_transactions()
    producer_ids = set()
    for index in range(12):
        p.begin_transaction()
        p.produce("t", f"r{index}".encode(), partition=0)
        state = p.prepare_transaction()
        assert state.epoch <= 32765
        producer_ids.add(state.producer_id)
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED    # and again: still known
        assert control.commit(TXN_ID, state).outcome is TransactionOutcome.COMMITTED  # by the committer too
    assert len(producer_ids) == 2  # the producer id rotated once, before a transaction, never under one
    assert transport.model.committed_records() == [f"r{i}".encode() for i in range(12)]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("how", ["nothing kept", "resumed and completed"])
def test_a_producer_without_an_identity_never_aborts_a_successors_decided_transaction(version, how):
    """A recovers at the protocol level (keep_prepared_txn=True where the broker cannot keep, so no InitProducerId):
    either nothing was open, or it completes the transaction it resumed. Either way it has no producer id of its own. B
    takes the id over, prepares, and the decision is recorded. A (a zombie) begins: a fresh InitProducerId would abort
    B's transaction. A looks first and, seeing a transaction it does not hold, sends nothing."""
    transport = ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=False), Faults())
    lingering = prepared(transport, b"lingering") if how == "resumed and completed" else None
    a = producer(transport)
    assert a.init_transactions(keep_prepared_txn=True) == lingering
    if lingering is not None:
        assert a.complete_transaction(PreparedTxnState.empty()) is TransactionOutcome.ABORTED
    b = producer(transport)
    b.init_transactions(keep_prepared_txn=True)
    b.begin_transaction()
    b.produce("t", b"decided", partition=0)
    decided = b.prepare_transaction()
    with pytest.raises(ProducerFencedError, match="does not hold"):
        a.begin_transaction()
    assert b.complete_transaction(decided) is TransactionOutcome.COMMITTED
    assert transport.model.committed_records() == [b"decided"]


@pytest.mark.parametrize("version", [1, 2])
def test_a_producer_without_an_identity_takes_the_id_over_with_a_fresh_init_after_looking(version):
    """Nothing open on an id in use: A's first begin looks, then sends a fresh InitProducerId (never a bump of the
    identity it only saw, see the next test); on v1 its second bump is its own, guarded. Its transactions commit."""
    transport = ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=False), Faults())
    committed(transport, b"earlier")
    since = len(transport.sent)
    a = producer(transport)
    a.init_transactions(keep_prepared_txn=True)
    a.begin_transaction()
    a.produce("t", b"a", partition=0)
    assert a.complete_transaction(a.prepare_transaction()) is TransactionOutcome.COMMITTED
    inits = [c for c in transport.sent[since:] if isinstance(c, InitProducerId)]
    assert [c.expected is None for c in inits] == [True] + [False] * (version == 1)
    assert transport.model.committed_records() == [b"earlier", b"a"]


@pytest.mark.parametrize("ending", ["A commits", "A aborts"])
@pytest.mark.parametrize("version", [1, 2])
def test_two_takeovers_from_one_look_never_share_an_identity(version, ending):
    """Review 4. Review finding: A and B (no identity of their own) both look at the idle id; B takes it over, then A's
    bump of the identity it saw arrives. Kafka answers a bump from the epoch just bumped from as a retry: before the fix
    A got B's new epoch, A's undecided records went into B's decided transaction, and A's abort aborted it. Now A's
    fresh InitProducerId fences B instead: B can neither write nor prepare, and nothing of it is decided."""
    model = CoordinatorModel(transaction_version=version, two_phase_enabled=False)
    committed(ModelTransport(model, Faults()), b"earlier")
    b = producer(ModelTransport(model, Faults()))
    b.init_transactions(keep_prepared_txn=True)
    hooked = _AfterFirstLook(model)
    a = producer(hooked)
    a.init_transactions(keep_prepared_txn=True)
    hooked.meanwhile = b.begin_transaction  # B takes the id over between A's look and A's InitProducerId
    a.begin_transaction()
    assert b.producer_id_and_epoch != a.producer_id_and_epoch
    with pytest.raises(ProducerFencedError):
        b.produce("t", b"B", partition=0)
        b.prepare_transaction()
    a.produce("t", b"A", partition=1)
    if ending == "A commits":
        assert a.complete_transaction(a.prepare_transaction()) is TransactionOutcome.COMMITTED
        assert model.committed_records() == [b"earlier", b"A"]
    else:
        a.abort_transaction()
        assert model.committed_records() == [b"earlier"]
    assert [t.fate for t in model.txns if b"B" in t.records] in ([], ["aborted"])
