"""What the scenario tests against the coordinator model share: a cluster, producers, prepared and committed
transactions."""

from __future__ import annotations

import logging

from kafka2pc import PreparedTxnState, TwoPhaseProducer
from kafka2pc._core.messages import ProducerIdentity
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport

TXN_ID = "app-0"
logging.getLogger("kafka2pc").setLevel(logging.ERROR)


def cluster(version: int, *, first_epoch: int = -1) -> ModelTransport:
    return ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=version >= 2,
                                           first_epoch=first_epoch), Faults())


def producer(transport: ModelTransport) -> TwoPhaseProducer:
    return TwoPhaseProducer({"bootstrap.servers": "model:9092", "transactional.id": TXN_ID, "linger.ms": 0},
                            two_phase_commit=True, transport=transport)


def prepared(transport: ModelTransport, *values: bytes) -> PreparedTxnState:
    p = producer(transport)
    p.init_transactions()
    p.begin_transaction()
    p.produce_batch("t", list(values), partition=0)
    return p.prepare_transaction()  # and the process dies: the transaction stays prepared


def committed(transport: ModelTransport, *values: bytes) -> None:
    """A producer commits ``values`` and goes away: the id is idle, at an identity it no longer holds."""
    p = producer(transport)
    p.init_transactions()
    p.begin_transaction()
    p.produce_batch("t", list(values), partition=0)
    p.commit_transaction()


def fate(transport: ModelTransport, state: PreparedTxnState) -> str | None:
    found = [t for t in transport.model.txns if t.identity == ProducerIdentity.of(state)]
    assert len(found) == 1
    return found[0].fate
