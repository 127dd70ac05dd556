"""After a committer ended the transaction a producer prepared: when the producer may go on without an
InitProducerId (identity_after_handover), and how the core moves (ProducerCore.continue_after_completion)."""

import itertools

import pytest

from kafka2pc._core.beginning import identity_after_handover
from kafka2pc._core.judge import MAX_TRANSACTION_EPOCH
from kafka2pc._core.messages import ObservedTransaction, ProducerIdentity
from kafka2pc._core.producer_core import ProducerCore
from kafka2pc._core.setup import TransactionSetup
from kafka2pc._core.states import Prepared, Ready, State
from kafka2pc.errors import TransactionStateError

HELD = ProducerIdentity(7, 4)
STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "PrepareEpochFence",
          "Dead")


@pytest.mark.parametrize("state", ["CompleteCommit", "CompleteAbort"])
def test_v2_goes_on_at_the_epoch_the_end_gave_the_id(state):
    assert identity_after_handover(HELD, ObservedTransaction(state, 7, 5), 2) == ProducerIdentity(7, 5)


def test_nothing_else_lets_it_go_on():
    """Every look but exactly the end of its own transaction (v2, same producer id, Complete* one epoch on)."""
    allowed = []
    for version, state, pid, lag in itertools.product((1, 2), STATES, (7, 8), range(-2, 4)):
        observed = ObservedTransaction(state, pid, HELD.epoch + lag)
        if identity_after_handover(HELD, observed, version) is not None:
            allowed.append((version, state, pid, lag))
    assert allowed == [(2, "CompleteCommit", 7, 1), (2, "CompleteAbort", 7, 1)]
    assert identity_after_handover(HELD, None, 2) is None  # the id expired: someone must take it over afresh


def test_an_init_since_the_end_stops_it_even_at_the_next_epoch():
    # InitProducerId leaves Empty: its caller holds that epoch (v1's bump, or a new producer's fresh init)
    assert identity_after_handover(HELD, ObservedTransaction("Empty", 7, 5), 2) is None


def test_never_at_an_epoch_whose_end_would_exhaust_it():
    last = ProducerIdentity(7, MAX_TRANSACTION_EPOCH - 1)
    assert identity_after_handover(last, ObservedTransaction("CompleteCommit", 7, MAX_TRANSACTION_EPOCH), 2) == \
        ProducerIdentity(7, MAX_TRANSACTION_EPOCH)
    beyond = ProducerIdentity(7, MAX_TRANSACTION_EPOCH)
    assert identity_after_handover(beyond, ObservedTransaction("CompleteCommit", 7, MAX_TRANSACTION_EPOCH + 1),
                                   2) is None


def _prepared_core(version=2, registered=True):
    core = ProducerCore("t")
    core.state = Prepared(TransactionSetup(version, True, 60_000), HELD, registered)
    return core


def test_the_core_goes_on_ready_without_any_request():
    core = _prepared_core()
    assert core.continue_after_completion(ObservedTransaction("CompleteCommit", 7, 5))
    assert core.state == Ready(TransactionSetup(2, True, 60_000), ProducerIdentity(7, 5))
    assert core.name is State.READY


def test_refused_it_stays_prepared():
    core = _prepared_core(version=1)
    assert not core.continue_after_completion(ObservedTransaction("CompleteCommit", 7, 5))
    assert core.name is State.PREPARED


def test_a_transaction_that_never_reached_the_broker_does_not_go_on():
    core = _prepared_core(registered=False)
    assert not core.continue_after_completion(ObservedTransaction("CompleteCommit", 7, 5))


def test_only_a_prepared_producer_may_ask():
    core = ProducerCore("t")
    core.state = Ready(TransactionSetup(2, True, 60_000), HELD)
    with pytest.raises(TransactionStateError):
        core.continue_after_completion(ObservedTransaction("CompleteCommit", 7, 5))
