"""plan_recovery: every combination of what the row holds and what the coordinator reports."""

import pytest

from kafka2pc.coordinator_messages import ObservedTransaction
from kafka2pc.dualwrite.recovery import RecoveryPlan, plan_recovery
from kafka2pc.prepared_state import PreparedTxnState

R = PreparedTxnState(7, 3, transaction_version=2)


def seen(state: str, producer_id: int = 7, epoch: int = 3) -> ObservedTransaction:
    return ObservedTransaction(state, producer_id, epoch)


@pytest.mark.parametrize(("stored", "completed", "observed", "two_phase", "expected"), [
    # nothing stored (a fresh id) or the stored one known complete: only a pending transaction is acted on
    (None, True, None, True, RecoveryPlan()),
    (None, True, seen("Ongoing", 7, 9), True, RecoveryPlan(abort=seen("Ongoing", 7, 9))),
    (None, True, seen("CompleteCommit", 7, 9), True, RecoveryPlan()),
    (R, True, seen("Ongoing", 7, 5), True, RecoveryPlan(abort=seen("Ongoing", 7, 5))),
    (R, True, seen("Empty", 7, 4), True, RecoveryPlan()),
    # the DB committed R; R still pending: commit it (mode c)
    (R, False, seen("Ongoing"), True, RecoveryPlan(commit=R)),
    (R, False, seen("Ongoing"), False, RecoveryPlan(commit=R)),
    # the DB committed R; another transaction pending: R was completed before it began; abort the other (mode b)
    (R, False, seen("Ongoing", 7, 5), True, RecoveryPlan(abort=seen("Ongoing", 7, 5), already_complete=True)),
    # R ended (mode d): with 2PC no timeout can have aborted it
    (R, False, seen("CompleteCommit", 7, 4), True, RecoveryPlan(already_complete=True)),
    # without 2PC the broker may have aborted it: the completion's own judgement (commit reports lost/unknown)
    (R, False, seen("CompleteAbort", 7, 4), False, RecoveryPlan(commit=R)),
    (R, False, seen("Ongoing", 7, 5), False, RecoveryPlan(abort=seen("Ongoing", 7, 5), commit=R)),
])
def test_plans(stored, completed, observed, two_phase, expected):
    assert plan_recovery(stored, completed, observed, two_phase_active=two_phase) == expected


@pytest.mark.parametrize("observed", [None, seen("Ongoing", 8, 0), seen("Empty", 7, 1)])
def test_what_cannot_be_confirmed_is_a_problem_not_a_guess(observed):
    plan = plan_recovery(R, False, observed, two_phase_active=True)
    assert plan.problem is not None and plan.commit is None and plan.abort is None


def test_a_completed_row_whose_own_transaction_is_open_is_a_problem():
    assert plan_recovery(R, True, seen("Ongoing"), two_phase_active=True).problem is not None


def test_an_autocommit_connection_is_refused():
    import sqlite3  # noqa: PLC0415

    from kafka2pc.dualwrite.state_table import StateTable  # noqa: PLC0415
    from kafka2pc.errors import ConfigError  # noqa: PLC0415

    class Autocommitting(sqlite3.Connection):
        autocommit = True

    with pytest.raises(ConfigError, match="autocommit"):
        StateTable(sqlite3.connect(":memory:", factory=Autocommitting), "state").begin_locked("id-0")
