"""The one driver: drive() runs one machine, drive_all() many at once, a round per step."""

from kafka2pc._core import codes
from kafka2pc._core.completion import Completion, Goal, Settled
from kafka2pc._core.driver import drive, drive_all
from kafka2pc._core.judge import TransactionOutcome
from kafka2pc._core.messages import EndAnswer, EndTxn, ProducerIdentity
from kafka2pc._core.requests import Immediately
from kafka2pc.errors import KafkaProtocolError, TransactionNotSettledError
from kafka2pc.prepared_state import PreparedTxnState


class Recording:
    """A transport that answers EndTxn with NONE and records what it was asked, round by round."""

    def __init__(self, fail_round: bool = False, bad: str = ""):
        self.rounds: list[list[str]] = []
        self.alone: list[str] = []
        self.fail_round, self.bad = fail_round, bad

    def now(self):
        return 0.0

    def execute(self, transactional_id, command):
        self.alone.append(transactional_id)
        if transactional_id == self.bad:
            raise KafkaProtocolError("FindCoordinator", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", 53)
        return EndAnswer(codes.NONE)

    def execute_all(self, commands):
        self.rounds.append([txn_id for txn_id, _ in commands])
        if self.fail_round:
            raise KafkaProtocolError("FindCoordinator", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", 53)
        return [EndAnswer(codes.NONE) for _ in commands]


def commit(txn_id):
    return txn_id, Completion(txn_id, PreparedTxnState(7, 10, 2), Goal.COMMIT, 2)


def test_drive_runs_one_machine_to_its_result():
    transport = Recording()
    settled = drive(transport, "a", commit("a")[1])
    assert settled.outcome is TransactionOutcome.COMMITTED and transport.alone == ["a"]
    assert drive(transport, "a", Immediately(42)) == 42 and transport.alone == ["a"]  # nothing sent


def test_drive_all_sends_each_round_together():
    transport = Recording()
    results = drive_all(transport, [commit("a"), commit("b"), ("c", Immediately("done"))])
    assert transport.rounds == [["a", "b"]] and transport.alone == []
    assert [getattr(r, "outcome", r) for r in results] == [TransactionOutcome.COMMITTED] * 2 + ["done"]


def test_drive_all_keeps_going_when_the_concurrent_round_fails():
    """Second review F9: an error of one transaction's round belongs to that transaction only."""
    transport = Recording(fail_round=True, bad="bad")
    good, bad = drive_all(transport, [commit("good"), commit("bad")])
    assert isinstance(good, Settled) and good.outcome is TransactionOutcome.COMMITTED
    # the transport's error went through its machine, as in drive(): an end it interrupted is not settled
    assert isinstance(bad, TransactionNotSettledError) and isinstance(bad.__cause__, KafkaProtocolError)
    assert transport.alone == ["good", "bad"]


def test_an_error_the_transport_raises_goes_through_its_machine_in_drive_all_as_in_drive():
    """Before, drive_all reported the transport's error as it was, passing the machine by (drive asked it): the same
    failure of the same end raised another class from TransactionControl.commit_all than from commit."""
    class Interrupted:
        def __init__(self):
            self.heard: list[Exception] = []

        def start(self, now=None):
            return EndTxn(ProducerIdentity(7, 10), True, 2)

        def on_answer(self, answer, now=None):
            raise AssertionError("never answered")

        def on_failure(self, error):
            self.heard.append(error)
            return RuntimeError("the machine's say")

    transport = Recording(fail_round=True, bad="bad")
    for run in (lambda m: drive_all(transport, [("bad", m)])[0], lambda m: _raised(lambda: drive(transport, "bad", m))):
        machine = Interrupted()
        error = run(machine)
        assert isinstance(error, RuntimeError) and str(error) == "the machine's say"
        assert isinstance(error.__cause__, KafkaProtocolError) and machine.heard == [error.__cause__]


def _raised(call):
    try:
        call()
    except Exception as exc:  # returned for the test to look at
        return exc
    raise AssertionError("nothing raised")


def test_a_machine_that_raises_at_its_start_fails_alone():
    class Broken:
        def start(self, now=None):
            raise ValueError("broken")

    transport = Recording()
    broken, good = drive_all(transport, [("x", Broken()), commit("a")])
    assert isinstance(broken, ValueError) and good.outcome is TransactionOutcome.COMMITTED


def test_a_command_asked_again_goes_out_in_the_next_round():
    transport = Recording()
    first = Completion("a", PreparedTxnState(7, 10, 2), Goal.COMMIT, 2)
    answers = iter([[EndAnswer(codes.INVALID_TXN_STATE)], None])

    def execute_all(commands):
        transport.rounds.append([c for _, c in commands])
        planned = next(answers)
        return planned if planned is not None else [_described_committed()]

    transport.execute_all = execute_all
    (settled,) = drive_all(transport, [("a", first)])
    assert settled.outcome is TransactionOutcome.COMMITTED
    assert isinstance(transport.rounds[0][0], EndTxn) and len(transport.rounds) == 2


def _described_committed():
    from kafka2pc._core.messages import Described, ObservedTransaction  # noqa: PLC0415

    return Described(ObservedTransaction("CompleteCommit", 7, 11))
