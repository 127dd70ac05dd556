"""A producer made without two_phase_commit=True may prepare, but says once that its transaction times out."""

from __future__ import annotations

import logging

import pytest

from kafka2pc import TwoPhaseProducer

from .support import TXN_ID, cluster

pytestmark = pytest.mark.model


class Said(logging.Handler):
    """The kafka2pc logger's records, without pytest's logging plugin (``make chaos`` runs with ``-p no:logging``,
    which removes ``caplog``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def said():
    handler, logger = Said(), logging.getLogger("kafka2pc")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.parametrize("two_phase", [False, True])
def test_a_plain_producer_that_prepares_warns_once_that_its_transaction_times_out(two_phase, said):
    p = TwoPhaseProducer({"bootstrap.servers": "model:9092", "transactional.id": TXN_ID, "linger.ms": 0},
                         two_phase_commit=two_phase, transport=cluster(2))
    p.init_transactions()
    for value in (b"a", b"b"):
        p.begin_transaction()
        p.produce("t", value=value)
        p.complete_transaction(p.prepare_transaction())
    warned = [r.getMessage() for r in said.records if "made without two_phase_commit=True" in r.getMessage()]
    if two_phase:
        assert warned == []
    else:
        assert len(warned) == 1 and "transaction.timeout.ms=60000" in warned[0], warned
