"""DualWriterPool: dual writers for an application that serves many requests at once, in any number of processes
started with the same configuration (docs/dual-write.md, docs/fleet.md).

A DualWriter is one transactional id and one connection, used by one thread at a time. A pool leases ids
``<transactional.id>-<n>`` from the state table (:mod:`kafka2pc.dualwrite.leases`): up to ``size`` at once, the
lowest-numbered free or expired one first, a new one only when none is. A lease keeper thread renews them, settles
what writers left unfinished, gives back ids idle for ``idle_s``, and claims the expired leases of dead processes
to settle them (:mod:`kafka2pc.dualwrite.keeper`). A writer whose id another process took over is dropped and the
request served by another lease; one whose id needs an operator is benched."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.keeper import LeaseKeeper
from kafka2pc.dualwrite.leases import Lease, LeaseTable
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.dualwrite.upkeep import WriterView
from kafka2pc.dualwrite.writer import ClusterTransport, DualWriter, DualWriteTransaction
from kafka2pc.errors import (
    ConfigError,
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriteRecoveryError,
    PoolTimeoutError,
    ProducerFencedError,
    UsageError,
)

log = logging.getLogger(__name__)


class DualWriterPool:
    """Up to ``size`` dual writers behind one ``transaction()``, safe to call from many threads; every process of
    a fleet can be given the same configuration.

    ``connect`` makes a writer's connection: a callable returning a DB-API connection or a SQLAlchemy ``Connection``
    (called again to replace a connection that broke), or a SQLAlchemy ``Engine`` (each writer checks one of its
    connections out for as long as it holds its id; the keeper one more). ``config`` is a DualWriter's, its
    ``transactional.id`` the prefix of the ids the fleet leases. ``min_size`` writers are made at the start, more
    on demand up to ``size``; one idle for ``idle_s`` gives its id back (down to ``min_size``). A lease lasts
    ``lease_s`` (renewed every third of it, off the request path): a process that dies or stops for longer loses
    its ids to the live pools, which settle them. ``max_ids`` caps the ids under the prefix (None: no cap; ids are
    reused lowest-first either way). The other arguments are DualWriter's."""

    def __init__(self, connect: Callable[[], Any] | Any, config: Mapping[str, object], *, size: int,
                 min_size: int = 1, lease_s: float = 15.0, idle_s: float = 60.0, max_ids: int | None = None,
                 acquire_timeout_s: float = 30.0, two_phase_commit: bool = True,
                 state_table: str = "kafka2pc_dual_write_state", create_state_table: bool = True,
                 transport_for: Callable[[str], ClusterTransport] | None = None):
        _check_sizes(size, min_size, lease_s, idle_s, max_ids)
        self.prefix = str(config.get("transactional.id") or "")
        if not self.prefix:
            raise ConfigError("transactional.id", "is required: the pool leases ids <transactional.id>-<n>")
        self.size, self.min_size, self.lease_s, self.idle_s, self.max_ids = size, min_size, lease_s, idle_s, max_ids
        self.acquire_timeout_s = acquire_timeout_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self._pid = os.getpid()
        self._connect = _connector(connect)
        self._config = dict(config)
        self._options: dict[str, Any] = {"two_phase_commit": two_phase_commit, "state_table": state_table,
                                         "create_state_table": create_state_table}
        self._transport_for = transport_for
        self._cv = threading.Condition()
        self._idle: list[DualWriter] = []  # the last one returned is lent first
        self._writers: dict[str, DualWriter] = {}
        self._leases: dict[str, Lease] = {}
        #: when each idle writer was returned, and since when each writer lent out (or left unfinished) was lent
        self._idle_since: dict[str, float] = {}
        self._open_since: dict[str, float] = {}
        self._growing = 0
        #: ids taken out of service because they need an operator (DualWriteRecoveryError), with the error; the
        #: row says so too, so no pool of the fleet claims them until DualWriter.resolve
        self.benched: dict[str, Exception] = {}
        self._closed = False
        self._keeper = LeaseKeeper(self, self.connect_shareable())
        try:
            adopted = self._keeper.start_up()
            self._keeper.start_watcher()  # renewing from the first claim: a slow recovery must not let a lease lapse
            for _ in range(min_size + 2 * size):  # each failed round drops an id: lost meanwhile, or benched
                if len(self._writers) >= min_size:
                    break
                writer = self._grow()
                if writer is None:
                    break
                try:
                    writer.recover_unfinished()
                except (ProducerFencedError, DualWriteRecoveryError) as exc:
                    self._drop(writer, exc)  # its lease was taken (it lapsed), or it needs an operator
                    continue
                except BaseException:
                    with self._cv:
                        self._forget(writer)
                    self._close_writer(writer)  # its recovery just failed: not tried twice
                    raise
                self._release(writer)
        except BaseException:
            self.close()
            raise
        self._keeper.start_worker()
        atexit.register(self.close)  # a worker that exits (gunicorn's max_requests) gives its ids back at once
        log.info("dual-writer pool %r (%s): %d of up to %d writers, ids %s%s", self.prefix, self.holder,
                 len(self._writers), size, sorted(self._writers),
                 f"; {adopted} ids of an earlier release adopted" if adopted else "")

    @property
    def transactional_ids(self) -> list[str]:
        """The ids this pool holds leases on now."""
        with self._cv:
            return sorted(self._writers)

    # -- lending ------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[DualWriteTransaction]:
        """A writer's ``transaction()`` (DualWriter.transaction): a free one, or a new lease, waiting up to
        ``acquire_timeout_s``. A writer found fenced (its lease taken over) or needing an operator before the block
        began is dropped and the request goes on with another writer."""
        if os.getpid() != self._pid:
            raise UsageError(f"the pool was made in process {self._pid}, before a fork (gunicorn --preload, "
                             "multiprocessing): make the pool in each worker process, after the fork (gunicorn's "
                             "post_fork or post_worker_init hook, Celery's worker_process_init)")
        for _ in range(self.size + 2):  # each round that lends no writer drops one
            writer: DualWriter | None = self._acquire()
            assert writer is not None
            started = False
            try:
                with writer.transaction() as tx:
                    started = True
                    yield tx
                return
            except (ProducerFencedError, DualWriteRecoveryError) as exc:
                self._drop(writer, exc)
                writer = None
                if started:
                    raise
            except (DualWriteIncompleteError, DualWriteOutcomeUnknownError) as exc:  # the writer stays unfinished
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
        raise PoolTimeoutError(f"pool {self.prefix!r}: every writer tried was fenced or benched; retry")

    def _acquire(self) -> DualWriter:
        deadline = time.monotonic() + self.acquire_timeout_s
        while True:
            with self._cv:
                writer = self._wait_for_slot(deadline)
            if writer is not None:
                return writer
            try:
                writer = self._grow()
            finally:
                with self._cv:
                    self._growing -= 1
                    self._cv.notify()
            if writer is not None:
                with self._cv:
                    self._open_since[writer.transactional_id] = time.monotonic()
                return writer
            if time.monotonic() >= deadline:  # the fleet holds max_ids ids: wait for one of ours, or one freed
                raise PoolTimeoutError(f"pool {self.prefix!r}: no free dual writer within "
                                       f"{self.acquire_timeout_s:g} s, and the fleet holds all max_ids={self.max_ids} "
                                       "ids (a bigger max_ids, or fewer writers per process)")
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _wait_for_slot(self, deadline: float) -> DualWriter | None:
        """Under the lock: a free writer (lent now), or None with a growth slot reserved."""
        while True:
            if self._closed:
                raise UsageError(f"pool {self.prefix!r} is closed")
            if self._idle:
                writer = self._idle.pop()
                self._idle_since.pop(writer.transactional_id, None)
                self._open_since[writer.transactional_id] = time.monotonic()
                return writer
            if len(self._writers) + self._growing < self.size:
                self._growing += 1
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolTimeoutError(f"pool {self.prefix!r}: no free dual writer within "
                                       f"{self.acquire_timeout_s:g} s: all {len(self._writers)} are busy (a bigger "
                                       f"size, or more processes; benched: {sorted(self.benched)})")
            self._cv.wait(left)

    def _release(self, writer: DualWriter) -> None:
        transactional_id = writer.transactional_id
        with self._cv:
            if self._writers.get(transactional_id) is not writer:
                retire = True  # dropped or replaced meanwhile
            elif self._closed:
                retire = True
                self._forget(writer)
            else:
                retire = False
                self._idle.append(writer)
                self._idle_since[transactional_id] = time.monotonic()
                if not writer.unfinished:
                    self._open_since.pop(transactional_id, None)
                self._cv.notify()
        if retire:
            self.retire(writer)

    def take_idle(self, transactional_id: str) -> DualWriter | None:
        """For the keeper: lend it an idle writer (None if it is not idle now)."""
        with self._cv:
            for writer in self._idle:
                if writer.transactional_id == transactional_id:
                    self._idle.remove(writer)
                    self._idle_since.pop(transactional_id, None)
                    return writer
        return None

    def give_back(self, writer: DualWriter) -> None:
        """For the keeper: return what take_idle lent it."""
        self._release(writer)

    # -- leases -------------------------------------------------------------------------------------------------

    def _grow(self, *, expired_only: bool = False) -> DualWriter | None:
        """A writer on a newly leased id, on a new connection (its first transaction() recovers the id); None when
        the fleet has nothing to lease."""
        connection = self.connect_shareable()
        try:
            lease = self.lease_table(connection).claim(uuid.uuid4().hex, self.holder, self.lease_s,
                                                       max_ids=self.max_ids, expired_only=expired_only)
            if lease is None:
                _close_connection(connection)
                return None
            writer = self._new_writer(connection, lease)
        except BaseException:
            _close_connection(connection)
            raise
        if lease.taken_from is not None:
            log.warning("%r: took over the lease of %s (expired %.1f s ago); recovering what it left",
                        lease.transactional_id, lease.taken_from, lease.expired_s or 0.0)
        with self._cv:
            self._writers[lease.transactional_id] = writer
            self._leases[lease.transactional_id] = lease
        return writer

    def lease_table(self, connection: Any) -> LeaseTable:
        """The lease statements on ``connection``."""
        table = StateTable(adapt(connection), self._options["state_table"], create=self._options["create_state_table"])
        return LeaseTable(table, self.prefix, lease_s=self.lease_s)

    def _new_writer(self, connection: Any, lease: Lease) -> DualWriter:
        transport = self._transport_for(lease.transactional_id) if self._transport_for is not None else None
        return DualWriter(connection, {**self._config, "transactional.id": lease.transactional_id},
                          transport=transport, lease=lease, lease_s=self.lease_s, **self._options)

    def _drop(self, writer: DualWriter, exc: Exception) -> None:
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
        self._close_writer(writer)

    def connect_shareable(self) -> Any:
        """A new connection, checked for use by many threads."""
        connection = self._connect()
        try:
            check_shareable(connection)
        except BaseException:
            _close_connection(connection)
            raise
        return connection

    def bench(self, writer: DualWriter, exc: DualWriteRecoveryError) -> None:
        """For the keeper: the writer's id needs an operator."""
        self._drop(writer, exc)

    def replace_if_broken(self, writer: DualWriter, exc: BaseException) -> DualWriter:
        """For the keeper: a writer on a new connection (same lease) if ``exc`` came with its connection failing."""
        return self._replace(writer) if _connection_broken(writer, exc) else writer

    def lose(self, transactional_id: str) -> None:
        """For the keeper: an idle writer's lease is no longer ours."""
        writer = self.take_idle(transactional_id)
        if writer is not None:
            self.lose_writer(writer)

    def lose_writer(self, writer: DualWriter) -> None:
        """For the keeper: a writer it holds was fenced."""
        self._drop(writer, ProducerFencedError(f"{writer.transactional_id!r}: the lease was taken over"))

    def snapshot(self) -> tuple[list[WriterView], dict[str, str], list[float]]:
        """For the keeper: each writer as it sees it, each lease's token, and since when each open transaction
        has been open (monotonic)."""
        now = time.monotonic()
        with self._cv:
            views = [WriterView(tid, None if tid not in self._idle_since else now - self._idle_since[tid],
                                writer.unfinished) for tid, writer in self._writers.items()]
            return (views, {tid: lease.token for tid, lease in self._leases.items()},
                    list(self._open_since.values()))

    def _forget(self, writer: DualWriter) -> None:
        """Under the lock: the pool no longer holds ``writer`` (nothing, if its id is held by a newer writer: this
        pool claimed the id again after its own lease ran out)."""
        transactional_id = writer.transactional_id
        if self._writers.get(transactional_id) is writer:
            del self._writers[transactional_id]
            self._leases.pop(transactional_id, None)
            self._idle_since.pop(transactional_id, None)
            self._open_since.pop(transactional_id, None)
        self._cv.notify_all()

    def _replace(self, writer: DualWriter) -> DualWriter:
        """A writer on a new connection, with the same lease, for one whose connection broke; its first
        transaction() recovers the id (settling what the broken one left)."""
        lease = self._leases.get(writer.transactional_id)
        if lease is None or lease.token != writer.lease_token:
            return writer
        try:
            connection = self._connect()
            try:
                successor = self._new_writer(connection, lease)
            except BaseException:
                _close_connection(connection)
                raise
        except Exception as exc:  # the database is still away: the old writer stays, and recovers when it can
            log.warning("%r: could not reconnect (%r); keeping the old connection", writer.transactional_id, exc)
            return writer
        self._close_writer(writer)  # its successor settles, on a working connection
        with self._cv:
            self._writers[writer.transactional_id] = successor
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
        self._close_writer(writer, give_back=finished)

    def _close_writer(self, writer: DualWriter, *, give_back: bool = False) -> None:
        """Close the writer (and ``give_back`` its lease, once it has closed: its row then says complete), then its
        connection."""
        try:
            writer.close()
            token = writer.lease_token
            if give_back and token is not None:
                self.lease_table(writer.connection).release(writer.transactional_id, token)
        except Exception as exc:
            log.debug("%r: closing failed: %r", writer.transactional_id, exc)
        _close_connection(writer.connection)

    def reap_one(self) -> bool:
        """For the keeper: claim one expired lease of the fleet, settle its id, and give it back. False when there
        is none (or it could not be settled now: its lease then expires again, and is retried)."""
        writer = self._grow(expired_only=True)
        if writer is None:
            return False
        try:
            writer.recover()
        except DualWriteRecoveryError as exc:
            self._drop(writer, exc)
            return True
        except Exception as exc:
            log.warning("%r: could not settle the expired lease now (%r); retried when it expires again",
                        writer.transactional_id, exc)
            with self._cv:
                self._forget(writer)
            self._close_writer(writer)
            return False
        self.retire(writer)
        return True

    def settle_expired(self, limit: int = 10_000) -> int:
        """Claim and settle the fleet's expired leases now, up to ``limit`` (the keeper does it a few per tick);
        returns how many were settled."""
        settled = 0
        while settled < limit and self.reap_one():
            settled += 1
        return settled

    def close(self) -> None:
        """Stop the keeper; settle, close and give back every idle writer now, each lent one when its
        transaction ends. In a process forked after the pool was made it does nothing: the connections are the
        parent's."""
        if os.getpid() != self._pid:
            return
        atexit.unregister(self.close)
        with self._cv:
            self._closed = True
            idle, self._idle = self._idle, []
            for writer in idle:
                self._forget(writer)
        self._keeper.stop()
        for writer in idle:
            self.retire(writer)

    def __enter__(self) -> DualWriterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_sizes(size: int, min_size: int, lease_s: float, idle_s: float, max_ids: int | None) -> None:
    if size < 1:
        raise ConfigError("size", f"must be at least 1, not {size}")
    if not 0 <= min_size <= size:
        raise ConfigError("min_size", f"must be between 0 and size ({size}), not {min_size}")
    if lease_s < 1:
        raise ConfigError("lease_s", f"must be at least 1 s, not {lease_s}")
    if idle_s <= 0:
        raise ConfigError("idle_s", f"must be positive, not {idle_s}")
    if max_ids is not None and max_ids < size:
        raise ConfigError("max_ids", f"must be at least size ({size}), not {max_ids}")


def _connector(connect: Callable[[], Any] | Any) -> Callable[[], Any]:
    """A callable making a connection the pool owns: ``connect`` itself, or an Engine's ``connect``."""
    sqlalchemy = sys.modules.get("sqlalchemy")
    if sqlalchemy is not None and isinstance(connect, sqlalchemy.engine.Engine):
        return connect.connect  # type: ignore[no-any-return]
    if not callable(connect):
        raise ConfigError("connect", f"{type(connect).__name__} is neither a callable making a connection nor a "
                                     "SQLAlchemy Engine")
    return connect


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


def _close_connection(connection: Any) -> None:
    with contextlib.suppress(Exception):
        connection.close()


def _connection_broken(writer: DualWriter, exc: BaseException) -> bool:
    """Whether ``exc`` came with the database connection failing (not a statement): a connection that is now
    closed (psycopg: a lost server, a session PostgreSQL ended), or SQLAlchemy's disconnect."""
    return bool(getattr(exc, "connection_invalidated", False) or getattr(writer.connection, "closed", False))
