"""Adversarial review of b5ec3c6 (issue 32, following the cluster's two-phase commit): the initialisation and the
between-transaction bumps when InitProducerId v6 goes away under a running client. Each test fails on b5ec3c6."""

import pytest

from kafka2pc._core import codes
from kafka2pc._core.initialization import Initialization, Initialized
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
from kafka2pc.errors import FatalError, RetriableError

ME = ProducerIdentity(7, 0)


def _answer(command):
    """A cluster being turned off, rolling: the coordinator's connection can no longer send InitProducerId v6 (the
    transport reports UNSUPPORTED_VERSION), and reading every broker's ApiVersions again fails (one broker is down
    while still in the client's metadata), so ReadClusterFacts gives back the old facts, as old as they were."""
    if isinstance(command, ReadClusterFacts):
        return FactsAnswer(ClusterFacts(6, 1, versions_age_s=None))
    if isinstance(command, InitProducerId) and command.enable_2pc:
        return InitAnswer(codes.UNSUPPORTED_VERSION)
    if isinstance(command, ReadBrokerConfig):
        return ConfigValue("900000")
    assert isinstance(command, InitProducerId)
    return InitAnswer(codes.NONE, ME)


def test_enable_2pc_refused_by_the_connection_with_versions_unreadable_is_never_a_fatal_error():
    """Rolling turn-off of two-phase commit: a fresh producer whose Enable2Pc the connection refuses, while one broker
    does not answer ApiVersions, must fall back (or fail retriably). On b5ec3c6 it re-sends Enable2Pc on the stale
    facts and raises KafkaProtocolError(UNSUPPORTED_VERSION), a FatalError: a Spark task fails for good, a
    DualWriter's application sees a fatal error."""
    plan = Initialization("t", keep_prepared=False, two_phase_wanted=True, init_producer_id_max_version=6,
                          transaction_version=1, timeout_ms=None, versions_age_s=0.0)
    sent = []
    step = plan.start()
    try:
        for _ in range(10):  # bounded
            if isinstance(step, Finished):
                break
            sent.append(step)
            step = plan.on_answer(_answer(step))
    except FatalError as exc:
        pytest.fail(f"a fresh init on a cluster turning two-phase commit off raised a FatalError ({exc!r}); "
                    f"commands sent: {sent}")
    except RetriableError:
        return  # acceptable: the caller retries once the brokers answer
    assert isinstance(step, Finished) and isinstance(step.result, Initialized)
    assert not step.result.setup.two_phase and plan.two_phase_turned_off
    assert sum(1 for c in sent if isinstance(c, InitProducerId) and c.enable_2pc) == 1, sent
