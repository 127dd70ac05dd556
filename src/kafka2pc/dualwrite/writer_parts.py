"""What a dual writer is made of, whatever its edge: its Kafka side (a cluster client, or a model's transport) and
its protocol (:class:`~kafka2pc.dualwrite.protocol.WriterProtocol`) over its state table."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Protocol

from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig, ProducerConfig
from kafka2pc.config.keys import PRODUCER_KEYS
from kafka2pc.dualwrite.connection import DbapiConnection
from kafka2pc.dualwrite.leases import Lease
from kafka2pc.dualwrite.protocol import WriterProtocol
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import ConfigError
from kafka2pc.producer import Transport, TwoPhaseProducer
from kafka2pc.transaction_control import ControlTransport, TransactionControl

#: the clock of two-phase decisions (monotonic)
_now = time.monotonic


class ClusterTransport(Transport, ControlTransport, Protocol):
    """What a dual writer needs of a cluster when it is not given a real one (a coordinator model, in tests)."""


class WriterCluster:
    """A writer's Kafka side: makes its producers and controls (no I/O), and owns its connections."""

    def __init__(self, config: Mapping[str, object], *, two_phase_commit: bool, transport: ClusterTransport | None):
        self.config, self.two_phase_commit = dict(config), two_phase_commit
        self.producer_config = ProducerConfig.from_dict(config, two_phase_commit=two_phase_commit)
        self.transactional_id = self.producer_config.transactional_id
        self._client_config = None if transport is not None else \
            ClientConfig.from_dict(self.config, consumed_elsewhere=PRODUCER_KEYS)
        self.client: ClusterClient | None = None
        self._transport = transport

    def connect(self) -> WriterCluster:
        """Make the cluster client (it connects to the bootstrap servers, waiting up to max.block.ms): before the
        first producer. Blocking; settings were checked when this was made."""
        if self._client_config is not None and self.client is None:
            self.client = ClusterClient(self._client_config,
                                        bootstrap_timeout_s=self.producer_config.max_block_ms / 1000,
                                        client_id=f"kafka2pc-{self.transactional_id}")
        return self

    def new_producer(self) -> TwoPhaseProducer:
        if self.client is not None:
            return TwoPhaseProducer(self.config, two_phase_commit=self.two_phase_commit, cluster=self.client)
        assert self._transport is not None, "connect() first"
        return TwoPhaseProducer(self.config, two_phase_commit=self.two_phase_commit, transport=self._transport)

    def new_control(self) -> TransactionControl:
        if self.client is not None:
            return TransactionControl(self.client)
        assert self._transport is not None, "connect() first"
        return TransactionControl(self._transport)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def transactional_id_of(config: Mapping[str, object]) -> str:
    """The configured transactional id; ConfigError without one."""
    transactional_id = str(config.get("transactional.id") or "")
    if not transactional_id:
        raise ConfigError("transactional.id", "is required: one writer instance = one transactional id")
    return transactional_id


def writer_protocol(db: DbapiConnection, table: StateTable, cluster: WriterCluster, *, lease: Lease | None,
                    lease_s: float) -> WriterProtocol:
    """A writer's protocol on ``db``'s state table. A leased writer's transactions end themselves when left idle in
    the database for a lease (a frozen process: its row frees for a claim); a recovery's waits on Kafka (up to
    max.block.ms) get that long more."""
    recovery_idle_limit_ms: int | None = None
    if lease is not None:
        table.idle_limit_ms = int(lease_s * 1000)
        recovery_idle_limit_ms = max(int(lease_s * 1000), cluster.producer_config.max_block_ms + 5000)
    transactional_id = cluster.transactional_id
    return WriterProtocol(
        transactional_id, db, table, new_producer=cluster.new_producer, new_control=cluster.new_control,
        two_phase_commit=cluster.two_phase_commit, owner=lease.token if lease is not None else uuid.uuid4().hex,
        lease=(lease.token, lease_s) if lease is not None else None, recovery_idle_limit_ms=recovery_idle_limit_ms,
        # the metrics' prefix label: a pool's (its ids are <prefix>-<n>), else this writer's id
        metric_prefix=transactional_id.rsplit("-", 1)[0] if lease is not None else transactional_id,
        now=_now)
