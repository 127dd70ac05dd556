"""The writers of a DualWriterPool and their leases: which are idle, lent out or unfinished, and the operations
on them that the pool's requests and its lease keeper share (lend and release, lease a new id, drop, replace,
retire, reap). :class:`~kafka2pc.dualwrite.pool.DualWriterPool` is the public face; this is its bookkeeping, and
what :class:`~kafka2pc.dualwrite.keeper.LeaseKeeper` works on."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kafka2pc.dualwrite import blocking
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import Lease, LeaseTable
from kafka2pc.dualwrite.slots import Wait, WriterSlots
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.dualwrite.upkeep import WriterView
from kafka2pc.dualwrite.writer import ClusterTransport, DualWriter
from kafka2pc.errors import ConfigError, DualWriteRecoveryError, ProducerFencedError

log = logging.getLogger("kafka2pc.dualwrite.pool")  # one logger for the pool, whichever half speaks


class PoolWriters:
    """Up to ``size`` writers on leased ids under ``prefix``, lent to one thread at a time. Thread-safe: the
    bookkeeping (:class:`~kafka2pc.dualwrite.slots.WriterSlots`) under one condition."""

    def __init__(self, prefix: str, connect: Callable[[], Any], config: Mapping[str, object], options: dict[str, Any],
                 *, size: int, min_size: int, lease_s: float, idle_s: float, max_ids: int | None,
                 acquire_timeout_s: float, transport_for: Callable[[str], ClusterTransport] | None):
        self.prefix, self.size, self.min_size, self.lease_s, self.idle_s = prefix, size, min_size, lease_s, idle_s
        self.max_ids, self.acquire_timeout_s = max_ids, acquire_timeout_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self._connect = connect
        self._config = dict(config)
        self._options = options
        self._transport_for = transport_for
        self._cv = threading.Condition()
        self._slots: WriterSlots[DualWriter] = WriterSlots(prefix, size, max_ids, acquire_timeout_s)
        self.writers = self._slots.writers
        self.benched = self._slots.benched

    def ids(self) -> list[str]:
        with self._cv:
            return self._slots.ids()

    def discard(self, writer: DualWriter) -> None:
        """Forget and close a writer whose id was not given back (its recovery failed: the lease expires)."""
        with self._cv:
            self._forget(writer)
        self.close_writer(writer)

    def close(self) -> list[DualWriter]:
        """No more lending: the idle writers, forgotten (to be retired); lent ones retire when they come back."""
        with self._cv:
            idle = self._slots.close()
            self._cv.notify_all()
        return idle

    def lend(self) -> DualWriter:
        """A free writer, or one on a newly leased id, waiting up to ``acquire_timeout_s``."""
        deadline = time.monotonic() + self.acquire_timeout_s
        while True:
            with self._cv:
                writer = self._wait_for_slot(deadline)
            if writer is not None:
                return writer
            try:
                writer = self.grow()
            finally:
                with self._cv:
                    self._slots.growth_ended(writer, time.monotonic())
                    self._cv.notify()
            if writer is not None:
                return writer
            if time.monotonic() >= deadline:  # the fleet holds max_ids ids: wait for one of ours, or one freed
                raise self._slots.fleet_full()
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _wait_for_slot(self, deadline: float) -> DualWriter | None:
        """Under the lock: a free writer (lent now), or None with a growth slot reserved."""
        while True:
            found = self._slots.lend(time.monotonic())
            if found is Wait.GROW:
                return None
            if found is not Wait.WAIT:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._slots.busy()
            self._cv.wait(left)

    def release(self, writer: DualWriter) -> None:
        with self._cv:
            retire = self._slots.put_back(writer, time.monotonic())
            self._cv.notify_all()
        if retire:
            self.retire(writer)

    def take_idle(self, transactional_id: str) -> DualWriter | None:
        """For the keeper: lend it an idle writer (None if it is not idle now)."""
        with self._cv:
            return self._slots.take_idle(transactional_id)

    def give_back(self, writer: DualWriter) -> None:
        """For the keeper: return what take_idle lent it."""
        self.release(writer)

    # -- leases -------------------------------------------------------------------------------------------------

    def grow(self, *, expired_only: bool = False) -> DualWriter | None:
        """A writer on a newly leased id, on a new connection (its first transaction() recovers the id); None when
        the fleet has nothing to lease."""
        connection = self.connect_shareable()
        try:
            lease = self.lease_table(connection).claim(uuid.uuid4().hex, self.holder, self.lease_s,
                                                       max_ids=self.max_ids, expired_only=expired_only)
            if lease is None:
                close_connection(connection)
                return None
            writer = self._new_writer(connection, lease)
        except BaseException:
            close_connection(connection)
            raise
        if lease.taken_from is not None:
            whose = "this process's own" if lease.taken_from == self.holder else f"the lease of {lease.taken_from}"
            log.warning("%r: took over %s (expired %.1f s ago); recovering what it left", lease.transactional_id,
                        whose, lease.expired_s or 0.0)
        with self._cv:
            self._slots.grown(writer, lease)
        return writer

    def lease_table(self, connection: Any) -> LeaseTable:
        """The lease statements on ``connection``."""
        table = StateTable(adapt(connection), self._options["state_table"], create=self._options["create_state_table"])
        return LeaseTable(table, self.prefix, lease_s=self.lease_s)

    def _new_writer(self, connection: Any, lease: Lease) -> DualWriter:
        transport = self._transport_for(lease.transactional_id) if self._transport_for is not None else None
        return DualWriter(connection, {**self._config, "transactional.id": lease.transactional_id},
                          transport=transport, lease=lease, lease_s=self.lease_s, **self._options)

    def drop(self, writer: DualWriter, exc: Exception) -> None:
        """Stop using a writer: its lease was taken over (ProducerFencedError: the new holder settles what it
        left), or its id needs an operator (DualWriteRecoveryError: benched, and marked so in the row)."""
        transactional_id, token = writer.transactional_id, writer.lease_token
        needs_operator = isinstance(exc, DualWriteRecoveryError)
        with self._cv:
            self._forget(writer)
            if needs_operator:
                self.benched[transactional_id] = exc
        if needs_operator and token is not None:
            with contextlib.suppress(Exception):
                self.lease_table(writer.connection).set_problem(transactional_id, token, str(exc))
            log.error("%r: benched until an operator resolves it (DualWriter.resolve): %r", transactional_id, exc)
        else:
            log.warning("%r: fenced (%s); the pool leases another id", transactional_id, exc)
        self.close_writer(writer)

    def connect_shareable(self) -> Any:
        """A new connection, checked for use by many threads."""
        connection = self._connect()
        try:
            check_shareable(connection)
        except BaseException:
            close_connection(connection)
            raise
        return connection

    def bench(self, writer: DualWriter, exc: DualWriteRecoveryError) -> None:
        """For the keeper: the writer's id needs an operator."""
        self.drop(writer, exc)

    def replace_if_broken(self, writer: DualWriter, exc: BaseException) -> DualWriter:
        """For the keeper: a writer on a new connection (same lease) if ``exc`` came with its connection failing."""
        return self.replace(writer) if connection_broken(writer, exc) else writer

    def lose(self, transactional_id: str, token: str) -> None:
        """For the keeper: the lease ``token`` held is no longer ours (its idle writer goes, not a later lease's)."""
        with self._cv:
            writer = self._slots.take_idle(transactional_id, token)
        if writer is not None:
            self.lose_writer(writer)

    def lose_writer(self, writer: DualWriter) -> None:
        """For the keeper: a writer it holds was fenced."""
        self.drop(writer, ProducerFencedError(f"{writer.transactional_id!r}: the lease was taken over"))

    def snapshot(self) -> tuple[list[WriterView], dict[str, str], list[float]]:
        """For the keeper: each writer as it sees it, each lease's token, and since when each open transaction
        has been open (monotonic)."""
        with self._cv:
            return self._slots.snapshot(time.monotonic())

    def _forget(self, writer: DualWriter) -> None:
        """Under the lock: the pool no longer holds ``writer``."""
        self._slots.forget(writer)
        self._cv.notify_all()

    def replace(self, writer: DualWriter) -> DualWriter:
        """A writer on a new connection, with the same lease, for one whose connection broke; its first
        transaction() recovers the id (settling what the broken one left)."""
        with self._cv:
            lease = self._slots.lease_of(writer, writer.lease_token)
        if lease is None:
            return writer
        try:
            connection = self._connect()
            try:
                successor = self._new_writer(connection, lease)
            except BaseException:
                close_connection(connection)
                raise
        except Exception as exc:  # the database is still away: the old writer stays, and recovers when it can
            log.warning("%r: could not reconnect (%r); keeping the old connection", writer.transactional_id, exc)
            return writer
        self.close_writer(writer)  # its successor settles, on a working connection
        with self._cv:
            self._slots.writers[writer.transactional_id] = successor
        return successor

    def retire(self, writer: DualWriter) -> None:
        """Close a writer and give its id back to the fleet; a transaction it left unfinished is settled first, and
        if that fails the lease is kept until it expires, for another pool to settle."""
        transactional_id = writer.transactional_id
        if writer.unfinished:
            try:
                writer.recover_unfinished()
            except Exception as exc:
                log.warning("%r: could not settle its unfinished transaction at close (%r): its lease expires in "
                            "%g s and a live pool of the fleet settles it", transactional_id, exc, self.lease_s)
        finished = not writer.unfinished
        with self._cv:
            self._forget(writer)
        self.close_writer(writer, give_back=finished)

    def close_writer(self, writer: DualWriter, *, give_back: bool = False) -> None:
        """Close the writer (and ``give_back`` its lease, once it has closed: its row then says complete), then its
        connection."""
        try:
            writer.close()
            token = writer.lease_token
            if give_back and token is not None:
                self.lease_table(writer.connection).release(writer.transactional_id, token)
        except Exception as exc:
            log.debug("%r: closing failed: %r", writer.transactional_id, exc)
        close_connection(writer.connection)

    def reap_one(self) -> bool:
        """For the keeper: claim one expired lease of the fleet, settle its id, and give it back. False when there
        is none (or it could not be settled now: its lease then expires again, and is retried)."""
        writer = self.grow(expired_only=True)
        if writer is None:
            return False
        try:
            writer.recover()
        except DualWriteRecoveryError as exc:
            self.drop(writer, exc)
            return True
        except Exception as exc:
            log.warning("%r: could not settle the expired lease now (%r); retried when it expires again",
                        writer.transactional_id, exc)
            with self._cv:
                self._forget(writer)
            self.close_writer(writer)
            return False
        self.retire(writer)
        return True


