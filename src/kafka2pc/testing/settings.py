"""Broker settings a test asks for: version, 2PC on or off, and any extra server properties."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import attrs

from kafka2pc.testing.jars import NEWEST_KAFKA_VERSION


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _frozen_mapping(value: Mapping[str, object]) -> Mapping[str, str]:
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


@attrs.frozen
class BrokerSettings:
    """What a test needs of its brokers.

    ``two_phase_commit`` turns on ``transaction.two.phase.commit.enable`` and ``unstable.api.versions.enable`` (which
    InitProducerId v6 needs to be advertised) on releases that know them, 4.1 and later; on older releases it is
    ignored, since they cannot do 2PC at all.
    """

    version: str = NEWEST_KAFKA_VERSION
    two_phase_commit: bool = True
    transaction_max_timeout_ms: int | None = None
    extra: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_mapping)

    @property
    def knows_two_phase_commit(self) -> bool:
        """Whether this release has KIP-939's broker config."""
        return _version_tuple(self.version) >= (4, 1)

    def server_properties(self, nodes: int) -> dict[str, str]:
        """Cluster-wide server properties for a cluster of ``nodes`` combined broker+controller nodes."""
        min_isr = str(min(2, nodes))
        props = {
            "num.partitions": "1",
            "default.replication.factor": str(nodes),
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": str(nodes),
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": str(nodes),
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "5",
            "group.initial.rebalance.delay.ms": "0",
            "unclean.leader.election.enable": "false",
            "broker.session.timeout.ms": "6000",
            "broker.heartbeat.interval.ms": "1000",
            "auto.create.topics.enable": "false",
        }
        if self.knows_two_phase_commit:
            props["transaction.two.phase.commit.enable"] = str(self.two_phase_commit).lower()
            if self.two_phase_commit:
                props["unstable.api.versions.enable"] = "true"
        if self.transaction_max_timeout_ms is not None:
            props["transaction.max.timeout.ms"] = str(self.transaction_max_timeout_ms)
        props.update(self.extra)
        return props
