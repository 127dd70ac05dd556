"""Errors around initialisation and TransactionControl's ends, run against the coordinator model
(tests/model/coordinator.py) through a transport that scripts what the model cannot do by itself
(tests/model/scripted.py, and a subclass here): an InitProducerId answered with a given code (a coordinator waiting
for a block of producer ids), an EndTxn of one id answered with a given code, and a DescribeTransactions the edge
refuses (raises instead of answering).

* A fresh InitProducerId answered REQUEST_TIMED_OUT is sent again under COORDINATOR_RETRY; still failing at
  max.block.ms, init_transactions() raises BrokerUnavailableError (retriable) and the producer stays UNINITIALIZED.
  A guarded bump so answered is never sent again blindly: it looks first.
* An edge failure in the middle of an end raises the same class from TransactionControl as from the producer
  (``_core/ending.py`` ``end_error``).
* A misused init_transactions() is refused before the cluster is read: it changes nothing, whatever that read raises.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kafka2pc import TwoPhaseProducer
from kafka2pc._core import codes
from kafka2pc._core.messages import DescribeTransaction, EndTxn, InitProducerId
from kafka2pc._core.states import State
from kafka2pc.errors import (
    BrokerUnavailableError,
    KafkaProtocolError,
    ProducerFencedError,
    TransactionNotSettledError,
    TransactionStateError,
    UnsupportedByBrokerError,
)
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.transaction_control import TransactionControl
from tests.model import scripted
from tests.model.coordinator import NOT_ENOUGH_REPLICAS, CoordinatorModel


class Scripted(scripted.Scripted):
    """The shared scripted model (``init_codes``: the next InitProducerId, any id, is answered with this code and does
    nothing; ``end_codes[id]``: the same for an EndTxn of that id), plus: a scripted answer moves the clock by the
    command's ``after_s`` as the model's own do (so a resend budget runs out), and ``refuse_describe``:
    DescribeTransactions raises this instead of answering (the edge refusing a code no kind covers)."""

    def __init__(self, model: CoordinatorModel):
        super().__init__(model)
        self.refuse_describe: Exception | None = None

    def _scripted(self, transactional_id, command):
        if isinstance(command, DescribeTransaction) and self.refuse_describe is not None:
            raise self.refuse_describe
        if (isinstance(command, InitProducerId) and self.init_codes) or \
                (isinstance(command, EndTxn) and self.end_codes.get(transactional_id)):
            self.clock += command.after_s
        return super()._scripted(transactional_id, command)


def v2(two_phase: bool = True) -> Scripted:
    return Scripted(CoordinatorModel(transaction_version=2, two_phase_enabled=two_phase))


def new_producer(transport, txn_id: str = "app-0", **config) -> TwoPhaseProducer:
    return TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": txn_id, "linger.ms": 0, **config},
                            two_phase_commit=True, transport=transport)


def prepared(transport, txn_id: str = "app-0") -> tuple[TwoPhaseProducer, PreparedTxnState]:
    p = new_producer(transport, txn_id)
    p.init_transactions()
    p.begin_transaction()
    p.produce("t", b"x", partition=0)
    return p, p.prepare_transaction()


def inits(transport) -> list[InitProducerId]:
    return [c for c in transport.sent if isinstance(c, InitProducerId)]


# -- InitProducerId answered REQUEST_TIMED_OUT -------------------------------------------------------------------------

def test_a_fresh_init_producer_id_that_timed_out_is_sent_again_and_the_producer_initialises():
    """Kafka 3.x's RPCProducerIdManager answers a new transactional id's InitProducerId REQUEST_TIMED_OUT while it
    waits for a block of producer ids (later brokers answer COORDINATOR_LOAD_IN_PROGRESS: "it should be retriable").
    Before, init_error made it a KafkaProtocolError and the producer was FATAL_ERROR at once."""
    transport = v2()
    transport.init_codes += [codes.REQUEST_TIMED_OUT] * 3
    p = new_producer(transport)
    p.init_transactions()
    assert p.state is State.READY
    sent = inits(transport)
    assert len(sent) == 4 and all(c.expected is None for c in sent)
    assert all(c.after_s > 0 for c in sent[1:])  # sent again with backoff


def test_an_init_producer_id_that_keeps_timing_out_is_retriable_and_leaves_the_producer_uninitialized():
    transport = v2()
    transport.init_codes += [codes.REQUEST_TIMED_OUT] * 1000
    p = new_producer(transport, **{"max.block.ms": 3000})
    with pytest.raises(BrokerUnavailableError, match="REQUEST_TIMED_OUT") as raised:
        p.init_transactions()
    assert raised.value.retriable() and not raised.value.fatal()
    assert p.state is State.UNINITIALIZED
    assert 3 < len(inits(transport)) < 20  # sent again until max.block.ms, not once, not forever
    assert transport.clock <= 3.0
    transport.init_codes.clear()  # the controller hands out a block of producer ids
    p.init_transactions()  # the call a Java producer would make again
    assert p.state is State.READY


def test_transaction_control_fences_through_a_timed_out_init_producer_id():
    transport = v2()
    p, _ = prepared(transport)
    transport.init_codes.append(codes.REQUEST_TIMED_OUT)
    identity = TransactionControl(transport).fence("app-0")
    assert identity.producer_id == p.producer_id_and_epoch[0] and identity.epoch > p.producer_id_and_epoch[1]
    assert [t.fate for t in transport.model.txns] == ["aborted"]


def test_a_guarded_bump_that_timed_out_is_looked_at_before_it_is_sent_again():
    """Transaction protocol v1: the bump before the next transaction names the producer's identity, which Kafka
    checks only by producer id when a transaction is Ongoing. Answered REQUEST_TIMED_OUT it may have landed, or
    another producer may have moved in since: never sent again without a look."""
    transport = Scripted(CoordinatorModel(transaction_version=1, two_phase_enabled=True))
    p = new_producer(transport)
    p.init_transactions()
    start = len(transport.sent)
    transport.init_codes.append(codes.REQUEST_TIMED_OUT)
    p.begin_transaction()
    assert p.state is State.IN_TRANSACTION
    sent = transport.sent[start:]
    assert [type(c).__name__ for c in sent] == ["DescribeTransaction", "InitProducerId", "DescribeTransaction",
                                                "InitProducerId"]
    assert all(c.expected is not None for c in sent if isinstance(c, InitProducerId))


# -- an edge failure in the middle of an end: the same error from TransactionControl as from the producer --------------

EDGE_ERRORS = {
    "unclassified code": (KafkaProtocolError("DescribeTransactions", "UNKNOWN_SERVER_ERROR", -1),
                          TransactionNotSettledError),
    "unsupported": (KafkaProtocolError("DescribeTransactions", "UNSUPPORTED_VERSION", codes.UNSUPPORTED_VERSION),
                    UnsupportedByBrokerError),
}
CONTROL_ENDS: dict[str, Callable[[TransactionControl, str, PreparedTxnState], object]] = {
    "commit": lambda control, txn_id, state: control.commit(txn_id, state),
    "abort": lambda control, txn_id, state: control.abort(txn_id, state),
    "commit_all": lambda control, txn_id, state: control.commit_all([(txn_id, state)])[0],
    "abort_all": lambda control, txn_id, state: control.abort_all([(txn_id, state)])[0],
}


def _outcome(call: Callable[[], object]) -> BaseException:
    try:
        result = call()
    except Exception as exc:  # the class is what is compared
        return exc
    assert isinstance(result, Exception), result
    return result


@pytest.mark.parametrize("end", CONTROL_ENDS)
@pytest.mark.parametrize("edge", EDGE_ERRORS)
def test_an_edge_error_mid_end_raises_the_same_class_from_transaction_control_as_from_the_producer(edge, end):
    """EndTxn answered NOT_ENOUGH_REPLICAS, then the look refused by the edge (a code no kind covers). The producer
    stays COMMITTING/ABORTING and raises TransactionNotSettledError (retriable); before, TransactionControl raised
    the KafkaProtocolError itself (a FatalError) for the same failure of the same end: the sink's roll-forward and
    the dual writer's recovery got the fatal class for a retriable situation."""
    error, expected = EDGE_ERRORS[edge]
    commit = end.startswith("commit")

    producer_side = v2()
    p, _ = prepared(producer_side, "app-1")
    producer_side.end_codes["app-1"] = [NOT_ENOUGH_REPLICAS]
    producer_side.refuse_describe = error
    by_producer = _outcome(p.commit_transaction if commit else p.abort_transaction)
    assert type(by_producer) is expected
    assert p.state is (State.FATAL_ERROR if by_producer.fatal() else
                       State.COMMITTING if commit else State.ABORTING)

    control_side = v2()
    _, decided = prepared(control_side)
    control_side.end_codes["app-0"] = [NOT_ENOUGH_REPLICAS]
    control_side.refuse_describe = error
    by_control = _outcome(lambda: CONTROL_ENDS[end](TransactionControl(control_side), "app-0", decided))
    assert type(by_control) is expected
    assert by_control.__cause__ is error
    assert (by_control.retriable(), by_control.fatal()) == (by_producer.retriable(), by_producer.fatal())
    assert [t.fate for t in control_side.model.txns] == [None]  # nothing ended it: the same end may be retried

    control_side.refuse_describe = None
    settled = CONTROL_ENDS[end](TransactionControl(control_side), "app-0", decided)
    assert not isinstance(settled, Exception)
    assert [t.fate for t in control_side.model.txns] == ["committed" if commit else "aborted"]


