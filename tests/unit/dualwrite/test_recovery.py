"""plan_recovery: every combination of what the row holds and what the coordinator reports."""

import pytest

from kafka2pc._core.messages import ObservedTransaction
from kafka2pc.dualwrite.recovery import RecoveryPlan, plan_recovery
from kafka2pc.prepared_state import PreparedTxnState

R = PreparedTxnState(7, 3, transaction_version=2)


def seen(state: str, producer_id: int = 7, epoch: int = 3) -> ObservedTransaction:
    return ObservedTransaction(state, producer_id, epoch)


@pytest.mark.parametrize(("stored", "completed", "observed", "two_phase", "expected"), [
    # nothing stored (a fresh id, or a DB-only last transaction): only a pending transaction is acted on
    (None, True, None, True, RecoveryPlan()),
    (None, False, seen("Ongoing", 7, 9), False, RecoveryPlan(abort=seen("Ongoing", 7, 9))),
    (None, True, seen("CompleteCommit", 7, 9), True, RecoveryPlan()),
    # the DB committed R and Kafka has it open (mode c): commit, whatever the completed flag says
    (R, False, seen("Ongoing"), True, RecoveryPlan(commit=R)),
    (R, False, seen("Ongoing"), False, RecoveryPlan(commit=R)),
    (R, True, seen("Ongoing"), True, RecoveryPlan(commit=R)),
    # another transaction open (modes a, b): never DB-committed; R was completed before it began, with or without
    # 2PC, under the same producer id or a rotated one
    (R, False, seen("Ongoing", 7, 5), True, RecoveryPlan(abort=seen("Ongoing", 7, 5))),
    (R, False, seen("Ongoing", 7, 5), False, RecoveryPlan(abort=seen("Ongoing", 7, 5))),
    (R, False, seen("Ongoing", 8, 0), True, RecoveryPlan(abort=seen("Ongoing", 8, 0))),
    # nothing open, R known complete
    (R, True, seen("Empty", 7, 4), True, RecoveryPlan()),
    # nothing open, R not known complete: the completion judges; an id moved past R means committed only with 2PC
    (R, False, seen("CompleteCommit", 7, 4), True, RecoveryPlan(commit=R, unknown_means_committed=True)),
    (R, False, seen("CompleteAbort", 7, 4), False, RecoveryPlan(commit=R)),
    # a producer id rotated on epoch exhaustion after R
    (PreparedTxnState(7, 32764, transaction_version=2), False, seen("Empty", 8, 0), True,
     RecoveryPlan(commit=PreparedTxnState(7, 32764, transaction_version=2), unknown_means_committed=True)),
])
def test_plans(stored, completed, observed, two_phase, expected):
    assert plan_recovery(stored, completed, observed, two_phase_active=two_phase) == expected


@pytest.mark.parametrize("observed", [None, seen("Empty", 8, 0), seen("CompleteCommit", 9, 2)])
def test_an_id_the_coordinator_forgot_or_re_created_is_a_problem_not_a_guess(observed):
    plan = plan_recovery(R, False, observed, two_phase_active=True)
    assert plan.problem is not None and plan.commit is None and plan.abort is None


def test_a_forgotten_id_whose_transaction_is_known_complete_is_fine():
    assert plan_recovery(R, True, None, two_phase_active=True) == RecoveryPlan()


def test_an_open_transaction_of_an_id_never_owned_here_is_a_problem():
    """Another state table or search_path, or a truncated table: the open transaction may be one another database
    committed, so it is reported, not aborted."""
    plan = plan_recovery(None, True, seen("Ongoing", 7, 9), two_phase_active=False, ever_owned=False)
    assert plan.problem is not None and "no writer ever owned" in plan.problem and plan.abort is None
    assert plan_recovery(None, True, seen("CompleteCommit", 7, 9), two_phase_active=False,
                         ever_owned=False) == RecoveryPlan()
    assert plan_recovery(None, True, None, two_phase_active=False, ever_owned=False) == RecoveryPlan()
