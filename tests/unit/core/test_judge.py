"""judge(): what the coordinator's state implies about one transaction, case by case, for a handle that recorded
transaction protocol v1, v2, or neither (KIP-939's bare string): the protocols disagree only about Complete* at the
transaction's own epoch, which a handle without a protocol leaves unknown."""

import pytest

from kafka2pc._core.judge import Fate, judge
from kafka2pc._core.messages import ObservedTransaction, ProducerIdentity
from kafka2pc.prepared_state import PreparedTxnState

R = PreparedTxnState(7, 10)


def obs(state, pid=7, epoch=10):
    return ObservedTransaction(state, pid, epoch)


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
    (obs("Empty", epoch=11), Fate.UNKNOWN, None),                # v1: a bump after R's end; R's end is forgotten
    (obs("Empty", epoch=12), Fate.UNKNOWN, None),
    (obs("Dead"), Fate.UNKNOWN, None),
    (obs("CompleteCommit", pid=8, epoch=11), Fate.UNKNOWN, None),
    (obs("CompleteAbort", pid=8, epoch=11), Fate.UNKNOWN, None),
    (obs("CompleteAbort", epoch=11), Fate.ABORTED, None),        # v2: any abort; v1: by the coordinator (fence bump)
    (obs("CompleteCommit", epoch=12), Fate.UNKNOWN, None),       # a later transaction ended since
    (obs("CompleteAbort", epoch=12), Fate.UNKNOWN, None),
    (obs("CompleteCommit", epoch=9), Fate.NEVER_STARTED, None),
])
@pytest.mark.parametrize("version", [None, 1, 2])
def test_states_every_reading_agrees_on(observed, fate, other, version):
    verdict = judge(R, observed, version)
    assert verdict.fate is fate, verdict.reason
    assert verdict.other_pending == (ProducerIdentity(*other) if other else None)


@pytest.mark.parametrize(("observed", "v1", "v2", "unrecorded"), [
    (obs("CompleteCommit", epoch=10), Fate.COMMITTED, Fate.NEVER_STARTED, Fate.UNKNOWN),  # v1 keeps the epoch
    (obs("CompleteAbort", epoch=10), Fate.ABORTED, Fate.NEVER_STARTED, Fate.UNKNOWN),     # v1: aborted by EndTxn
    (obs("CompleteCommit", epoch=11), Fate.UNKNOWN, Fate.COMMITTED, Fate.COMMITTED),      # no kafka2pc v1 txn at e+1
])
def test_states_the_protocols_read_differently(observed, v1, v2, unrecorded):
    assert (judge(R, observed, 1).fate, judge(R, observed, 2).fate, judge(R, observed).fate) == (v1, v2, unrecorded)


def test_a_v1_commit_judged_after_the_cluster_moved_to_v2():
    """The reviewer's case: a v1 transaction committed, its answer lost, then transaction.version=2 is finalized and
    a handle without a recorded protocol is completed: never "never started" (which an application would resend)."""
    bare = PreparedTxnState.parse("1000:1")
    assert judge(bare, obs("CompleteCommit", pid=1000, epoch=1)).fate is Fate.UNKNOWN
    assert judge(PreparedTxnState(1000, 1, 1), obs("CompleteCommit", pid=1000, epoch=1), 1).fate is Fate.COMMITTED


def test_empty_request_never_started():
    empty = PreparedTxnState.empty()
    ongoing = judge(empty, obs("Ongoing"))
    assert ongoing.fate is Fate.NEVER_STARTED and ongoing.other_pending == ProducerIdentity(7, 10)
    assert judge(empty, obs("CompleteCommit", epoch=11)).fate is Fate.NEVER_STARTED
    assert judge(empty, None).fate is Fate.NEVER_STARTED
