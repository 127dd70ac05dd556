"""judge(): what the coordinator's state implies about one transaction, case by case, for both protocols."""

import pytest

from kafka2pc.completion import Fate, judge
from kafka2pc.coordinator_messages import ObservedTransaction, ProducerIdentity
from kafka2pc.prepared_state import PreparedTxnState

R = PreparedTxnState(7, 10)


def obs(state, pid=7, epoch=10):
    return ObservedTransaction(state, pid, epoch)


@pytest.mark.parametrize("tv", [1, 2])
@pytest.mark.parametrize(("observed", "fate", "other"), [
    (None, Fate.UNKNOWN, None),                                   # unknown id: it may have expired
    (obs("Ongoing"), Fate.PENDING, None),
    (obs("Ongoing", epoch=11), Fate.UNKNOWN, (7, 11)),           # a later transaction has started since
    (obs("Ongoing", epoch=9), Fate.NEVER_STARTED, (7, 9)),       # the id never reached R's epoch
    (obs("Ongoing", pid=8), Fate.UNKNOWN, (8, 10)),              # another producer id (rotated, or another cluster)
    (obs("PrepareCommit"), Fate.IN_FLUX, None),
    (obs("PrepareAbort"), Fate.IN_FLUX, None),
    (obs("PrepareEpochFence"), Fate.IN_FLUX, None),
    (obs("Empty"), Fate.NEVER_STARTED, None),                    # R would have left Ongoing(10) behind
    (obs("Empty", epoch=9), Fate.NEVER_STARTED, None),
    (obs("Empty", epoch=12), Fate.UNKNOWN, None),
    (obs("Dead"), Fate.UNKNOWN, None),
    (obs("CompleteCommit", pid=8, epoch=11), Fate.UNKNOWN, None),
    (obs("CompleteAbort", pid=8, epoch=11), Fate.UNKNOWN, None),
    (obs("CompleteCommit", epoch=12), Fate.UNKNOWN, None),       # a later transaction ended since
    (obs("CompleteAbort", epoch=12), Fate.UNKNOWN, None),
    (obs("CompleteCommit", epoch=9), Fate.NEVER_STARTED, None),
])
def test_protocol_independent_cases(tv, observed, fate, other):
    verdict = judge(R, observed, tv)
    assert verdict.fate is fate, verdict.reason
    assert verdict.other_pending == (ProducerIdentity(*other) if other else None)


@pytest.mark.parametrize(("observed", "fate"), [
    (obs("CompleteCommit", epoch=11), Fate.COMMITTED),      # the coordinator bumped at the end
    (obs("CompleteAbort", epoch=11), Fate.ABORTED),         # aborted: by EndTxn, timeout or fencing
    (obs("CompleteCommit", epoch=10), Fate.NEVER_STARTED),  # the end of the transaction before R: R never registered
    (obs("CompleteAbort", epoch=10), Fate.NEVER_STARTED),
])
def test_transaction_protocol_2(observed, fate):
    assert judge(R, observed, 2).fate is fate


@pytest.mark.parametrize(("observed", "fate"), [
    (obs("CompleteCommit", epoch=10), Fate.COMMITTED),   # v1 keeps the epoch at the end
    (obs("CompleteAbort", epoch=10), Fate.ABORTED),      # aborted by EndTxn
    (obs("CompleteAbort", epoch=11), Fate.ABORTED),      # aborted by the coordinator (timeout or fence bump once)
    (obs("CompleteCommit", epoch=11), Fate.UNKNOWN),     # not R's: kafka2pc's next transaction is at 12 or later
])
def test_transaction_protocol_1(observed, fate):
    assert judge(R, observed, 1).fate is fate


@pytest.mark.parametrize("tv", [1, 2])
def test_empty_request_never_started(tv):
    empty = PreparedTxnState.empty()
    ongoing = judge(empty, obs("Ongoing"), tv)
    assert ongoing.fate is Fate.NEVER_STARTED and ongoing.other_pending == ProducerIdentity(7, 10)
    assert judge(empty, obs("CompleteCommit", epoch=11), tv).fate is Fate.NEVER_STARTED
    assert judge(empty, None, tv).fate is Fate.NEVER_STARTED
