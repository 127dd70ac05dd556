"""DualWriterPool: dual writers for an application that serves many requests at once (docs/dual-write.md).

A DualWriter is one transactional id and one connection, used by one thread at a time. The pool holds ``size``
of them, ids ``<transactional.id>-0`` .. ``-<size-1>``, each with a connection of its own, recovers every id when it
starts, and lends a free writer to each ``transaction()``."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kafka2pc.dualwrite.writer import ClusterTransport, DualWriter, DualWriteTransaction
from kafka2pc.errors import ConfigError, DualWriteOutcomeUnknownError, PoolTimeoutError

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
        self._closed = False
        try:
            for transactional_id in self.transactional_ids:
                writer = self._new_writer(transactional_id)
                self._writers[transactional_id] = writer
                writer.recover()
                self._free.put(writer)
        except BaseException:
            self.close()
            raise
        log.info("dual-writer pool %r: %d ids recovered", prefix, size)

    def _new_writer(self, transactional_id: str) -> DualWriter:
        transport = self._transport_for(transactional_id) if self._transport_for is not None else None
        return DualWriter(self._connect(), {**self._config, "transactional.id": transactional_id},
                          transport=transport, **self._options)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[DualWriteTransaction]:
        """A free writer's ``transaction()`` (DualWriter.transaction); waits up to ``acquire_timeout_s`` for one."""
        writer = self._acquire()
        try:
            with writer.transaction() as tx:
                yield tx
        except DualWriteOutcomeUnknownError:
            writer = self._replace(writer)  # its connection failed at commit: a new one settles it, by recovery
            raise
        except Exception as exc:
            if _connection_broken(writer, exc):
                writer = self._replace(writer)
            raise
        finally:
            self._release(writer)

    def _acquire(self) -> DualWriter:
        if self._closed:
            raise ConfigError("pool", "is closed")
        try:
            return self._free.get(timeout=self.acquire_timeout_s)
        except queue.Empty:
            busy = len(self.transactional_ids)
            raise PoolTimeoutError(f"no free dual writer within {self.acquire_timeout_s:g} s: all {busy} are busy "
                                   "(a bigger size, or more processes)") from None

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
        self._close_quietly(writer)
        with self._lock:
            self._writers[writer.transactional_id] = successor
        return successor

    def _close_quietly(self, writer: DualWriter) -> None:
        """Close a writer and, when the pool made it with ``connect()``, its connection (an Engine's writer returns
        its own to the engine)."""
        try:
            writer.close()
            if self._owns_connections:
                writer.connection.close()
        except Exception as exc:
            log.debug("%r: closing failed: %r", writer.transactional_id, exc)

    def close(self) -> None:
        """Close every free writer now, and each busy one when its transaction ends."""
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
