"""DualWriterPool: dual writers for an application that serves many requests at once (docs/dual-write.md).

A DualWriter is one transactional id and one connection, used by one thread at a time. The pool holds ``size``
of them, ids ``<transactional.id>-0`` .. ``-<size-1>``, each with a connection of its own, recovers every id when it
starts, and lends a free writer to each ``transaction()``. A writer whose id another writer took over, or whose id
needs an operator, is benched: the others go on serving. Closing settles what a writer left unfinished."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kafka2pc.dualwrite.writer import ClusterTransport, DualWriter, DualWriteTransaction
from kafka2pc.errors import (
    ConfigError,
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriteRecoveryError,
    PoolTimeoutError,
    ProducerFencedError,
)

log = logging.getLogger(__name__)


class DualWriterPool:
    """``size`` dual writers behind one ``transaction()``, safe to call from many threads.

    ``connect`` makes a writer's connection: a callable returning a DB-API connection or a SQLAlchemy ``Connection``
    (called again to replace a connection that broke), or a SQLAlchemy ``Engine`` (each writer checks one of its
    pooled connections out for its lifetime, so the engine's pool needs room for ``size``). ``config`` is a
    DualWriter's, its ``transactional.id`` the ids' prefix: one prefix per process, the same one again when the
    process restarts (its start recovers what the dead process left). The other arguments are DualWriter's."""

    def __init__(self, connect: Callable[[], Any] | Any, config: Mapping[str, object], *, size: int,
                 acquire_timeout_s: float = 30.0, two_phase_commit: bool = True,
                 state_table: str = "kafka2pc_dual_write_state", create_state_table: bool = True,
                 transport_for: Callable[[str], ClusterTransport] | None = None):
        if size < 1:
            raise ConfigError("size", f"must be at least 1, not {size}")
        prefix = str(config.get("transactional.id") or "")
        if not prefix:
            raise ConfigError("transactional.id", "is required: the pool's ids are <transactional.id>-0 .. -<size-1>")
        self.transactional_ids = [f"{prefix}-{index}" for index in range(size)]
        self.acquire_timeout_s = acquire_timeout_s
        self._owns_connections = callable(connect)
        self._connect = connect if callable(connect) else lambda: connect
        self._config = dict(config)
        self._options: dict[str, Any] = {"two_phase_commit": two_phase_commit, "state_table": state_table,
                                         "create_state_table": create_state_table}
        self._transport_for = transport_for
        self._free: queue.LifoQueue[DualWriter] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._writers: dict[str, DualWriter] = {}
        #: ids taken out of service, with the error that benched them: ProducerFencedError (another writer took the
        #: id over) or DualWriteRecoveryError (it needs an operator)
        self.benched: dict[str, Exception] = {}
        #: ids whose last transaction ended unfinished (DualWriteIncompleteError, DualWriteOutcomeUnknownError)
        self._unsettled: set[str] = set()
        self._closed = False
        try:
            for transactional_id in self.transactional_ids:
                writer = self._new_writer(transactional_id)
                self._writers[transactional_id] = writer
                try:
                    writer.recover()
                except BaseException:
                    self._close_quietly(writer, settle=False)  # its recovery just failed: not tried twice
                    raise
                self._free.put(writer)
        except BaseException:
            self.close()
            raise
        log.info("dual-writer pool %r: %d ids recovered", prefix, size)

    def _new_writer(self, transactional_id: str) -> DualWriter:
        transport = self._transport_for(transactional_id) if self._transport_for is not None else None
        connection = self._connect()
        try:
            return DualWriter(connection, {**self._config, "transactional.id": transactional_id},
                              transport=transport, **self._options)
        except BaseException:
            if self._owns_connections:
                with contextlib.suppress(Exception):
                    connection.close()
            raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[DualWriteTransaction]:
        """A free writer's ``transaction()`` (DualWriter.transaction); waits up to ``acquire_timeout_s`` for one. A
        writer found fenced, or needing an operator, before the block began is benched and another one used."""
        for _ in self.transactional_ids:  # every round that does not lend a writer benches one
            writer: DualWriter | None = self._acquire()
            assert writer is not None
            started = False
            try:
                with writer.transaction() as tx:
                    started = True
                    yield tx
                self._unsettled.discard(writer.transactional_id)
                return
            except (ProducerFencedError, DualWriteRecoveryError) as exc:
                self._bench(writer, exc)
                writer = None
                if started or len(self.benched) == len(self.transactional_ids):
                    raise
            except (DualWriteIncompleteError, DualWriteOutcomeUnknownError) as exc:
                self._unsettled.add(writer.transactional_id)
                if isinstance(exc, DualWriteOutcomeUnknownError):
                    writer = self._replace(writer)  # its connection failed at commit: a new one settles it
                raise
            except Exception as exc:
                if _connection_broken(writer, exc):
                    writer = self._replace(writer)
                raise
            finally:
                if writer is not None:
                    self._release(writer)
        raise AssertionError("unreachable: the last writer benched re-raises its error")

    def _acquire(self) -> DualWriter:
        if self._closed:
            raise ConfigError("pool", "is closed")
        if len(self.benched) == len(self.transactional_ids):
            fenced = all(isinstance(exc, ProducerFencedError) for exc in self.benched.values())
            raise (ProducerFencedError if fenced else DualWriteRecoveryError)(
                f"every id of the pool is benched: {self.benched}")
        try:
            return self._free.get(timeout=self.acquire_timeout_s)
        except queue.Empty:
            busy = len(self.transactional_ids) - len(self.benched)
            raise PoolTimeoutError(f"no free dual writer within {self.acquire_timeout_s:g} s: all {busy} are busy "
                                   f"(a bigger size, or more processes; benched: {sorted(self.benched)})") from None

    def _bench(self, writer: DualWriter, exc: Exception) -> None:
        """Take a writer out of service for good: its id belongs to another writer now (a second pool with this
        prefix?), or it needs an operator (DualWriter.resolve, then a new pool)."""
        transactional_id = writer.transactional_id
        with self._lock:
            self.benched[transactional_id] = exc
            self._writers.pop(transactional_id, None)
            self._unsettled.discard(transactional_id)
        log.error("%r: benched, the pool goes on with %d of %d ids: %r", transactional_id,
                  len(self.transactional_ids) - len(self.benched), len(self.transactional_ids), exc)
        self._close_quietly(writer, settle=False)  # fenced (its transaction is the new owner's) or an operator's

    def _release(self, writer: DualWriter) -> None:
        with self._lock:
            if self._closed:
                self._close_quietly(writer)
            else:
                self._free.put(writer)

    def _replace(self, writer: DualWriter) -> DualWriter:
        """A new writer, with a new connection, for a writer whose connection broke; its first transaction()
        recovers the id (settling what the broken one left)."""
        try:
            successor = self._new_writer(writer.transactional_id)
        except Exception as exc:  # the database is still away: the old writer stays, and recovers when it can
            log.warning("%r: could not reconnect (%r); keeping the old connection", writer.transactional_id, exc)
            return writer
        self._close_quietly(writer, settle=False)  # its successor settles, on a working connection
        with self._lock:
            self._writers[writer.transactional_id] = successor
        return successor

    def _close_quietly(self, writer: DualWriter, *, settle: bool = True) -> None:
        """Settle what the writer left unfinished (when it can), close it and, when the pool made it with
        ``connect()``, its connection (an Engine's writer returns its own to the engine)."""
        if settle and (writer.transactional_id in self._unsettled or writer.unfinished):
            self._settle(writer)
        try:
            writer.close()
            if self._owns_connections:
                writer.connection.close()
        except Exception as exc:
            log.debug("%r: closing failed: %r", writer.transactional_id, exc)

    def _settle(self, writer: DualWriter) -> None:
        try:
            writer.recover_unfinished()
            self._unsettled.discard(writer.transactional_id)
        except Exception as exc:
            log.warning("%r: could not settle its unfinished transaction at close (%r): it stays prepared, holding "
                        "back read_committed consumers of its partitions, until a pool with this prefix starts "
                        "(or DualWriter(...).recover() on the id)", writer.transactional_id, exc)

    def close(self) -> None:
        """Settle what writers left unfinished and close every free writer now, each busy one when its
        transaction ends."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    self._close_quietly(self._free.get_nowait())
                except queue.Empty:
                    break

    def __enter__(self) -> DualWriterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connection_broken(writer: DualWriter, exc: BaseException) -> bool:
    """Whether ``exc`` is the database connection failing (not a statement): the driver's OperationalError or
    InterfaceError on a connection that is now closed (psycopg), or SQLAlchemy's disconnect."""
    if getattr(exc, "connection_invalidated", False):
        return True
    closed = getattr(writer.connection, "closed", False)
    return bool(closed) and type(exc).__name__ in ("OperationalError", "InterfaceError")
