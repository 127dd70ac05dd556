"""The lease keeper: one daemon thread per DualWriterPool that renews its leases, settles what its idle writers
left unfinished, gives back ids idle too long, and settles the expired leases of dead processes. What it does on a
tick is decided by :func:`kafka2pc.dualwrite.upkeep.plan_upkeep`; here it is only carried out."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from kafka2pc import metrics
from kafka2pc.dualwrite.upkeep import plan_upkeep
from kafka2pc.errors import ProducerFencedError

if TYPE_CHECKING:
    from kafka2pc.dualwrite.pool import DualWriterPool

log = logging.getLogger(__name__)

#: the longest a tick waits: an expired lease is seen within this of expiring (the lease length bounds it below)
MAX_TICK_S = 2.0


class LeaseKeeper:
    """Works on its own connection (``connection``; closed by stop()) and, to settle an id, on a writer's."""

    def __init__(self, pool: DualWriterPool, connection: Any):
        self._pool, self._connection = pool, connection
        self._leases = pool.lease_table(connection)
        self._stop = threading.Event()
        self._ticking = threading.Lock()  # one tick at a time (a test may tick while the thread does)
        self._thread: threading.Thread | None = None
        self.tick_s = min(pool.lease_s / 4, MAX_TICK_S)
        self._renewed_at = time.monotonic()
        self._labels = {"prefix": pool.prefix}

    def start_up(self) -> int:
        """Before the pool's first claim: the lease columns, and the fleet's adoption of ids made before them."""
        self._leases.table.ensure_leasing()
        return self._leases.adopt()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"kafka2pc-lease-keeper-{self._pool.prefix}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        with contextlib.suppress(Exception):
            self._connection.close()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s * random.uniform(0.8, 1.0)):
            try:
                self.tick()
            except Exception as exc:  # the database away: the next tick tries again; leases run out meanwhile
                log.warning("pool %r: lease keeper: %r", self._pool.prefix, exc)
                with contextlib.suppress(Exception):
                    self._leases.table.connection.rollback()

    def tick(self) -> None:
        """One round of upkeep."""
        with self._ticking:
            self._tick()

    def _tick(self) -> None:
        pool, now = self._pool, time.monotonic()
        views, tokens, _ = pool.snapshot()
        renew_due = now - self._renewed_at >= self._pool.lease_s / 3
        expired = self._leases.expired()
        plan = plan_upkeep(views, renew_due=renew_due, expired=len(expired), min_size=pool.min_size,
                           idle_s=pool.idle_s)
        if plan.renew:
            self._renew({tid: tokens[tid] for tid in plan.renew if tid in tokens})
            self._renewed_at = now
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
        if reaped:
            metrics.DUAL_WRITE_LEASES_TAKEN_OVER.labels(**self._labels).inc(reaped)
        self._report(expired, reaped)

    def _renew(self, leases: dict[str, str]) -> None:
        renewed = self._leases.renew(leases, self._pool.lease_s)
        for transactional_id in set(leases) - renewed:
            # PostgreSQL skips a row a transaction holds (that transaction renews it); otherwise it is not ours
            if not self._leases.holds(transactional_id, leases[transactional_id]):
                log.warning("%r: the lease was taken over by another process (this one was stopped or cut off "
                            "for longer than lease_s=%g s)", transactional_id, self._pool.lease_s)
                self._pool.lose(transactional_id)

    def _settle(self, transactional_id: str) -> None:
        writer = self._pool.take_idle(transactional_id)
        if writer is None:
            return
        try:
            writer.recover_unfinished()
            log.info("%r: settled the transaction its writer left unfinished", transactional_id)
        except ProducerFencedError:
            self._pool.lose_writer(writer)
            return
        except Exception as exc:
            log.debug("%r: could not settle yet: %r", transactional_id, exc)
        self._pool.give_back(writer)

    def _report(self, expired: list[tuple[str, float]], reaped: int) -> None:
        pool = self._pool
        now = time.monotonic()
        views, _, opened = pool.snapshot()
        held = len(views)
        metrics.DUAL_WRITE_LEASED_IDS.labels(**self._labels).set(held)
        metrics.DUAL_WRITE_EXPIRED_LEASES.labels(**self._labels).set(max(0, len(expired) - reaped))
        metrics.DUAL_WRITE_OLDEST_EXPIRED_LEASE.labels(**self._labels).set(expired[0][1] if expired[reaped:] else 0)
        metrics.DUAL_WRITE_OLDEST_OPEN_TRANSACTION.labels(**self._labels).set(max((now - t for t in opened),
                                                                                  default=0.0))
