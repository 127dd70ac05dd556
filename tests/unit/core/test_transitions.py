"""The transition table itself: what it says must hold of any producer."""

from kafka2pc._core.states import State
from kafka2pc._core.transitions import TRANSITIONS, Operation


def test_every_state_but_closed_may_close_and_nothing_follows_closed():
    assert {state for state, operation in TRANSITIONS if operation is Operation.CLOSE} == set(State) - {State.CLOSED}
    assert not [key for key in TRANSITIONS if key[0] is State.CLOSED]


def test_a_fatal_producer_can_only_close():
    assert [operation for state, operation in TRANSITIONS if state is State.FATAL_ERROR] == [Operation.CLOSE]


def test_a_decision_in_progress_may_only_be_retried_as_it_was_made():
    assert {op for state, op in TRANSITIONS if state is State.COMMITTING} == \
        {Operation.COMMIT, Operation.COMPLETE_HELD, Operation.CLOSE}
    assert {op for state, op in TRANSITIONS if state is State.ABORTING} == \
        {Operation.ABORT, Operation.COMPLETE_OTHER, Operation.CLOSE}


def test_an_abortable_transaction_is_never_committed():
    assert not [state for state, op in TRANSITIONS if state is State.ABORTABLE_ERROR and op is not Operation.ABORT
                and op is not Operation.CLOSE]
    assert all(State.PREPARED not in after for (state, _), after in TRANSITIONS.items()
               if state is State.ABORTABLE_ERROR)


def test_only_writing_leads_to_abortable_and_records_go_only_into_an_open_transaction():
    writes = [state for state, op in TRANSITIONS if op is Operation.WRITE]
    assert writes == [State.IN_TRANSACTION]
    into_abortable = {op for (state, op), after in TRANSITIONS.items() if State.ABORTABLE_ERROR in after}
    assert into_abortable == {Operation.WRITE, Operation.PREPARE, Operation.COMMIT}  # the latter two flush first
