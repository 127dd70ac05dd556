"""The two-phase decision follows the cluster while a job runs: a fallback for want of InitProducerId v6 is decided
only on ApiVersions read lately (a running client keeps the ones it learnt when it connected, and an upgraded broker
would never be used), and a producer that goes on between transactions without an InitProducerId is replaced once
its decision is older than DECISION_STANDS_S."""

import pytest

from kafka2pc._core import codes
from kafka2pc._core.initialization import (
    DECISION_STANDS_S,
    VERSIONS_MAX_AGE_S,
    Initialization,
    Initialized,
    decision_stands,
)
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import (
    ClusterFacts,
    ConfigValue,
    FactsAnswer,
    InitAnswer,
    InitProducerId,
    ProducerIdentity,
    ReadBrokerConfig,
    ReadClusterFacts,
)
from kafka2pc._core.setup import TransactionSetup

ME = ProducerIdentity(5, 0)


def init(*, max_version=5, age_s, two_phase=True, version=1):
    return Initialization("t", keep_prepared=False, two_phase_wanted=two_phase,
                          init_producer_id_max_version=max_version, transaction_version=version, timeout_ms=None,
                          versions_age_s=age_s)


@pytest.mark.parametrize("age_s", [None, VERSIONS_MAX_AGE_S + 0.1, 3600.0])
def test_a_broker_that_gained_v6_since_the_client_connected_gets_enable_2pc(age_s):
    plan = init(age_s=age_s)
    assert plan.start() == ReadClusterFacts()  # never a fallback on versions this old
    # read again: the broker was upgraded in place (and its transaction protocol with it)
    assert plan.on_answer(FactsAnswer(ClusterFacts(6, 2, versions_age_s=0.0))) == InitProducerId(60_000,
                                                                                                 enable_2pc=True)
    assert plan.on_answer(InitAnswer(codes.NONE, ME)) == Finished(Initialized(TransactionSetup(2, True, 60_000), ME))
    assert plan.fallback_reason is None


def test_a_broker_still_without_v6_falls_back_after_one_read():
    plan = init(age_s=None)
    assert plan.start() == ReadClusterFacts()
    # a broker that did not answer leaves the old facts, as old as they were: read once, not again
    assert plan.on_answer(FactsAnswer(ClusterFacts(5, 1, versions_age_s=None))) == \
        ReadBrokerConfig("transaction.max.timeout.ms")
    assert plan.on_answer(ConfigValue("900000")) == InitProducerId(900_000)
    assert plan.on_answer(InitAnswer(codes.NONE, ME)) == Finished(Initialized(TransactionSetup(1, False, 900_000), ME))
    assert "InitProducerId up to v5" in plan.fallback_reason


@pytest.mark.parametrize(("max_version", "age_s", "two_phase"), [
    (5, VERSIONS_MAX_AGE_S - 1, True),   # read lately: the fallback stands on them
    (6, None, True),                     # v6 known: Enable2Pc is asked, whatever their age
    (5, None, False),                    # no two-phase commit wanted: nothing to decide
])
def test_versions_are_read_again_only_before_a_fallback_on_old_ones(max_version, age_s, two_phase):
    assert not isinstance(init(max_version=max_version, age_s=age_s, two_phase=two_phase).start(), ReadClusterFacts)


def test_a_broker_with_two_phase_commit_turned_off_says_so():
    plan = init(max_version=6, age_s=None)
    plan.start()
    plan.on_answer(InitAnswer(codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    plan.on_answer(ConfigValue("false"))
    assert plan.two_phase_turned_off and "transaction.two.phase.commit.enable=false" in plan.fallback_reason


@pytest.mark.parametrize(("decided_at", "now", "stands"), [
    (100.0, 100.0, True),
    (100.0, 100.0 + DECISION_STANDS_S - 0.1, True),
    (100.0, 100.0 + DECISION_STANDS_S, False),
    (None, 100.0, False),   # not known: decide again
])
def test_a_decision_stands_for_decision_stands_s(decided_at, now, stands):
    assert decision_stands(decided_at, now) is stands


def test_enable_2pc_that_can_no_longer_be_sent_reads_the_versions_again_and_falls_back_saying_so():
    """A running client still holds v6; the broker restarted with two-phase commit off and advertises only v5: the
    connection refuses to send Enable2Pc (UNSUPPORTED_VERSION), once."""
    plan = init(max_version=6, age_s=5.0, version=2)
    assert plan.start() == InitProducerId(60_000, enable_2pc=True)
    assert plan.on_answer(InitAnswer(codes.UNSUPPORTED_VERSION)) == ReadClusterFacts()
    assert plan.on_answer(FactsAnswer(ClusterFacts(5, 2))) == ReadBrokerConfig("transaction.max.timeout.ms")
    assert plan.on_answer(ConfigValue("900000")) == InitProducerId(900_000)
    assert plan.on_answer(InitAnswer(codes.NONE, ME)) == Finished(Initialized(TransactionSetup(2, False, 900_000), ME))
    assert plan.two_phase_turned_off and "no longer advertises InitProducerId v6" in plan.fallback_reason
    assert "transaction.two.phase.commit.enable" in plan.fallback_reason


def test_enable_2pc_refused_as_unsupported_again_after_a_fresh_read_is_an_error_not_a_loop():
    plan = init(max_version=6, age_s=5.0, version=2)
    plan.start()
    plan.on_answer(InitAnswer(codes.UNSUPPORTED_VERSION))
    assert plan.on_answer(FactsAnswer(ClusterFacts(6, 2))) == InitProducerId(60_000, enable_2pc=True)
    with pytest.raises(Exception, match="UNSUPPORTED_VERSION"):
        plan.on_answer(InitAnswer(codes.UNSUPPORTED_VERSION))
