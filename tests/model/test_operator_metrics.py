"""The metrics operators alert on (issue 32, part 4), read from prometheus_client's registry as a scrape would see
them, against the coordinator model: the phases' histograms, the oldest open transaction per prefix, fallbacks by
reason, and transactions settled by recovery by reason."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from kafka2pc import TwoPhaseProducer, metrics
from kafka2pc._core import codes
from kafka2pc._core.messages import (
    ClusterFacts,
    ConfigValue,
    FactsAnswer,
    InitAnswer,
    InitProducerId,
    ReadBrokerConfig,
    ReadClusterFacts,
)

from .coordinator import CoordinatorModel, Faults, ModelTransport

logging.getLogger("kafka2pc").setLevel(logging.ERROR)
CONFIG = {"bootstrap.servers": "model:9092", "linger.ms": 0}


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def cluster(version: int = 2, *, two_phase: bool = True) -> ModelTransport:
    return ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=two_phase), Faults())


def producer(transport: ModelTransport, txn_id: str) -> TwoPhaseProducer:
    p = TwoPhaseProducer({**CONFIG, "transactional.id": txn_id}, two_phase_commit=True, transport=transport)
    p.init_transactions()
    return p


# -- the phases' histograms ------------------------------------------------------------------------------------------

def test_a_producers_prepare_and_completion_are_timed_under_its_path():
    transport = cluster()
    p = producer(transport, "hist-0")
    before = {phase: value(f"kafka2pc_{phase}_seconds_count", path="producer") for phase in ("prepare", "complete")}
    on_behalf = value("kafka2pc_prepare_seconds_count", path="dual_write")
    p.begin_transaction()
    p.produce("t", b"1", partition=0)
    state = p.prepare_transaction()
    p.complete_transaction(state)
    p.begin_transaction()
    p.produce("t", b"2", partition=0)
    p.abort_transaction()
    assert value("kafka2pc_prepare_seconds_count", path="producer") == before["prepare"] + 1
    assert value("kafka2pc_complete_seconds_count", path="producer") == before["complete"] + 2  # commit and abort
    with metrics.on_behalf_of("dual_write"):  # an engine driving the producer: counted once, under the engine
        p.begin_transaction()
        p.produce("t", b"3", partition=0)
        p.prepare_transaction()
    assert value("kafka2pc_prepare_seconds_count", path="dual_write") == on_behalf + 1
    assert value("kafka2pc_prepare_seconds_count", path="producer") == before["prepare"] + 1
    assert value("kafka2pc_prepare_seconds_bucket", path="producer", le="300.0") >= 1  # the buckets reach minutes


# -- fallbacks, by reason ------------------------------------------------------------------------------------------

class Advertising6(ModelTransport):
    """Brokers that advertise InitProducerId v6 whatever their two-phase config (unstable.api.versions.enable)."""

    def cluster_facts(self) -> ClusterFacts:
        return ClusterFacts(6, self.model.transaction_version)


class ConfigUnreadable(Advertising6):
    """... whose configs this principal cannot read (no DESCRIBE_CONFIGS on the cluster)."""

    def execute(self, transactional_id, command):
        if isinstance(command, ReadBrokerConfig):
            self.sent.append(command)
            return ConfigValue(None)
        return super().execute(transactional_id, command)


class V6Gone(Advertising6):
    """The client learnt v6; the brokers no longer speak it (two-phase commit turned off under it)."""

    def execute(self, transactional_id, command):
        if isinstance(command, InitProducerId) and command.enable_2pc:
            self.sent.append(command)
            return InitAnswer(codes.UNSUPPORTED_VERSION)
        if isinstance(command, ReadClusterFacts):
            self.sent.append(command)
            return FactsAnswer(ClusterFacts(5, self.model.transaction_version))
        return super().execute(transactional_id, command)


@pytest.mark.parametrize(("transport_class", "two_phase", "reason"), [
    (ModelTransport, False, "no_v6"),        # a broker before KIP-939
    (Advertising6, False, "config_off"),     # transaction.two.phase.commit.enable=false
    (ConfigUnreadable, False, "acl"),        # refused, and the config cannot be read: TWO_PHASE_COMMIT missing?
    (V6Gone, True, "turned_off"),            # v6 gone under a running client
])
def test_each_fallback_is_counted_under_its_reason(transport_class, two_phase, reason):
    transport = transport_class(CoordinatorModel(transaction_version=2, two_phase_enabled=two_phase), Faults())
    before = {r: value("kafka2pc_two_phase_commit_fallbacks_total", reason=r) for r in metrics.FALLBACK_REASONS}
    p = producer(transport, f"fallback-{reason}")
    assert not p.two_phase_commit_active
    after = {r: value("kafka2pc_two_phase_commit_fallbacks_total", reason=r) for r in metrics.FALLBACK_REASONS}
    assert {r: after[r] - before[r] for r in after if after[r] != before[r]} == {reason: 1.0}


def test_a_producer_with_two_phase_commit_counts_no_fallback():
    before = sum(value("kafka2pc_two_phase_commit_fallbacks_total", reason=r) for r in metrics.FALLBACK_REASONS)
    assert producer(cluster(), "no-fallback").two_phase_commit_active
    assert sum(value("kafka2pc_two_phase_commit_fallbacks_total", reason=r) for r in metrics.FALLBACK_REASONS) == before
