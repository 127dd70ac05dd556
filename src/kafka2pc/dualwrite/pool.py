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
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kafka2pc.dualwrite.django_connection import DjangoConnection, is_django_connection
from kafka2pc.dualwrite.keeper import LeaseKeeper
from kafka2pc.dualwrite.pool_writers import PoolWriters, connection_broken
from kafka2pc.dualwrite.slots import after_block_error, pool_prefix
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.dualwrite.writer import ClusterTransport, DualWriter, DualWriteTransaction
from kafka2pc.errors import (
    ConfigError,
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
        self.prefix = pool_prefix(config, size=size, min_size=min_size, lease_s=lease_s, idle_s=idle_s,
                                  max_ids=max_ids)
        self.size, self.min_size, self.lease_s, self.idle_s, self.max_ids = size, min_size, lease_s, idle_s, max_ids
        self.acquire_timeout_s = acquire_timeout_s
        self._pid = os.getpid()
        options = {"two_phase_commit": two_phase_commit, "state_table": state_table,
                   "create_state_table": create_state_table}
        self._set = PoolWriters(self.prefix, _connector(connect), config, options, size=size, min_size=min_size,
                                lease_s=lease_s, idle_s=idle_s, max_ids=max_ids,
                                acquire_timeout_s=acquire_timeout_s, transport_for=transport_for)
        self.holder = self._set.holder
        #: ids taken out of service because they need an operator (DualWriteRecoveryError), with the error; the
        #: row says so too, so no pool of the fleet claims them until DualWriter.resolve
        self.benched: dict[str, Exception] = self._set.benched
        self._keeper = LeaseKeeper(self._set, self._set.connect_shareable())
        try:
            adopted = self._keeper.start_up()
            self._keeper.start_watcher()  # renewing from the first claim: a slow recovery must not let a lease lapse
            self._start_writers()
        except BaseException:
            self.close()
            raise
        self._keeper.start_worker()
        atexit.register(self.close)  # a worker that exits (gunicorn's max_requests) gives its ids back at once
        log.info("dual-writer pool %r (%s): %d of up to %d writers, ids %s%s", self.prefix, self.holder,
                 len(self._set.writers), size, self._set.ids(),
                 f"; {adopted} ids of an earlier release adopted" if adopted else "")

    def _start_writers(self) -> None:
        """``min_size`` writers, each id recovered before it serves."""
        for _ in range(self.min_size + 2 * self.size):  # each failed round drops an id: lost meanwhile, or benched
            if len(self._set.writers) >= self.min_size:
                return
            writer = self._set.grow()
            if writer is None:
                return
            try:
                writer.recover_unfinished()
            except (ProducerFencedError, DualWriteRecoveryError) as exc:
                self._set.drop(writer, exc)  # its lease was taken (it lapsed), or it needs an operator
                continue
            except BaseException:
                self._set.discard(writer)  # its recovery just failed: not tried twice
                raise
            self._set.release(writer)

    @property
    def transactional_ids(self) -> list[str]:
        """The ids this pool holds leases on now."""
        return self._set.ids()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[DualWriteTransaction]:
        """A writer's ``transaction()`` (DualWriter.transaction): a free one, or a new lease, waiting up to
        ``acquire_timeout_s``. A writer found fenced (its lease taken over) or needing an operator before the block
        began is dropped and the request goes on with another writer; one that lost its lease while the block ran
        raises LeaseLostError (a RetriableError: both sides rolled back)."""
        if os.getpid() != self._pid:
            raise UsageError(f"the pool was made in process {self._pid}, before a fork (gunicorn --preload, "
                             "multiprocessing): make the pool in each worker process, after the fork (gunicorn's "
                             "post_fork or post_worker_init hook, Celery's worker_process_init)")
        reconnected = False
        for _ in range(self.size + 2):  # each round that lends no writer drops one
            writer: DualWriter | None = self._set.lend()
            assert writer is not None
            writer_id = writer.transactional_id
            started = False
            try:
                with writer.transaction() as tx:
                    started = True
                    yield tx
                return
            except Exception as exc:
                fate = after_block_error(exc, started=started, broken=connection_broken(writer, exc),
                                         lost_lease=writer.ended_by_lease_limit(exc),
                                         session_ended=StateTable.session_ended(exc))
                gave_up = False
                if fate.drop:
                    self._set.drop(writer, exc)
                    writer = None
                elif fate.replace:
                    replaced = self._set.replace(writer)
                    # one new connection per request: the database still away, or dropping new ones too
                    gave_up = fate.retry and (replaced is writer or reconnected)
                    writer, reconnected = replaced, reconnected or fate.retry
                error = fate.error(writer_id, self.lease_s, exc, gave_up=gave_up)
                if error is not None:
                    raise error from exc
                if not fate.retry:
                    raise
            finally:
                if writer is not None:
                    self._set.release(writer)
        raise PoolTimeoutError(f"pool {self.prefix!r}: every writer tried was fenced or benched; retry")

    def settle_expired(self, limit: int = 10_000) -> int:
        """Claim and settle the fleet's expired leases now, up to ``limit`` (the keeper does it a few per tick);
        returns how many were settled."""
        settled = 0
        while settled < limit and self._set.reap_one():
            settled += 1
        return settled

    def close(self) -> None:
        """Stop the keeper; settle, close and give back every idle writer now, each lent one when its
        transaction ends. In a process forked after the pool was made it does nothing: the connections are the
        parent's."""
        if os.getpid() != self._pid:
            return
        atexit.unregister(self.close)
        idle = self._set.close()
        self._keeper.stop()
        for writer in idle:
            self._set.retire(writer)

    def __enter__(self) -> DualWriterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connector(connect: Callable[[], Any] | Any) -> Callable[[], Any]:
    """A callable making a connection the pool owns: ``connect`` itself, or an Engine's ``connect``."""
    sqlalchemy = sys.modules.get("sqlalchemy")
    if sqlalchemy is not None and isinstance(connect, sqlalchemy.engine.Engine):
        return connect.connect  # type: ignore[no-any-return]
    if is_django_connection(connect):  # each writer on the Django connection of the thread it is lent to
        alias = DjangoConnection.of(connect).alias
        return lambda: DjangoConnection(alias)
    if not callable(connect):
        raise ConfigError("connect", f"{type(connect).__name__} is neither a callable making a connection nor a "
                                     "SQLAlchemy Engine")
    return connect
