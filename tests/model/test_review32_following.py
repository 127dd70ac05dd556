"""Adversarial review of b5ec3c6 (issue 32, following the cluster's two-phase commit), against the coordinator model:
what a running producer and a dual writer do once two-phase commit is turned off, and what a cluster that never had
it on is told. Each test fails on b5ec3c6."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from kafka2pc import TwoPhaseProducer
from kafka2pc._core import codes
from kafka2pc._core.initialization import DECISION_STANDS_S
from kafka2pc._core.messages import ClusterFacts, InitAnswer, InitProducerId
from kafka2pc.dualwrite import DualWriter
from kafka2pc.dualwrite import writer_parts as dual_writer
from kafka2pc.errors import BrokerUnavailableError, FatalError

from .coordinator import CoordinatorModel, ModelTransport

CONFIG = {"bootstrap.servers": "model:9092", "linger.ms": 0}


class TurnedOff(ModelTransport):
    """The model behind kafka2pc's KafkaTransport once the brokers stop speaking InitProducerId v6 (two-phase commit
    and unstable.api.versions.enable turned off): an InitProducerId with Enable2Pc cannot be sent, which the
    transport reports as UNSUPPORTED_VERSION (kafka_transport.py, since b5ec3c6)."""

    def __init__(self, model: CoordinatorModel):
        super().__init__(model)
        self.off = False
        self.refused = 0

    def execute(self, transactional_id, command):
        if self.off and isinstance(command, InitProducerId) and command.enable_2pc:
            self.sent.append(command)
            self.refused += 1
            return InitAnswer(codes.UNSUPPORTED_VERSION)
        return super().execute(transactional_id, command)


def test_a_v1_producer_whose_bump_can_no_longer_be_sent_is_told_so_not_told_to_retry():
    """Transaction protocol v1 with two-phase commit: between transactions the producer bumps its epoch with
    InitProducerId (Enable2Pc). Once v6 is gone, b5ec3c6's transport answers that bump UNSUPPORTED_VERSION, which
    Bumping reads as "in doubt, may have landed": it looks and re-sends it 20 times, then raises a retriable
    BrokerUnavailableError ("stayed busy") — at every begin_transaction, for ever. Before b5ec3c6 the refusal was
    an UnsupportedByBrokerError. A bump the connection refused never reached a broker: it is not in doubt."""
    transport = TurnedOff(CoordinatorModel(transaction_version=1, two_phase_enabled=True))
    producer = TwoPhaseProducer({**CONFIG, "transactional.id": "v1"}, two_phase_commit=True, transport=transport)
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("t", b"1", partition=0)
    producer.commit_transaction()
    transport.off = True  # two-phase commit turned off under the running producer
    with pytest.raises(Exception) as raised:
        producer.begin_transaction()
    print(f"\nbegin_transaction: {type(raised.value).__name__} after {transport.refused} refused InitProducerId")
    assert transport.refused == 1, "a bump the connection could not send was sent again as if it were in doubt"
    assert isinstance(raised.value, FatalError) and not isinstance(raised.value, BrokerUnavailableError)


class NeverOn(ModelTransport):
    """A cluster that advertises InitProducerId v6 (unstable.api.versions.enable=true, for another feature) but never
    had transaction.two.phase.commit.enable on: Enable2Pc is refused, the config says false."""

    def cluster_facts(self) -> ClusterFacts:
        return ClusterFacts(6, self.model.transaction_version)


def test_a_cluster_that_never_had_two_phase_commit_is_not_reported_as_turned_off_every_30_s(tmp_path, monkeypatch,
                                                                                          caplog):
    """On b5ec3c6 every fallback whose reason is transaction.two.phase.commit.enable=false is the ERROR "two-phase
    commit is turned OFF ... Transactions prepared while it was on are NOT aborted", whether or not it was ever on;
    and a dual writer initialises again every DECISION_STANDS_S, so a writer on such a cluster logs that ERROR every
    30 s for as long as it runs (a pool of N writers: N every 30 s). Should a release advertise InitProducerId v6 by
    default, with the setting off by default, that is every dual writer on a default-configured cluster."""
    clock = [1000.0]
    monkeypatch.setattr(dual_writer, "_now", lambda: clock[0])
    transport = NeverOn(CoordinatorModel(transaction_version=2, two_phase_enabled=False))
    connection = sqlite3.connect(tmp_path / "db.sqlite")
    writer = DualWriter(connection, {**CONFIG, "transactional.id": "never-on"}, transport=transport)
    with caplog.at_level(logging.WARNING, logger="kafka2pc.producer"):
        for number in range(4):
            with writer.transaction() as tx:
                tx.produce("t", value=str(number).encode(), partition=0)
            clock[0] += DECISION_STANDS_S
    writer.close()
    assert not writer.two_phase_commit_active
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "turned OFF" in r.getMessage()]
    print(f"\n{len(errors)} ERROR 'turned OFF' records for a cluster that never had two-phase commit on")
    assert errors == [], [r.getMessage()[:120] for r in errors]
