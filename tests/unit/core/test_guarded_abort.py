"""An abort sent as EndTxn v5 because a look saw the transaction ongoing at exactly its identity (a bare
"pid:epoch": LISTING, the dual writer's recovery) is never resent blindly: a v4 commit of the same transaction, at
the same epoch, may land in between, and Kafka's TV2 rules take an abort at the current epoch on CompleteCommit as
the abort of an empty transaction (answered NONE). Found by an adversarial review of c01dfc9."""

from __future__ import annotations

import logging

import pytest

from kafka2pc._core import codes
from kafka2pc._core.messages import EndTxn, InitProducerId
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import CoordinatorModel
from tests.model.scripted import Scripted

logging.getLogger("kafka2pc").setLevel(logging.CRITICAL)


@pytest.mark.parametrize("code", [codes.REQUEST_TIMED_OUT, codes.CONCURRENT_TRANSACTIONS])
def test_a_look_first_abort_is_looked_at_again_before_it_is_sent_again(code):
    t = Scripted(CoordinatorModel(transaction_version=2, two_phase_enabled=True))
    mine = t.model.init_producer_id("job-0-0", InitProducerId(60_000, enable_2pc=True)).identity
    assert mine is not None and t.model.add_partitions("job-0-0", mine, {("t", 0)}) == codes.NONE  # a v1 client's
    t.end_codes["job-0-0"] = [code]  # the first abort does nothing and says nothing

    def v4_commit() -> None:
        assert t.model.end_txn("job-0-0", EndTxn(mine, True, 1)).error == codes.NONE

    t.after[("job-0-0", EndTxn, 1)] = v4_commit  # the client commits it meanwhile
    aborted = TransactionControl(t).abort_ongoing("job-0-0")
    assert aborted is None  # ended before it could be aborted: reported so, not "aborted"
    assert [x.fate for x in t.model.txns] == ["committed"]
    assert len([c for c in t.sent if isinstance(c, EndTxn)]) == 1  # the look showed it committed: no second abort
