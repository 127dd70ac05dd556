"""The bookkeeping of a pool's writers, without I/O or locks: which are idle, lent out, growing or benched, and
since when. A blocking pool (:mod:`.pool_writers`) keeps it under a ``threading.Condition``, an asyncio pool
(:mod:`.aio_pool_writers`) under an ``asyncio.Condition``; both decide by it the same way."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, Protocol, TypeVar

import attrs

from kafka2pc.dualwrite.lease_statements import Lease
from kafka2pc.dualwrite.upkeep import WriterView
from kafka2pc.errors import (
    ConfigError,
    DatabaseConnectionLostError,
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriteRecoveryError,
    DualWriteUsageError,
    LeaseLostError,
    PoolTimeoutError,
    ProducerFencedError,
    UsageError,
)


class PooledWriter(Protocol):
    """What the bookkeeping reads of a writer."""

    @property
    def transactional_id(self) -> str: ...

    @property
    def unfinished(self) -> bool: ...


W = TypeVar("W", bound=PooledWriter)


class Wait(enum.Enum):
    """What a request does when no writer is idle."""

    GROW = "grow"  # a growth slot is reserved for it: lease a new id (then growth_done())
    WAIT = "wait"  # every slot is taken: wait for a writer to come back


class WriterSlots(Generic[W]):
    """Up to ``size`` writers on leased ids under ``prefix``. Not thread-safe: the caller holds its lock."""

    def __init__(self, prefix: str, size: int, max_ids: int | None, acquire_timeout_s: float):
        self.prefix, self.size, self.max_ids, self.acquire_timeout_s = prefix, size, max_ids, acquire_timeout_s
        self.idle: list[W] = []  # the last one returned is lent first
        self.writers: dict[str, W] = {}
        self.leases: dict[str, Lease] = {}
        #: when each idle writer was returned, and since when each writer lent out (or left unfinished) was lent
        self.idle_since: dict[str, float] = {}
        self.open_since: dict[str, float] = {}
        self.growing = 0
        #: ids taken out of service because they need an operator (DualWriteRecoveryError), with the error; the
        #: row says so too, so no pool of the fleet claims them until the writer's resolve
        self.benched: dict[str, Exception] = {}
        self.closed = False

    def ids(self) -> list[str]:
        return sorted(self.writers)

    def lend(self, now: float) -> W | Wait:
        """An idle writer (lent now), else GROW (a growth slot reserved) or WAIT."""
        if self.closed:
            raise UsageError(f"pool {self.prefix!r} is closed")
        if self.idle:
            writer = self.idle.pop()
            self.idle_since.pop(writer.transactional_id, None)
            self.open_since[writer.transactional_id] = now
            return writer
        if len(self.writers) + self.growing < self.size:
            self.growing += 1
            return Wait.GROW
        return Wait.WAIT

    def growth_ended(self, writer: W | None, now: float) -> None:
        """A request's lease of a new id (its reserved growth slot) ended: the slot is free again, and the writer it
        made, if any, is lent to that request from ``now``."""
        self.growing -= 1
        if writer is not None:
            self.open_since[writer.transactional_id] = now

    def busy(self) -> PoolTimeoutError:
        """The error of a request that waited its acquire timeout for a writer."""
        return PoolTimeoutError(f"pool {self.prefix!r}: no free dual writer within {self.acquire_timeout_s:g} s: "
                                f"all {len(self.writers)} are busy (a bigger size, or more processes; benched: "
                                f"{sorted(self.benched)})")

    def fleet_full(self) -> PoolTimeoutError:
        """The error of a request that found nothing to lease until its acquire timeout."""
        return PoolTimeoutError(f"pool {self.prefix!r}: no free dual writer within {self.acquire_timeout_s:g} s, "
                                f"and the fleet holds all max_ids={self.max_ids} ids (a bigger max_ids, or fewer "
                                "writers per process)")

    def grown(self, writer: W, lease: Lease) -> None:
        """A writer on a newly leased id joined."""
        self.writers[lease.transactional_id] = writer
        self.leases[lease.transactional_id] = lease

    def put_back(self, writer: W, now: float) -> bool:
        """A writer came back; True when it is to be retired instead (dropped or replaced meanwhile, or the pool
        closed)."""
        transactional_id = writer.transactional_id
        if self.writers.get(transactional_id) is not writer:
            return True
        if self.closed:
            self.forget(writer)
            return True
        self.idle.append(writer)
        self.idle_since[transactional_id] = now
        if not writer.unfinished:
            self.open_since.pop(transactional_id, None)
        return False

    def take_idle(self, transactional_id: str, token: str | None = None) -> W | None:
        """The idle writer of that id (of the lease ``token``, if given), taken out of the idle list (None if it is
        not idle now)."""
        lease = self.leases.get(transactional_id)
        if token is not None and (lease is None or lease.token != token):
            return None  # the lease was given up or claimed again meanwhile: its writer is not the one lost
        for writer in self.idle:
            if writer.transactional_id == transactional_id:
                self.idle.remove(writer)
                self.idle_since.pop(transactional_id, None)
                return writer
        return None

    def forget(self, writer: W) -> None:
        """The pool no longer holds ``writer`` (nothing, if its id is held by a newer writer: the pool claimed the
        id again after its own lease ran out)."""
        transactional_id = writer.transactional_id
        if self.writers.get(transactional_id) is writer:
            del self.writers[transactional_id]
            self.leases.pop(transactional_id, None)
            self.idle_since.pop(transactional_id, None)
            self.open_since.pop(transactional_id, None)

    def close(self) -> list[W]:
        """No more lending: forget the idle writers and return them (to be retired); lent ones retire when they
        come back."""
        self.closed = True
        idle, self.idle = self.idle, []
        for writer in idle:
            self.forget(writer)
        return idle

    def lease_of(self, writer: W, token: str | None) -> Lease | None:
        """The lease the writer holds its id by, if the pool still holds it by ``token`` (the writer's)."""
        lease = self.leases.get(writer.transactional_id)
        return lease if lease is not None and lease.token == token else None

    def snapshot(self, now: float) -> tuple[list[WriterView], dict[str, str], list[float]]:
        """Each writer as the keeper sees it, each lease's token, and since when each open transaction has been
        open."""
        views = [WriterView(tid, None if tid not in self.idle_since else now - self.idle_since[tid],
                            writer.unfinished) for tid, writer in self.writers.items()]
        return views, {tid: lease.token for tid, lease in self.leases.items()}, list(self.open_since.values())


@attrs.frozen
class Fate:
    """What a pool does with a writer whose block raised: ``drop`` it (fenced, or its id needs an operator) or
    ``replace`` its connection; then ``retry`` the request (its block never began; on a connection that could not
    be replaced, DatabaseConnectionLostError), raise
    LeaseLostError (``lease_lost``), or re-raise."""

    drop: bool = False
    replace: bool = False
    retry: bool = False
    lease_lost: bool = False
    connection_lost: bool = False

    def error(self, transactional_id: str, lease_s: float, exc: Exception, *, gave_up: bool) -> Exception | None:
        """What the pool raises from ``exc``: LeaseLostError, DatabaseConnectionLostError (also when it ``gave_up``
        reconnecting a writer before its block); None when it re-raises ``exc`` or retries."""
        if self.lease_lost:
            return lease_lost_error(transactional_id, lease_s, exc)
        if self.connection_lost or gave_up:
            return connection_lost_error(transactional_id, exc, started=not gave_up)
        return None


def after_block_error(exc: Exception, *, started: bool, broken: bool, lost_lease: bool,
                      session_ended: bool = False) -> Fate:
    """``started``: the application's block had begun; ``broken``: the writer's connection failed with ``exc``;
    ``lost_lease``: ``exc`` is the database ending the transaction for the idle limit the lease sets;
    ``session_ended``: PostgreSQL said it ended the session for an idle limit (a session's own limit, when not the
    lease's: it may have ended a transaction the application began after committing inside the block, so the
    database's error is raised as it is, never as retriable)."""
    if isinstance(exc, ProducerFencedError | DualWriteRecoveryError):  # a lease taken over, or an operator's case
        return Fate(drop=True, retry=not started, lease_lost=started and isinstance(exc, ProducerFencedError))
    if isinstance(exc, DualWriteIncompleteError | DualWriteOutcomeUnknownError):  # the writer stays unfinished
        return Fate(replace=isinstance(exc, DualWriteOutcomeUnknownError))  # its connection failed at commit
    # any other error of a started block that came with the connection failing was before the commit (the protocol
    # raises DualWriteOutcomeUnknownError for one at the commit): nothing committed, retriable
    # a DualWriteUsageError is the protocol's own verdict (the block may have committed by itself): never retriable
    # a connection lost before the block began (dropped while idle: a restart, a proxy's timeout): nothing of the
    # request ran, so it goes on once the connection is replaced
    return Fate(replace=broken, retry=broken and not started and not isinstance(exc, DualWriteUsageError),
                lease_lost=broken and started and lost_lease,
                connection_lost=broken and started and not lost_lease and not session_ended
                and not isinstance(exc, DualWriteUsageError))


def connection_lost_error(transactional_id: str, exc: Exception, *,
                          started: bool = True) -> DatabaseConnectionLostError:
    """The error of a block whose database connection was lost before the commit (``started``), or of a request
    whose writer's connection was found lost before its block and could not be made again, or broke again."""
    if not started:
        return DatabaseConnectionLostError(
            f"{transactional_id!r}: the database connection was lost before the block began, and the pool could not "
            f"get a working one (a new connection failed, or broke too); nothing was begun: retry "
            f"({type(exc).__name__}: {exc})")
    return DatabaseConnectionLostError(
        f"{transactional_id!r}: the database connection was lost inside the block, before the commit (a restart, "
        "a cut network, or the session ended for the lease's idle limit after a long wait in the block); the "
        "writer committed nothing and Kafka's transaction was aborted: retry (unless the block committed by "
        f"itself, which it must not) ({type(exc).__name__}: {exc})")


def lease_lost_error(transactional_id: str, lease_s: float, exc: Exception) -> LeaseLostError:
    """The error of a block whose writer lost its lease while the block ran (both sides rolled back)."""
    return LeaseLostError(
        f"{transactional_id!r}: the block kept its database transaction open for longer than "
        f"lease_s={lease_s:g} s (Kafka slow or away, a slow call inside the block, or the process frozen), "
        "so the writer lost its lease; both sides rolled back: retry. Keep slow calls out of the block; keep "
        f"max.block.ms below lease_s, or raise lease_s ({type(exc).__name__}: {exc})")


def pool_prefix(config: Mapping[str, object], *, size: int, min_size: int, lease_s: float, idle_s: float,
                max_ids: int | None) -> str:
    """A pool's prefix (its ``transactional.id``), its sizes and times checked (ConfigError)."""
    prefix = str(config.get("transactional.id") or "")
    if not prefix:
        raise ConfigError("transactional.id", "is required: the pool leases ids <transactional.id>-<n>")
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
    return prefix
