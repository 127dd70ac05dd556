"""The lease keeper of a DualWriterPool: two daemon threads. The watcher works on the database alone (its own
connection, made again when it breaks): it renews the pool's leases, looks for the fleet's expired ones and reports
the metrics, so a broker that is slow or away never lets a healthy process's leases run out. The worker does what
needs Kafka: it settles what idle writers left unfinished, gives back ids idle too long, and settles the expired
leases of dead processes. What a round does is decided by :func:`kafka2pc.dualwrite.upkeep.plan_upkeep`; here it is
only carried out."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from kafka2pc import metrics
from kafka2pc.dualwrite import blocking
from kafka2pc.dualwrite.pool_writers import close_connection
from kafka2pc.dualwrite.upkeep import Upkeep, WriterView, plan_upkeep
from kafka2pc.errors import DualWriteRecoveryError, ProducerFencedError

if TYPE_CHECKING:
    from kafka2pc.dualwrite.leases import LeaseTable
    from kafka2pc.dualwrite.pool_writers import PoolWriters

log = logging.getLogger(__name__)

#: the longest a round waits: an expired lease is seen within this of expiring (the lease length bounds it below)
MAX_TICK_S = 2.0


class KeeperCore:
    """What a lease keeper decides and reports, whatever drives it (threads here, tasks in :mod:`.aio_keeper`)."""

    def __init__(self, prefix: str, *, lease_s: float, min_size: int, idle_s: float):
        self.prefix, self.lease_s, self.min_size, self.idle_s = prefix, lease_s, min_size, idle_s
        self._plan = Upkeep()
        self.tick_s = min(lease_s / 4, MAX_TICK_S)
        self._renewed_at = time.monotonic()
        self._labels = {"prefix": prefix}
        self._said_lost: set[str] = set()  # ids whose loss was logged (once each, not every round of a partition)
        for counter in (metrics.DUAL_WRITE_LEASES_TAKEN_OVER, metrics.DUAL_WRITE_KEEPER_ERRORS):
            counter.labels(**self._labels).inc(0)  # a series from the first scrape, for rate()

    def _renew_due(self) -> float | None:
        """Now, if a third of a lease has passed since the last renewal that succeeded (a failed one is tried
        again the next round), else None."""
        now = time.monotonic()
        return now if now - self._renewed_at >= self.lease_s / 3 else None

    def _lost(self, tokens: dict[str, str], lost: set[str], renewal_started: float) -> list[str]:
        """The ids a renewal found no longer this process's (logged once each), to be dropped."""
        self._renewed_at = renewal_started
        self._said_lost &= set(tokens)
        for transactional_id in sorted(lost - self._said_lost):
            self._said_lost.add(transactional_id)
            log.warning("%r: the lease was taken over by another process: this one was stopped or cut off, or a "
                        "transaction() block held its row for longer than lease_s=%g s (PostgreSQL then ends the "
                        "block's transaction)", transactional_id, self.lease_s)
        return sorted(lost)

    def _planned(self, views: list[WriterView], expired: list[tuple[str, float]]) -> bool:
        """Plan the worker's round; whether it has anything to do."""
        self._plan = plan_upkeep(views, expired=len(expired), min_size=self.min_size, idle_s=self.idle_s)
        return self._plan != Upkeep()

    def _take_plan(self) -> Upkeep:
        plan, self._plan = self._plan, Upkeep()
        return plan

    def _failed(self, exc: BaseException) -> None:
        metrics.DUAL_WRITE_KEEPER_ERRORS.labels(**self._labels).inc()
        log.warning("pool %r: lease keeper: %r", self.prefix, exc)

    def _reaped(self, count: int) -> None:
        if count:
            metrics.DUAL_WRITE_LEASES_TAKEN_OVER.labels(**self._labels).inc(count)

    def _report(self, views: list[WriterView], expired: list[tuple[str, float]], opened: list[float]) -> None:
        now = time.monotonic()
        metrics.DUAL_WRITE_LEASED_IDS.labels(**self._labels).set(len(views))
        metrics.DUAL_WRITE_EXPIRED_LEASES.labels(**self._labels).set(len(expired))
        metrics.DUAL_WRITE_OLDEST_EXPIRED_LEASE.labels(**self._labels).set(expired[0][1] if expired else 0)
        metrics.DUAL_WRITE_OLDEST_OPEN_TRANSACTION.labels(**self._labels).set(
            max((now - t for t in opened), default=0.0))
        metrics.OPEN_TRANSACTIONS.refresh()  # the ages as they are now, for the multiprocess mode's files


