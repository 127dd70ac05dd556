"""Every (state, event) pair: legal ones move exactly as the table says, illegal ones raise and do not move."""

import itertools

import pytest

from kafka2pc.errors import ProducerFencedError, TransactionStateError
from kafka2pc.txn_state import TRANSITIONS, Event, State, TransactionStateMachine

ALL_PAIRS = list(itertools.product(State, Event))


def machine_in(state: State) -> TransactionStateMachine:
    machine = TransactionStateMachine()
    machine.state = state
    return machine


@pytest.mark.parametrize(("state", "event"), [p for p in ALL_PAIRS if p in TRANSITIONS],
                         ids=lambda v: v.name)
def test_legal_transition_moves_to_table_target(state, event):
    machine = machine_in(state)
    assert machine.can(event)
    assert machine.fire(event) is TRANSITIONS[(state, event)]
    assert machine.state is TRANSITIONS[(state, event)]


@pytest.mark.parametrize(("state", "event"), [p for p in ALL_PAIRS if p not in TRANSITIONS],
                         ids=lambda v: v.name)
def test_illegal_transition_raises_and_stays(state, event):
    machine = machine_in(state)
    assert not machine.can(event)
    with pytest.raises(TransactionStateError) as info:
        machine.fire(event)
    assert info.value.state == state.value
    assert machine.state is state


def test_closed_is_terminal_and_fatal_only_closes():
    assert [e for e in Event if (State.CLOSED, e) in TRANSITIONS] == []
    assert {e for e in Event if (State.FATAL_ERROR, e) in TRANSITIONS} == {Event.FATAL, Event.CLOSE}


def test_every_state_is_reachable_from_uninitialized():
    seen, frontier = {State.UNINITIALIZED}, [State.UNINITIALIZED]
    while frontier:
        current = frontier.pop()
        for (source, _), target in TRANSITIONS.items():
            if source is current and target not in seen:
                seen.add(target)
                frontier.append(target)
    assert seen == set(State)


def test_produce_after_prepare_names_operation_and_state():
    machine = machine_in(State.PREPARED)
    with pytest.raises(TransactionStateError, match=r"produce\(\) is not allowed in state PREPARED"):
        machine.check(Event.SEND)


def test_happy_two_phase_path():
    machine = TransactionStateMachine()
    path = [Event.INIT, Event.INIT_DONE, Event.BEGIN, Event.SEND, Event.SEND, Event.PREPARE, Event.COMMIT,
            Event.END_DONE, Event.BEGIN]
    states = [machine.fire(e) for e in path]
    assert states[-4:] == [State.PREPARED, State.COMMITTING, State.READY, State.IN_TRANSACTION]


def test_recovery_path_reinitializes_before_new_transactions():
    machine = TransactionStateMachine()
    for event in (Event.INIT, Event.INIT_KEPT, Event.COMMIT, Event.REINIT, Event.INIT_DONE, Event.BEGIN):
        machine.fire(event)
    assert machine.state is State.IN_TRANSACTION
    machine = machine_in(State.RECOVERED_PREPARED)
    with pytest.raises(TransactionStateError, match="recovered"):
        machine.check(Event.BEGIN)


def test_fatal_error_is_raised_again_by_later_calls():
    machine = machine_in(State.IN_TRANSACTION)
    cause = ProducerFencedError("fenced")
    machine.fire(Event.FATAL, cause)
    for event in (Event.SEND, Event.COMMIT, Event.BEGIN, Event.PREPARE):
        with pytest.raises(ProducerFencedError) as info:
            machine.check(event)
        assert info.value is cause
    assert machine.fire(Event.CLOSE) is State.CLOSED


def test_abortable_error_allows_only_abort():
    machine = machine_in(State.IN_TRANSACTION)
    machine.fire(Event.ABORTABLE, RuntimeError("write failed"))
    for event in (Event.SEND, Event.PREPARE, Event.COMMIT, Event.BEGIN):
        assert not machine.can(event)
    assert machine.fire(Event.ABORT) is State.ABORTING
    assert machine.error is None
