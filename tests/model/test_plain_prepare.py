"""A producer made without two_phase_commit=True may prepare, but says once that its transaction times out."""

from __future__ import annotations

import logging

import pytest

from kafka2pc import TwoPhaseProducer

from .support import TXN_ID, cluster

pytestmark = pytest.mark.model


@pytest.mark.parametrize("two_phase", [False, True])
def test_a_plain_producer_that_prepares_warns_once_that_its_transaction_times_out(two_phase, caplog):
    caplog.set_level(logging.WARNING, logger="kafka2pc")
    p = TwoPhaseProducer({"bootstrap.servers": "model:9092", "transactional.id": TXN_ID, "linger.ms": 0},
                         two_phase_commit=two_phase, transport=cluster(2))
    p.init_transactions()
    for value in (b"a", b"b"):
        p.begin_transaction()
        p.produce("t", value=value)
        p.complete_transaction(p.prepare_transaction())
    said = [r.getMessage() for r in caplog.records if "made without two_phase_commit=True" in r.getMessage()]
    if two_phase:
        assert said == []
    else:
        assert len(said) == 1 and "transaction.timeout.ms=60000" in said[0], said
