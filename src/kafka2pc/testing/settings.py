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


#: The super user of secured test clusters (SASL/PLAIN); the harness and its helpers connect as this user.
ADMIN_USER, ADMIN_PASSWORD = "admin", "admin-secret"


@attrs.frozen
class BrokerSettings:
    """What a test needs of its brokers.

    ``two_phase_commit`` turns on ``transaction.two.phase.commit.enable`` and ``unstable.api.versions.enable`` (which
    InitProducerId v6 needs to be advertised) on releases that know them, 4.1 and later; on older releases it is
    ignored, since they cannot do 2PC at all.

    ``sasl_users`` (name -> password) secures the cluster: clients authenticate with SASL/PLAIN and KRaft's
    StandardAuthorizer enforces ACLs. ``admin`` is always a super user.
    """

    version: str = NEWEST_KAFKA_VERSION
    two_phase_commit: bool = True
    transaction_max_timeout_ms: int | None = None
    extra: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_mapping)
    sasl_users: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_mapping)

    @property
    def security_protocol(self) -> str:
        """The protocol of the client listener."""
        return "SASL_PLAINTEXT" if self.sasl_users else "PLAINTEXT"

    def client_config(self, bootstrap_servers: str, user: str = ADMIN_USER) -> dict[str, object]:
        """Client settings (Kafka's dotted names) to connect as ``user``."""
        config: dict[str, object] = {"bootstrap.servers": bootstrap_servers}
        if self.sasl_users:
            password = ADMIN_PASSWORD if user == ADMIN_USER else self.sasl_users[user]
            config.update({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                           "sasl.username": user, "sasl.password": password})
        return config

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
        if self.sasl_users:
            users = {ADMIN_USER: ADMIN_PASSWORD, **self.sasl_users}
            accounts = " ".join(f'user_{name}="{password}"' for name, password in users.items())
            props.update({
                "sasl.enabled.mechanisms": "PLAIN",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                    "org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="{ADMIN_USER}" password="{ADMIN_PASSWORD}" {accounts};',
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                # the controller listener is plaintext: its principal is ANONYMOUS
                "super.users": f"User:{ADMIN_USER};User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "false",
            })
        if self.transaction_max_timeout_ms is not None:
            props["transaction.max.timeout.ms"] = str(self.transaction_max_timeout_ms)
        props.update(self.extra)
        return props
