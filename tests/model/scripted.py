"""The coordinator model with scripted answers, for scenarios the model cannot reach by itself: an EndTxn answered
with a given code for one id, a coordinator stuck writing markers (Prepare* states), another process acting between
two requests of a completion."""

from __future__ import annotations

from collections.abc import Callable

from kafka2pc import PreparedTxnState, TwoPhaseProducer
from kafka2pc._core.messages import (
    Described,
    DescribeTransaction,
    EndAnswer,
    EndTxn,
    InitAnswer,
    InitProducerId,
    ObservedTransaction,
    ProducerIdentity,
)
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport


class Scripted(ModelTransport):
    """The model, plus per-id scripts: ``end_codes[id]``: the next EndTxn of that id is answered with this code and
    does nothing; ``looks[id]``: DescribeTransactions of that id reports this (a coordinator stuck writing markers);
    ``init_codes``: the next InitProducerId (any id) is answered with this code and does nothing; ``after``: a
    callable run once, right after the n-th command of an id was answered (another process acting in between)."""

    def __init__(self, model: CoordinatorModel):
        super().__init__(model, Faults())
        self.end_codes: dict[str, list[int]] = {}
        self.looks: dict[str, ObservedTransaction] = {}
        self.init_codes: list[int] = []
        self.after: dict[tuple[str, type, int], Callable[[], None]] = {}
        self._counts: dict[tuple[str, type], int] = {}

    def execute(self, transactional_id, command):
        key = (transactional_id, type(command))
        self._counts[key] = self._counts.get(key, 0) + 1
        answer = self._scripted(transactional_id, command)
        hook = self.after.pop((transactional_id, type(command), self._counts[key]), None)
        if hook is not None:
            hook()
        return answer

    def _scripted(self, transactional_id, command):
        if isinstance(command, EndTxn) and self.end_codes.get(transactional_id):
            self.sent.append(command)
            return EndAnswer(self.end_codes[transactional_id].pop(0))
        if isinstance(command, DescribeTransaction) and transactional_id in self.looks:
            self.sent.append(command)
            self.clock += command.after_s
            return Described(self.looks[transactional_id])
        if isinstance(command, InitProducerId) and self.init_codes:
            self.sent.append(command)
            return InitAnswer(self.init_codes.pop(0))
        return super().execute(transactional_id, command)


def new_producer(transport, txn_id: str, *, two_phase: bool = True) -> TwoPhaseProducer:
    return TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": txn_id, "linger.ms": 0},
                            two_phase_commit=two_phase, transport=transport)


def prepare(transport, txn_id: str, value: bytes, *, two_phase: bool = True) -> PreparedTxnState:
    p = new_producer(transport, txn_id, two_phase=two_phase)
    p.init_transactions()
    p.begin_transaction()
    p.produce("t", value, partition=0)
    return p.prepare_transaction()


def fate(transport, txn_id: str, state: PreparedTxnState) -> str | None:
    found = [t for t in transport.model.txns
             if t.transactional_id == txn_id and t.identity == ProducerIdentity.of(state)]
    assert len(found) == 1
    return found[0].fate


