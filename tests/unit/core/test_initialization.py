"""Initialization: Enable2Pc where it is accepted, a visible fallback where it is not, and a keep-prepared recovery
that sends no InitProducerId when the coordinator cannot keep the transaction itself."""

import pytest

from kafka2pc._core import codes
from kafka2pc._core.initialization import Initialization, Initialized, Phase
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import (
    ConfigValue,
    Described,
    DescribeTransaction,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ObservedTransaction,
    ProducerIdentity,
    ReadBrokerConfig,
)
from kafka2pc._core.setup import TransactionSetup
from kafka2pc.errors import AuthorizationError, BrokerUnavailableError, ConfigError, ProducerFencedError
from kafka2pc.prepared_state import PreparedTxnState

ME = ProducerIdentity(5, 0)


def init(*, keep=False, two_phase=True, max_version=6, version=2, timeout_ms=None):
    return Initialization("t", keep_prepared=keep, two_phase_wanted=two_phase, init_producer_id_max_version=max_version,
                          transaction_version=version, timeout_ms=timeout_ms)


def test_two_phase_commit_where_the_broker_accepts_enable_2pc():
    plan = init()
    assert plan.start() == InitProducerId(60_000, enable_2pc=True) and plan.phase is Phase.INIT
    assert plan.on_answer(InitAnswer(codes.NONE, ME)) == Finished(Initialized(TransactionSetup(2, True, 60_000), ME))
    assert plan.fallback_reason is None


def test_a_broker_without_init_producer_id_v6_falls_back_at_its_maximum_timeout():
    plan = init(max_version=5)
    assert plan.start() == ReadBrokerConfig("transaction.max.timeout.ms")
    assert plan.on_answer(ConfigValue("900000")) == InitProducerId(900_000)
    result = plan.on_answer(InitAnswer(codes.NONE, ME))
    assert result == Finished(Initialized(TransactionSetup(2, False, 900_000), ME))
    assert "InitProducerId up to v5" in plan.fallback_reason


def test_a_configured_timeout_is_kept_in_the_fallback():
    plan = init(max_version=5, timeout_ms=30_000)
    assert plan.start() == InitProducerId(30_000)


def test_an_unreadable_maximum_assumes_kafkas_default_and_says_so():
    plan = init(max_version=5)
    plan.start()
    assert plan.on_answer(ConfigValue(None)) == InitProducerId(900_000)
    assert "could not be read" in plan.fallback_reason


@pytest.mark.parametrize(("config", "then"), [
    ("false", ReadBrokerConfig("transaction.max.timeout.ms")),   # 2PC off on the broker: fall back
    ("true", InitProducerId(60_000)),                              # an ACL is missing: which one?
    (None, ReadBrokerConfig("transaction.max.timeout.ms")),       # cannot tell: fall back, saying both
])
def test_enable_2pc_refused_reads_the_broker_config_to_tell_why(config, then):
    plan = init()
    plan.start()
    assert plan.on_answer(InitAnswer(codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)) == \
        ReadBrokerConfig("transaction.two.phase.commit.enable")
    assert plan.on_answer(ConfigValue(config)) == then


@pytest.mark.parametrize(("probe", "missing"), [(codes.NONE, "grant TWO_PHASE_COMMIT"),
                                                (codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "WRITE and TWO")])
def test_missing_acls_are_named(probe, missing):
    plan = init()
    plan.start()
    plan.on_answer(InitAnswer(codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    plan.on_answer(ConfigValue("true"))
    with pytest.raises(AuthorizationError, match=missing):
        plan.on_answer(InitAnswer(probe, ME if probe == codes.NONE else None))


def test_keep_prepared_where_the_coordinator_keeps_the_transaction():
    plan = init(keep=True)
    assert plan.start() == InitProducerId(60_000, enable_2pc=True, keep_prepared=True)
    kept = plan.on_answer(InitAnswer(codes.NONE, ProducerIdentity(5, 8), ongoing=ProducerIdentity(5, 7)))
    assert kept == Finished(Initialized(TransactionSetup(2, True, 60_000), ProducerIdentity(5, 8),
                                        PreparedTxnState(5, 7, 2), kept_by_broker=True))


def test_keep_prepared_where_the_coordinator_cannot_resumes_without_any_init_producer_id():
    plan = init(keep=True)
    plan.start()
    assert plan.on_answer(InitAnswer(codes.UNSUPPORTED_VERSION)) == DescribeTransaction()
    found = plan.on_answer(Described(ObservedTransaction("Ongoing", 5, 7)))
    assert found == Finished(Initialized(TransactionSetup(2, True, 60_000), None, PreparedTxnState(5, 7)))


def test_keep_prepared_without_two_phase_commit_only_looks():
    plan = init(keep=True, two_phase=False)
    assert plan.start() == DescribeTransaction()
    assert plan.on_answer(Described(ObservedTransaction("CompleteCommit", 5, 8))) == \
        Finished(Initialized(TransactionSetup(2, False, 60_000), None, None))


@pytest.mark.parametrize(("code", "error"), [(codes.PRODUCER_FENCED, ProducerFencedError),
                                             (codes.INVALID_TRANSACTION_TIMEOUT, ConfigError)])
def test_errors_become_what_the_caller_should_do(code, error):
    plan = init(two_phase=False)
    plan.start()
    with pytest.raises(error):
        plan.on_answer(InitAnswer(code))


def test_a_lost_answer_is_unavailable_and_the_call_may_be_retried():
    plan = init()
    plan.start()
    with pytest.raises(BrokerUnavailableError, match="initialising transactional id 't'"):
        plan.on_answer(NoAnswer("timed out"))
