"""What a DualWriterPool's lease keeper does on each tick, decided from what it sees (sans-IO: the keeper in
:mod:`kafka2pc.dualwrite.keeper` carries it out)."""

from __future__ import annotations

import attrs


@attrs.frozen
class WriterView:
    """One writer of the pool as the keeper sees it: ``idle_s`` since it was last returned (None: lent out now),
    ``unfinished``: a transaction of it may be open in Kafka until a recovery settles it."""

    transactional_id: str
    idle_s: float | None
    unfinished: bool


@attrs.frozen
class Upkeep:
    """The worker's round, in order: ``settle`` these idle, unfinished writers (so a prepared transaction does not
    wait for the next request to be completed); ``retire`` these idle writers (close them and give their ids back);
    ``reap`` up to this many expired leases of dead processes (claim, recover, give back). Renewing is the
    watcher's, on the database alone, every third of a lease."""

    settle: tuple[str, ...] = ()
    retire: tuple[str, ...] = ()
    reap: int = 0


#: expired leases one tick reaps at most (each is a claim, a recovery and a release: a whole dead fleet is reaped
#: over a few ticks by every live pool at once)
REAP_PER_TICK = 8


def plan_upkeep(writers: list[WriterView], *, expired: int, min_size: int, idle_s: float) -> Upkeep:
    """``expired``: the fleet's expired leases seen now. Retires the writers idle longest first, beyond
    ``min_size``, never an unfinished one."""
    settle = tuple(w.transactional_id for w in writers if w.idle_s is not None and w.unfinished)
    idle = sorted((w for w in writers if w.idle_s is not None and not w.unfinished and w.idle_s >= idle_s),
                  key=lambda w: -(w.idle_s or 0.0))
    room = max(0, len(writers) - min_size)
    retire = tuple(w.transactional_id for w in idle[:room])
    return Upkeep(settle=settle, retire=retire, reap=min(expired, REAP_PER_TICK))