def test_a_look_up_keeps_the_edge_error_as_it_is():
    """A look-up ends nothing: TransactionControl.look_up_all reports the edge's error itself, as before (and as a
    producer's complete_transaction report does)."""
    transport = v2()
    _, decided = prepared(transport)
    error = KafkaProtocolError("DescribeTransactions", "UNKNOWN_SERVER_ERROR", -1)
    transport.refuse_describe = error
    assert TransactionControl(transport).look_up_all([("app-0", decided)]) == [error]


# -- a misused init_transactions() is refused before the cluster is read ----------------------------------------------

def test_init_transactions_misused_on_a_prepared_producer_is_refused_before_the_cluster_is_read():
    """A second init_transactions() is refused with TransactionStateError and changes nothing. Before, it read the
    cluster's facts first, and when that read raised a FatalError the producer was FATAL_ERROR (PREPARED ->
    FATAL_ERROR under INIT, a move the transition table does not list) and its prepared transaction stranded."""
    transport = v2()
    p, state = prepared(transport)
    reads = []

    def too_old():
        reads.append(1)
        raise UnsupportedByBrokerError("no DescribeFeatures")

    transport.cluster_facts = too_old  # type: ignore[method-assign]
    with pytest.raises(TransactionStateError, match="already called"):
        p.init_transactions()
    assert p.state is State.PREPARED and reads == []
    p.complete_transaction(state)
    assert transport.model.committed_records() == [b"x"]


def test_init_transactions_on_a_fatal_producer_raises_its_error_without_reading_the_cluster():
    transport = v2()
    first = new_producer(transport)
    first.init_transactions()
    second = new_producer(transport)
    second.init_transactions()  # fences the first
    first.begin_transaction()
    first.produce("t", b"x", partition=0)
    with pytest.raises(ProducerFencedError) as fenced:
        first.prepare_transaction()
    assert first.state is State.FATAL_ERROR

    def unreadable():
        raise AssertionError("read")

    transport.cluster_facts = unreadable  # type: ignore[method-assign]
    with pytest.raises(ProducerFencedError) as again:
        first.init_transactions()
    assert again.value is fenced.value
