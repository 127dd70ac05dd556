"""Bumping and Beginning on their own: the InitProducerId requests before a transaction, each guarded by a look."""

import pytest

from kafka2pc._core import codes
from kafka2pc._core.beginning import Beginning, Bumping, needs_bump
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import (
    Described,
    DescribeTransaction,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ObservedTransaction,
    ProducerIdentity,
)
from kafka2pc._core.setup import TransactionSetup
from kafka2pc._core.states import InTransaction, Ready, Unowned
from kafka2pc.errors import BrokerUnavailableError, ProducerFencedError

V1 = TransactionSetup(1, False, 60_000)
V2 = TransactionSetup(2, False, 60_000)
ME = ProducerIdentity(5, 3)


def looked(state, epoch, pid=5):
    return Described(ObservedTransaction(state, pid, epoch))


def test_nothing_due_needs_no_request():
    assert Bumping("t", Ready(V2, ME)).start() == Finished(Ready(V2, ME))
    assert Beginning("t", Ready(V2, ME)).start() == Finished(InTransaction(V2, ME))


def test_an_epoch_near_exhaustion_must_rotate():
    assert needs_bump(Ready(V2, ProducerIdentity(5, 32766)))
    assert not needs_bump(Ready(V2, ProducerIdentity(5, 32765)))


def test_a_bump_is_sent_only_after_a_look_shows_the_id_idle_at_this_identity():
    bumping = Bumping("t", Ready(V1, ME, bumps_due=1))
    assert isinstance(bumping.start(), DescribeTransaction)
    assert bumping.on_answer(looked("CompleteCommit", 3)) == InitProducerId(60_000, expected=ME)
    assert bumping.on_answer(InitAnswer(codes.NONE, ProducerIdentity(5, 4))) == \
        Finished(Ready(V1, ProducerIdentity(5, 4)))


def test_while_an_end_writes_its_markers_it_looks_again_with_backoff_then_gives_up():
    bumping = Bumping("t", Ready(V1, ME, bumps_due=1))
    looks = [bumping.start()]
    with pytest.raises(BrokerUnavailableError, match="stayed busy"):
        while True:
            looks.append(bumping.on_answer(looked("PrepareCommit", 3)))
    assert len(looks) == 20 and looks[0].after_s == 0.0 and looks[-1].after_s > looks[1].after_s


def test_a_lost_bump_is_in_doubt_and_the_state_says_so():
    bumping = Bumping("t", Ready(V1, ME, bumps_due=1))
    bumping.start()
    bumping.on_answer(looked("Empty", 3))
    with pytest.raises(BrokerUnavailableError):
        bumping.on_answer(NoAnswer("lost"))
    assert bumping.state == Ready(V1, ME, bumps_due=1, bump_in_doubt=True)


def test_someone_elses_transaction_on_the_id_is_fencing_and_nothing_is_sent():
    bumping = Bumping("t", Ready(V1, ME, bumps_due=1))
    bumping.start()
    with pytest.raises(ProducerFencedError, match="no bump was sent"):
        bumping.on_answer(looked("Ongoing", 4))


def test_a_producer_without_an_identity_looks_then_takes_the_id_over_afresh():
    beginning = Beginning("t", Unowned(V2))
    assert isinstance(beginning.start(), DescribeTransaction)
    assert beginning.on_answer(looked("CompleteAbort", 9)) == InitProducerId(60_000)
    assert beginning.on_answer(InitAnswer(codes.NONE, ProducerIdentity(5, 10))) == \
        Finished(InTransaction(V2, ProducerIdentity(5, 10)))


def test_a_fresh_identity_on_v1_is_bumped_once_more_before_its_first_transaction():
    beginning = Beginning("t", Unowned(V1))
    beginning.start()
    beginning.on_answer(Described(None))
    assert isinstance(beginning.on_answer(InitAnswer(codes.NONE, ProducerIdentity(5, 0))), DescribeTransaction)
    assert beginning.state == Ready(V1, ProducerIdentity(5, 0), bumps_due=1)
