"""TransactionControl against the coordinator model: the facade the sink, the Spark sink, the dual writer and the
CLI stand on."""

from __future__ import annotations

import logging

import pytest

from kafka2pc import TransactionOutcome, TwoPhaseProducer
from kafka2pc._core.messages import ObservedTransaction, ProducerIdentity
from kafka2pc.errors import BrokerUnavailableError, TransactionLostError, TransactionOutcomeUnknownError
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport

logging.getLogger("kafka2pc").setLevel(logging.ERROR)


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def transport(request):
    return ModelTransport(CoordinatorModel(transaction_version=request.param, two_phase_enabled=True), Faults())


def prepared(transport, txn_id="app-0", value=b"x"):
    producer = TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": txn_id}, two_phase_commit=True,
                                transport=transport)
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("t", value, partition=0)
    return producer.prepare_transaction()


def test_describe_reports_the_coordinators_view(transport):
    control = TransactionControl(transport)
    assert control.describe("unknown") is None and control.describe_full("unknown") is None
    state = prepared(transport)
    assert control.describe("app-0") == ObservedTransaction("Ongoing", state.producer_id, state.epoch)
    full = control.describe_full("app-0")
    assert full is not None and full.partitions == (("t", 0),) and full.observed == control.describe("app-0")


def test_describe_all_answers_each_id_or_its_error(transport):
    prepared(transport, "a")
    transport.faults.failed_describes.extend([False, True])
    rounds = transport.rounds
    seen = TransactionControl(transport).describe_all(["a", "b"])
    assert transport.rounds == rounds + 1  # one round for both; b's lost answer is not worth sending again
    assert seen[0] is not None and seen[0].state == "Ongoing"
    assert isinstance(seen[1], BrokerUnavailableError)


def test_commit_all_and_abort_all_settle_each_transaction_exactly(transport):
    control = TransactionControl(transport)
    states = {txn_id: prepared(transport, txn_id, txn_id.encode()) for txn_id in ("a", "b", "c")}
    committed = control.commit_all([("a", states["a"]), ("b", states["b"])])
    assert [s.outcome for s in committed] == [TransactionOutcome.COMMITTED] * 2
    (aborted,) = control.abort_all([("c", states["c"])])
    assert aborted.outcome is TransactionOutcome.ABORTED
    assert sorted(transport.model.committed_records()) == [b"a", b"b"] and transport.model.open_transactions() == []
    with pytest.raises((TransactionLostError, TransactionOutcomeUnknownError)):  # v1: the abort fenced it since
        control.commit("c", states["c"])


def test_fence_takes_the_id_over_and_aborts_what_it_had_open(transport):
    state = prepared(transport)
    identity = TransactionControl(transport).fence("app-0")
    assert identity.producer_id == state.producer_id and identity.epoch > state.epoch
    assert transport.model.open_transactions() == []


def test_abort_ongoing_only_touches_the_producer_id_it_was_told(transport):
    control = TransactionControl(transport)
    state = prepared(transport)
    assert control.abort_ongoing("app-0", producer_id=state.producer_id + 1) is None
    assert control.abort_ongoing("app-0", producer_id=state.producer_id) == \
        ObservedTransaction("Ongoing", state.producer_id, state.epoch)
    assert transport.model.open_transactions() == []


def test_wait_until_settled_returns_what_it_saw(transport):
    assert TransactionControl(transport).wait_until_settled("nothing", within_s=1.0) is None
    state = prepared(transport)
    observed = TransactionControl(transport).wait_until_settled("app-0", within_s=1.0)
    assert observed is not None and observed.identity == ProducerIdentity.of(state)


def test_broker_configs_and_the_clusters_protocol(transport):
    control = TransactionControl(transport)
    assert control.broker_config("transaction.two.phase.commit.enable") == "true"
    assert control.transaction_version == transport.model.transaction_version


def test_a_lost_answer_is_sent_again_and_one_lost_for_good_is_unavailable(transport):
    control = TransactionControl(transport)
    state = prepared(transport)
    transport.faults.retried_answers.append(True)  # the EndTxn's answer is lost once: the machine sends it again
    assert control.commit("app-0", state).outcome is TransactionOutcome.COMMITTED
    transport.faults.failed_describes.append(True)
    with pytest.raises(BrokerUnavailableError):
        control.describe("app-0")


def test_a_protocol_1_learnt_is_read_again_once_old_and_a_2_stands(monkeypatch):
    """The cluster may finalize transaction.version 2 under a running control (review 32c): a 1 it learnt is read
    again once VERSIONS_MAX_AGE_S old; a 2 is kept; the finalized level counts, not what this client can send."""
    import kafka2pc.transaction_control as control_module  # noqa: PLC0415
    from kafka2pc._core.initialization import VERSIONS_MAX_AGE_S  # noqa: PLC0415
    from kafka2pc._core.messages import ClusterFacts  # noqa: PLC0415

    clock = [100.0]
    monkeypatch.setattr(control_module.time, "monotonic", lambda: clock[0])
    levels, asked = [1, 2, 1], []

    class Facts:
        def cluster_facts(self):
            asked.append(clock[0])
            return ClusterFacts(5, 1, finalized_transaction_version=levels[len(asked) - 1])

    control = control_module.TransactionControl(Facts())  # type: ignore[arg-type]
    assert control.transaction_version == 1
    clock[0] += VERSIONS_MAX_AGE_S / 2
    assert control.transaction_version == 1 and len(asked) == 1
    clock[0] += VERSIONS_MAX_AGE_S
    assert control.transaction_version == 2  # finalized 2, though this client could only send protocol 1
    clock[0] += 10 * VERSIONS_MAX_AGE_S
    assert control.transaction_version == 2 and len(asked) == 2