def check_shareable(connection: Any) -> None:
    """A pool's connections are used by many threads (the requests', the keeper's): refuse a sqlite3 connection
    made with ``check_same_thread=True`` (its default) now rather than on another thread later."""
    dbapi = getattr(connection, "dbapi_connection", None) or connection
    if type(dbapi).__module__ != "sqlite3" and not isinstance(dbapi, sqlite3.Connection):
        return
    failed: list[BaseException] = []

    def touch() -> None:
        try:
            dbapi.cursor().close()
        except sqlite3.ProgrammingError as exc:
            failed.append(exc)

    other = threading.Thread(target=touch)
    other.start()
    other.join()
    if failed:
        raise ConfigError("connect", "makes sqlite3 connections with check_same_thread=True (the default): a "
                                     "pool's connections are used by many threads; use sqlite3.connect(path, "
                                     "check_same_thread=False)")


def close_connection(connection: Any) -> None:
    """Close a pool's connection (an Engine's goes back to it: on MariaDB its session's idle limits reset first)."""
    with contextlib.suppress(Exception):
        db = adapt(connection)
        if db.mysql:  # only MariaDB's limits are set for the session (PostgreSQL's for each transaction)
            blocking.run(StateTable(db, "kafka2pc_dual_write_state", create=False).unlimit_idle(), db)
    with contextlib.suppress(Exception):
        connection.close()




def connection_broken(writer: Any, exc: BaseException) -> bool:
    """Whether ``exc`` came with the database connection failing (not a statement): a connection that is now
    closed (a lost server, a session the database ended; under SQLAlchemy too, before it noticed), or SQLAlchemy's
    disconnect."""
    return bool(getattr(exc, "connection_invalidated", False)) or writer.connection_lost()
