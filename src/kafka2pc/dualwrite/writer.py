"""DualWriter: one database transaction and one Kafka transaction, committed atomically (docs/dual-write.md).

The protocol is :mod:`kafka2pc.dualwrite.protocol`'s; this is its blocking edge (:mod:`.blocking`), for DB-API and
SQLAlchemy connections. :mod:`kafka2pc.dualwrite.aio` is the asyncio one."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig, ProducerConfig
from kafka2pc.config.keys import PRODUCER_KEYS
from kafka2pc.dualwrite import blocking
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import Lease
from kafka2pc.dualwrite.protocol import WriterProtocol
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import ConfigError, DualWriteUsageError
from kafka2pc.producer import Transport, TwoPhaseProducer
from kafka2pc.transaction_control import ControlTransport, TransactionControl

log = logging.getLogger(__name__)

#: the clock of two-phase decisions (monotonic)
_now = time.monotonic


class ClusterTransport(Transport, ControlTransport, Protocol):
    """What a dual writer needs of a cluster when it is not given a real one (a coordinator model, in tests)."""


class DualWriteTransaction:
    """The inside of ``with writer.transaction() as tx``: ``tx.cursor`` (a DB-API cursor) or ``tx.connection`` (the
    writer's connection: a SQLAlchemy ``Connection`` when it was given one or an ``Engine``) for the database,
    ``tx.produce`` for Kafka."""

    def __init__(self, cursor: Any, producer: TwoPhaseProducer, connection: Any):
        self.cursor = cursor
        self.connection = connection
        self._producer = producer

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
                headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None = None) -> None:
        """Add a record to the Kafka transaction (TwoPhaseProducer.produce's arguments)."""
        self._producer.produce(topic, value, key, partition, headers)


class DualWriter:
    """Commits a DB-API connection's transaction and a Kafka transaction atomically, under one transactional id.

    ``config`` is a TwoPhaseProducer configuration (``bootstrap.servers``, ``transactional.id``, ...). One writer
    per transactional id at a time: a second one with the same id fences the first (in Kafka, and in the database
    through the state row's owner). ``transport`` replaces the network (a coordinator model, in tests). ``lease``
    and ``lease_s`` are set by DualWriterPool: the writer then uses the id only while its lease holds."""

    def __init__(self, connection: Any, config: Mapping[str, object], *, two_phase_commit: bool = True,
                 state_table: str = "kafka2pc_dual_write_state", create_state_table: bool = True,
                 transport: ClusterTransport | None = None, lease: Lease | None = None, lease_s: float = 15.0):
        self.transactional_id = str(config.get("transactional.id") or "")
        if not self.transactional_id:
            raise ConfigError("transactional.id", "is required: one writer instance = one transactional id")
        self._db = adapt(connection)
        self._table = StateTable(self._db, state_table, create=create_state_table)
        self._config, self._two_phase_commit = dict(config), two_phase_commit
        producer_config = ProducerConfig.from_dict(config, two_phase_commit=two_phase_commit)
        self._client: ClusterClient | None = None
        if transport is None:
            self._client = ClusterClient(ClientConfig.from_dict(dict(config), consumed_elsewhere=PRODUCER_KEYS),
                                         bootstrap_timeout_s=producer_config.max_block_ms / 1000,
                                         client_id=f"kafka2pc-{self.transactional_id}")
        self._transport = transport
        owner = lease.token if lease is not None else uuid.uuid4().hex
        # a leased writer's transactions end themselves when left idle in the database for a lease (a frozen
        # process: its row frees for a claim); a recovery's waits on Kafka (up to max.block.ms) get that long more
        recovery_idle_limit_ms: int | None = None
        if lease is not None:
            self._table.idle_limit_ms = int(lease_s * 1000)
            recovery_idle_limit_ms = max(int(lease_s * 1000), producer_config.max_block_ms + 5000)
        self._protocol = WriterProtocol(
            self.transactional_id, self._db, self._table, new_producer=self._new_producer,
            new_control=self._control, two_phase_commit=two_phase_commit, owner=owner,
            lease=(lease.token, lease_s) if lease is not None else None, recovery_idle_limit_ms=recovery_idle_limit_ms,
            # the metrics' prefix label: a pool's (its ids are <prefix>-<n>), else this writer's id
            metric_prefix=self.transactional_id.rsplit("-", 1)[0] if lease is not None else self.transactional_id,
            now=_now)
        self._in_block = False

    def _new_producer(self) -> TwoPhaseProducer:
        if self._client is not None:
            return TwoPhaseProducer(self._config, two_phase_commit=self._two_phase_commit, cluster=self._client)
        return TwoPhaseProducer(self._config, two_phase_commit=self._two_phase_commit, transport=self._transport)

    def _control(self) -> TransactionControl:
        if self._client is not None:
            return TransactionControl(self._client)
        assert self._transport is not None
        return TransactionControl(self._transport)

    @property
    def connection(self) -> Any:
        """The connection the writer works through: the DB-API or SQLAlchemy connection it was given, or the one it
        checked out of a SQLAlchemy Engine."""
        return self._db.given

    @property
    def lease_token(self) -> str | None:
        """The token of the lease this writer holds its id by (a pool's writer), else None."""
        return None if self._protocol.lease is None else self._protocol.lease[0]

    @property
    def two_phase_commit_active(self) -> bool:
        """Whether Kafka prepared transactions are free of the broker's timeout (see TwoPhaseProducer)."""
        return self._protocol.producer.two_phase_commit_active

    def recover(self) -> None:
        """Settle what a crashed predecessor (or this writer's own unfinished transaction) left on this
        transactional id, then own the id, fencing any other writer with it. Holds the state row while it runs: a
        live predecessor's transaction finishes first. ``transaction()`` runs it whenever it is needed (and then
        never takes the id back from a writer that took it over: ProducerFencedError)."""
        blocking.run(self._protocol.recover(), self._db)

    @property
    def unfinished(self) -> bool:
        """Whether a transaction of this writer may be left open in Kafka until a recovery settles it."""
        return self._protocol.needs_recovery

    def recover_unfinished(self, *, keep_lease: bool = False) -> None:
        """What ``transaction()`` does first when needed: settle this writer's unfinished transaction (a writer that
        never recovered: the id's); ProducerFencedError rather than take the id back from a later writer. With
        ``keep_lease`` (a caller that keeps the id: a request, a pool's keeper), a recovery that fails renews this
        writer's lease before it lets the id's row go."""
        blocking.run(self._protocol.recover_unfinished(keep_lease=keep_lease), self._db)

    def resolve(self, reason: str) -> None:
        """Operator action after a DualWriteRecoveryError: mark the stored transaction handled (``reason`` logged)."""
        if not reason.strip():
            raise ValueError("a resolution needs a reason")
        blocking.run(self._protocol.resolve(reason), self._db)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[DualWriteTransaction]:
        """One DB transaction and one Kafka transaction, committed together on leaving the block; an exception
        inside rolls both back and is re-raised."""
        if self._in_block:
            raise DualWriteUsageError(f"{self.transactional_id!r}: transaction() inside another transaction() block "
                                      "of the same writer; one block is one DB transaction (use a second writer, "
                                      "or a DualWriterPool, for concurrent work)")
        self._in_block = True
        try:
            yield from blocking.run_with_block(self._protocol.transaction(), self._db, self._block)
        finally:
            self._in_block = False

    def _block(self) -> DualWriteTransaction:
        return DualWriteTransaction(self._db.cursor(), self._protocol.producer, self._db.given)

    def ended_by_lease_limit(self, exc: BaseException) -> bool:
        """Whether ``exc`` is PostgreSQL ending this writer's transaction for the idle limit its lease sets (so
        nothing of the block was committed), as opposed to any other limit."""
        return self._protocol.lease is not None and self._table.ended_by_own_limit(exc)

    def close(self) -> None:
        """Mark the last transaction complete in the row when it is (so an id the broker expires after a long idle
        time recovers cleanly), and release the producer and the Kafka connections (not the DB connection, which
        the caller owns). An unfinished transaction is left to the next recovery."""
        blocking.run(self._protocol.close(), self._db)
        if self._client is not None:
            self._client.close()
        self._db.close()

    def __enter__(self) -> DualWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
