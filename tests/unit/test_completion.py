"""complete_transaction's decision for every coordinator state, under both transaction protocols."""

import pytest

from kafka2pc.completion import Action, ObservedTransaction, decide
from kafka2pc.prepared_state import PreparedTxnState

S = PreparedTxnState(7, 10)


def obs(state, pid=7, epoch=10):
    return ObservedTransaction(state, pid, epoch)


@pytest.mark.parametrize("tv", [1, 2])
@pytest.mark.parametrize(("observed", "expected"), [
    (None, Action.NOTHING_PENDING),
    (obs("Ongoing"), Action.COMMIT_ONGOING),
    (obs("Ongoing", epoch=11), Action.ABORT_ONGOING),
    (obs("Ongoing", epoch=9), Action.ABORT_ONGOING),
    (obs("Ongoing", pid=8), Action.ABORT_ONGOING),
    (obs("PrepareCommit"), Action.LOOK_AGAIN),
    (obs("PrepareAbort"), Action.LOOK_AGAIN),
    (obs("PrepareEpochFence"), Action.LOOK_AGAIN),
    (obs("Empty"), Action.NOTHING_PENDING),
    (obs("Empty", epoch=12), Action.NOTHING_PENDING),
    (obs("Dead"), Action.NOTHING_PENDING),
    (obs("CompleteCommit", pid=8, epoch=11), Action.NOTHING_PENDING),
    (obs("CompleteAbort", pid=8, epoch=11), Action.NOTHING_PENDING),
    (obs("CompleteCommit", epoch=12), Action.NOTHING_PENDING),
    (obs("CompleteAbort", epoch=12), Action.NOTHING_PENDING),
    (obs("CompleteCommit", epoch=9), Action.NOTHING_PENDING),
])
def test_protocol_independent_cases(tv, observed, expected):
    assert decide(S, observed, transaction_version=tv) is expected


@pytest.mark.parametrize(("observed", "expected"), [
    (obs("CompleteCommit", epoch=11), Action.ALREADY_COMMITTED),  # the coordinator bumped at the end
    (obs("CompleteAbort", epoch=11), Action.ALREADY_ABORTED),     # aborted: by the producer, timeout or fencing
    (obs("CompleteCommit", epoch=10), Action.NOTHING_PENDING),    # that was the transaction before S
    (obs("CompleteAbort", epoch=10), Action.NOTHING_PENDING),
])
def test_transaction_protocol_2(observed, expected):
    assert decide(S, observed, transaction_version=2) is expected


@pytest.mark.parametrize(("observed", "expected"), [
    (obs("CompleteCommit", epoch=10), Action.ALREADY_COMMITTED),  # v1 keeps the epoch at the end
    (obs("CompleteAbort", epoch=10), Action.ALREADY_ABORTED),     # aborted by the producer
    (obs("CompleteAbort", epoch=11), Action.ALREADY_ABORTED),     # aborted by the coordinator (timeout/fence bump)
    (obs("CompleteCommit", epoch=11), Action.NOTHING_PENDING),    # impossible for S: kafka2pc's next one is at 12
])
def test_transaction_protocol_1(observed, expected):
    assert decide(S, observed, transaction_version=1) is expected


@pytest.mark.parametrize("tv", [1, 2])
def test_empty_request_aborts_whatever_is_ongoing(tv):
    empty = PreparedTxnState.empty()
    assert decide(empty, obs("Ongoing"), transaction_version=tv) is Action.ABORT_ONGOING
    assert decide(empty, obs("CompleteCommit", epoch=11), transaction_version=tv) is Action.NOTHING_PENDING
    assert decide(empty, None, transaction_version=tv) is Action.NOTHING_PENDING