class LeaseKeeper(KeeperCore):
    """Keeps ``pool`` (a DualWriterPool's writers). ``connection`` is the watcher's (closed by stop(), replaced when
    it breaks); the worker settles an id on its writer's connection."""

    def __init__(self, pool: PoolWriters, connection: Any):
        super().__init__(pool.prefix, lease_s=pool.lease_s, min_size=pool.min_size, idle_s=pool.idle_s)
        self._pool = pool
        self._connection: Any = connection
        self._leases: LeaseTable = pool.lease_table(connection)
        self._stop = threading.Event()
        self._work_due = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watching, self._working = threading.Lock(), threading.Lock()  # a test may run rounds by hand

    def start_up(self) -> int:
        """Before the pool's first claim: the lease columns, and the fleet's adoption of ids made before them."""
        blocking.run(self._leases.table.ensure_leasing(), self._leases.table.connection)
        return self._leases.adopt()

    def start(self) -> None:
        self.start_watcher()
        self.start_worker()

    def start_watcher(self) -> None:
        """Renewing (the database alone): from a pool's first claim."""
        self._start("watcher", self._watch_loop)

    def start_worker(self) -> None:
        """Settling and reaping: once a pool has made its first writers."""
        self._start("worker", self._work_loop)

    def _start(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=f"kafka2pc-lease-{name}-{self._pool.prefix}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self.halt()
        self._stop.set()
        close_connection(self._connection)

    def halt(self) -> None:
        """Stop the threads, keeping the connection (rounds can still be run by hand: tick())."""
        self._stop.set()
        self._work_due.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10)  # daemon threads: one stuck on a broker does not hold the exit up longer
        self._threads = []
        self._stop.clear()

    def tick(self) -> None:
        """One round by hand: watch, then carry the plan out."""
        self.watch()
        self.work()

    # -- the watcher: the database only ----------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        while not self._stop.wait(self.tick_s * random.uniform(0.8, 1.0)):
            try:
                self.watch()
            except Exception as exc:  # the database away: leases run out meanwhile, as they should
                self._failed(exc)
                self._reconnect()

    def watch(self) -> None:
        """Renew the leases when due, look for expired ones, plan the worker's round, report."""
        with self._watching:
            pool = self._pool
            views, tokens, opened = pool.snapshot()
            expired: list[tuple[str, float]] = []
            try:
                started = self._renew_due()
                if started is not None:
                    lost = self._leases.lost(tokens, pool.lease_s)
                    for transactional_id in self._lost(tokens, lost, started):
                        pool.lose(transactional_id, tokens[transactional_id])
                expired = self._leases.expired()
                if self._planned(views, expired):
                    self._work_due.set()
            finally:
                self._report(views, expired, opened)

    def _reconnect(self) -> None:
        """After a failed round: the watcher's connection again, or a new one if it broke (a database restart, a
        failover, an ended session)."""
        try:
            self._connection.rollback()
            return
        except Exception:
            pass
        close_connection(self._connection)
        try:
            self._connection = self._pool.connect_shareable()
            self._leases = self._pool.lease_table(self._connection)
            log.info("pool %r: lease keeper reconnected to the database", self._pool.prefix)
        except Exception as exc:
            log.warning("pool %r: lease keeper cannot reconnect yet: %r", self._pool.prefix, exc)

    # -- the worker: what needs Kafka ------------------------------------------------------------------------------

    def _work_loop(self) -> None:
        while not self._stop.is_set():
            self._work_due.wait(self.tick_s)
            self._work_due.clear()
            if self._stop.is_set():
                return
            try:
                self.work()
            except Exception as exc:
                self._failed(exc)

    def work(self) -> None:
        """Carry out the last plan the watcher made."""
        with self._working:
            plan, pool = self._take_plan(), self._pool
            for transactional_id in plan.settle:
                self._settle(transactional_id)
            for transactional_id in plan.retire:
                writer = pool.take_idle(transactional_id)
                if writer is not None:
                    log.info("%r: idle for %g s: giving the id back", transactional_id, pool.idle_s)
                    pool.retire(writer)
            reaped = 0
            while reaped < plan.reap and not self._stop.is_set() and pool.reap_one():
                reaped += 1
            self._reaped(reaped)

    def _settle(self, transactional_id: str) -> None:
        writer = self._pool.take_idle(transactional_id)
        if writer is None:
            return
        try:
            writer.recover_unfinished(keep_lease=True)
            log.info("%r: settled the transaction its writer left unfinished", transactional_id)
        except ProducerFencedError:
            self._pool.lose_writer(writer)
            return
        except DualWriteRecoveryError as exc:
            self._pool.bench(writer, exc)
            return
        except Exception as exc:
            log.warning("%r: could not settle its unfinished transaction yet (%r); retried next round",
                        transactional_id, exc)
            writer = self._pool.replace_if_broken(writer, exc)
            self._renew_after_failure(writer)
        self._pool.give_back(writer)

    def _renew_after_failure(self, writer: Any) -> None:
        """A settle that failed held the row (the watcher's renewal skipped it) without writing it: renew the lease
        now, on the writer's connection, so the id does not pass to another process that could do no better."""
        token = writer.lease_token
        if token is None:
            return
        with contextlib.suppress(Exception):
            self._pool.lease_table(writer.connection).renew({writer.transactional_id: token}, self._pool.lease_s)
