"""DualWriter: one database transaction and one Kafka transaction, committed atomically (docs/dual-write.md).

The protocol is :mod:`kafka2pc.dualwrite.protocol`'s; this is its blocking edge (:mod:`.blocking`), for DB-API and
SQLAlchemy connections. :mod:`kafka2pc.dualwrite.aio` is the asyncio one."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kafka2pc.dualwrite import blocking
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import Lease
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.dualwrite.writer_parts import ClusterTransport, WriterCluster, transactional_id_of, writer_protocol
from kafka2pc.errors import DualWriteUsageError
from kafka2pc.producer import TwoPhaseProducer

__all__ = ["ClusterTransport", "DualWriteTransaction", "DualWriter"]


class DualWriteTransaction:
    """The inside of ``with writer.transaction() as tx``: ``tx.cursor`` (a DB-API cursor) or ``tx.connection`` (the
    writer's connection: a SQLAlchemy ``Connection`` when it was given one or an ``Engine``) for the database,
    ``tx.produce`` for Kafka."""

    def __init__(self, cursor: Any, producer: TwoPhaseProducer, connection: Any):
        self.cursor = cursor
        self.connection = connection
        self._producer: TwoPhaseProducer | None = producer

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
                headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None = None) -> None:
        """Add a record to the Kafka transaction (TwoPhaseProducer.produce's arguments)."""
        if self._producer is None:
            raise DualWriteUsageError("tx.produce() after its block ended: the transaction is over")
        self._producer.produce(topic, value, key, partition, headers)

    def _end(self) -> None:
        self._producer = None


class DualWriter:
    """Commits a DB-API connection's transaction and a Kafka transaction atomically, under one transactional id.

    ``config`` is a TwoPhaseProducer configuration (``bootstrap.servers``, ``transactional.id``, ...). One writer
    per transactional id at a time: a second one with the same id fences the first (in Kafka, and in the database
    through the state row's owner). ``transport`` replaces the network (a coordinator model, in tests). ``lease``
    and ``lease_s`` are set by DualWriterPool: the writer then uses the id only while its lease holds."""

    def __init__(self, connection: Any, config: Mapping[str, object], *, two_phase_commit: bool = True,
                 state_table: str = "kafka2pc_dual_write_state", create_state_table: bool = True,
                 transport: ClusterTransport | None = None, lease: Lease | None = None, lease_s: float = 15.0):
        self.transactional_id = transactional_id_of(config)
        self._db = adapt(connection)
        self._table = StateTable(self._db, state_table, create=create_state_table)
        self._cluster = WriterCluster(config, two_phase_commit=two_phase_commit, transport=transport).connect()
        self._protocol = writer_protocol(self._db, self._table, self._cluster, lease=lease, lease_s=lease_s)
        #: the thread inside a transaction() block of this writer, if one is
        self._block_thread: int | None = None
        self._entering = threading.Lock()
        self._open_tx: DualWriteTransaction | None = None

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
        with self._entering:
            holder, self._block_thread = self._block_thread, self._block_thread or threading.get_ident()
        if holder == threading.get_ident():
            raise DualWriteUsageError(f"{self.transactional_id!r}: transaction() inside another transaction() block "
                                      "of the same writer; one block is one DB transaction")
        if holder is not None:
            raise DualWriteUsageError(f"{self.transactional_id!r}: transaction() from two threads at once; a "
                                      "DualWriter is one connection, used by one thread at a time (a writer per "
                                      "thread, or a DualWriterPool on PostgreSQL or SQLite)")
        try:
            yield from blocking.run_with_block(self._protocol.transaction(), self._db, self._block)
        finally:
            self._block_thread = None
            if self._open_tx is not None:
                self._open_tx._end()  # a produce after the block is refused, not sent to a producer it no longer owns
                self._open_tx = None

    def _block(self) -> DualWriteTransaction:
        self._open_tx = DualWriteTransaction(self._db.cursor(), self._protocol.producer, self._db.given)
        return self._open_tx

    def connection_lost(self) -> bool:
        """Whether the writer's database connection is known to be gone."""
        return self._db.lost()

    def ended_by_lease_limit(self, exc: BaseException) -> bool:
        """Whether ``exc`` is PostgreSQL ending this writer's transaction for the idle limit its lease sets (so
        nothing of the block was committed), as opposed to any other limit."""
        return self._protocol.lease is not None and self._table.ended_by_own_limit(exc)

    def close(self) -> None:
        """Mark the last transaction complete in the row when it is (so an id the broker expires after a long idle
        time recovers cleanly), and release the producer and the Kafka connections (not the DB connection, which
        the caller owns). An unfinished transaction is left to the next recovery."""
        blocking.run(self._protocol.close(), self._db)
        self._cluster.close()
        self._db.close()

    def __enter__(self) -> DualWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
