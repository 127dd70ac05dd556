"""Ending a transaction exactly (the core's Completion, through the producer and TransactionControl) against the
coordinator model: a decided commit is retried, never turned into an abort; an abort never hides a commit."""

from __future__ import annotations

import pytest

from kafka2pc import PreparedTxnState, TransactionOutcome
from kafka2pc._core.messages import DescribeTransaction, EndTxn, InitProducerId, ProducerIdentity
from kafka2pc._core.states import State
from kafka2pc.errors import (
    BrokerUnavailableError,
    TransactionLostError,
    TransactionNotSettledError,
    TransactionOutcomeUnknownError,
    UnsupportedByBrokerError,
)
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport
from tests.model.support import TXN_ID, cluster, fate, prepared, producer


@pytest.mark.parametrize("version", [1, 2])
def test_a_resumed_commit_that_timed_out_is_retried_not_aborted(version):
    """Finding 1 of the core-correctness review."""
    transport = cluster(version)
    decided = prepared(transport, b"a", b"b")
    successor = producer(transport)
    assert successor.init_transactions(keep_prepared_txn=True) == decided
    transport.faults.dropped_requests.append(True)  # the EndTxn never arrives; the call times out
    with pytest.raises(BrokerUnavailableError):
        successor.complete_transaction(decided)
    assert successor.state is State.COMMITTING
    successor.commit_transaction()  # the retry: the same EndTxn under the resumed producer id and epoch
    successor.begin_transaction()   # its InitProducerId comes only now, after the commit
    successor.produce("t", b"c", partition=0)
    successor.commit_transaction()
    assert fate(transport, decided) == "committed"
    assert transport.model.committed_records() == [b"a", b"b", b"c"]


def test_complete_transaction_reports_a_commit_even_if_re_initialisation_would_fail():
    """Finding 5 of the core-correctness review. Before: after committing a resumed transaction the producer
    re-initialised at once, and a failure there made complete_transaction raise after the commit had succeeded."""
    transport = cluster(2)
    decided = prepared(transport, b"x")
    successor = producer(transport)
    successor.init_transactions(keep_prepared_txn=True)
    transport.model.two_phase_enabled = False  # any InitProducerId with Enable2Pc would now be refused
    assert successor.complete_transaction(decided) is TransactionOutcome.COMMITTED
    assert fate(transport, decided) == "committed"
    assert not any(isinstance(c, InitProducerId) for c in transport.sent[-2:])


def test_commit_of_a_timed_out_transaction_is_lost_without_2pc():
    """Finding 5 of the core-correctness review."""
    transport = ModelTransport(CoordinatorModel(transaction_version=1, two_phase_enabled=False), Faults())
    decided = prepared(transport, b"late")
    transport.model.time_out(TXN_ID)
    with pytest.raises(TransactionLostError, match="the broker aborted it"):
        TransactionControl(transport).commit(TXN_ID, decided)


def test_aborting_a_bare_handle_never_hides_a_v1_commit_after_an_upgrade():
    """Second review, F3. A v1 transaction commits; the cluster moves to transaction.version=2; an abort of its bare
    "pid:epoch" must not be sent as EndTxn v5 (accepted as an empty abort at the current epoch, it would read as
    "aborted")."""
    transport = cluster(1)
    p = producer(transport)
    p.init_transactions()
    p.begin_transaction()
    p.produce("t", b"decided-row", partition=0)
    state = p.prepare_transaction()
    assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
    transport.model.transaction_version = 2
    bare = PreparedTxnState.parse(str(state))
    control = TransactionControl(transport, transaction_version=2)
    try:
        settled = control.abort(TXN_ID, bare)
        assert settled.outcome is TransactionOutcome.COMMITTED
    except TransactionOutcomeUnknownError:
        pass  # also honest: under v1 it is its commit, under v2 it never ran
    assert fate(transport, state) == "committed"
    assert all(not (isinstance(c, EndTxn) and c.transaction_version == 2 and not c.commit) for c in transport.sent)


def test_an_abort_of_a_bare_handle_on_v2_ends_it_with_a_bump_when_it_is_ongoing():
    transport = cluster(2)
    a = producer(transport)
    a.init_transactions()
    a.begin_transaction()
    a.produce("t", b"x", partition=0)
    a.flush()
    listed = ProducerIdentity(*a.producer_id_and_epoch)
    since = len(transport.sent)
    settled = TransactionControl(transport).abort(TXN_ID, listed.state())
    assert settled.outcome is TransactionOutcome.ABORTED
    ends = [c for c in transport.sent[since:] if isinstance(c, EndTxn)]
    assert ends == [EndTxn(listed, False, 2, guarded_by_look=True)]
    assert transport.model.ids[TXN_ID].epoch == listed.epoch + 1


@pytest.mark.parametrize("acted", [True, False])
def test_an_end_answered_with_an_error_that_says_nothing_is_settled_by_what_the_coordinator_holds(acted):
    """Before, such an answer raised KafkaProtocolError (a FatalError) and left the producer COMMITTING. Now the
    coordinator is asked: the end landed (committed), or it did not and is sent again (committed too)."""
    transport = cluster(2)
    decided = prepared(transport, b"a")
    successor = producer(transport)
    assert successor.init_transactions(keep_prepared_txn=True) == decided
    transport.faults.end_errors.append("acted" if acted else "refused")
    before = len(transport.sent)
    assert successor.complete_transaction(decided) is TransactionOutcome.COMMITTED
    assert fate(transport, decided) == "committed" and transport.model.committed_records() == [b"a"]
    assert [type(c) for c in transport.sent[before:]] == \
        ([EndTxn, DescribeTransaction] if acted else [EndTxn, DescribeTransaction, EndTxn])
    assert successor.state is State.RECOVERED_IDLE  # the model resumes at the protocol level (no keepPreparedTxn)


def test_an_end_that_stays_unsettled_keeps_the_decision_and_says_to_retry():
    transport = cluster(2)
    decided = prepared(transport, b"a")
    successor = producer(transport)
    assert successor.init_transactions(keep_prepared_txn=True) == decided
    transport.faults.end_errors.extend(["refused"] * 3)
    with pytest.raises(TransactionNotSettledError) as raised:
        successor.complete_transaction(decided)
    assert raised.value.retriable() and not raised.value.fatal()
    assert successor.state is State.COMMITTING and fate(transport, decided) is None
    assert successor.complete_transaction(decided) is TransactionOutcome.COMMITTED


def test_a_fatal_error_before_the_core_runs_still_leaves_the_producer_fatal():
    """init_transactions reads the cluster's versions first; a broker that cannot say is a FatalError, and the
    producer is FATAL_ERROR with it (before, it stayed UNINITIALIZED)."""
    class TooOld(ModelTransport):
        def cluster_facts(self):
            raise UnsupportedByBrokerError("the broker has no ApiVersions for DescribeFeatures")

    young = TooOld(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    lonely = producer(young)
    with pytest.raises(UnsupportedByBrokerError):
        lonely.init_transactions()
    assert lonely.state is State.FATAL_ERROR
